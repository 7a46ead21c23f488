"""The house: one import package, ``optimus_lens``, built from the design card's top-level
folders, with its layers as folders and one table of which layer may import which.

Checked on the source, over every import statement (module level, inside functions, and
under ``TYPE_CHECKING``): each import goes from a layer to one the table allows; no two
files import each other in a circle; what ``viz`` reaches, even through other files, holds
no pattern catalogue, app or streamlit; no private name crosses a file; no file is longer
than ``MAX_LINES``. The checks are themselves tested on a planted upward import.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
#: import package -> the top-level folder it is built from (setup.py's ROOTS)
ROOTS = {
    "optimus_lens": REPO / "optimus",
    "optimus_lens.app": REPO / "app",
    "optimus_lens.viz": REPO / "viz",
    "optimus_lens.sample_models": REPO / "sample_models",
}
MAX_LINES = 600

#: layer -> the layers it may import (besides itself). Lowest first.
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "sample_models": set(),
    "passes": {"core"},
    "frontend": {"core", "passes", "sample_models"},
    "inductor": {"core", "passes", "frontend"},
    "debug": {"core", "passes", "frontend", "inductor"},
    "perf": {"core", "passes", "frontend", "inductor"},
    "teach": {"core", "passes", "frontend", "inductor", "debug", "perf", "sample_models"},
    "sweep": {"core", "passes", "frontend", "inductor", "debug", "perf"},
    "viz": {"core", "teach"},
    "testing": {"core", "passes", "frontend", "inductor", "debug"},
    "api": {"core", "frontend", "inductor", "perf"},
    "cli": {"core", "passes", "frontend", "inductor", "debug", "perf", "teach", "sweep", "viz", "sample_models", "api"},
    "app": {"core", "passes", "frontend", "inductor", "debug", "perf", "teach", "sweep", "viz", "sample_models", "api"},
    "main": {"cli"},
}
#: what nothing that viz reaches may be
VIZ_NEVER = ("optimus_lens.passes", "optimus_lens.app", "streamlit")


def layer_of(module: str) -> str | None:
    """The layer of an ``optimus_lens`` module name; None outside the package."""
    parts = module.split(".")
    if parts[0] != "optimus_lens":
        return None
    if len(parts) == 1:
        return "api"
    if parts[1] == "__main__":
        return "main"
    return parts[1]


@dataclass(frozen=True)
class Edge:
    source: str  # module importing
    target: str  # module (or module.name) imported
    line: int
    private: bool  # the imported name starts with "_"


def module_files() -> dict[str, Path]:
    """Every module of the package -> its file."""
    out: dict[str, Path] = {}
    for pkg, root in ROOTS.items():
        for f in root.rglob("*.py"):
            rel = f.relative_to(root).with_suffix("").parts
            if "__pycache__" in rel:
                continue
            if rel[-1] == "__init__":
                rel = rel[:-1]
            name = ".".join((pkg, *rel))
            # a nested root (optimus_lens.app) owns its files, not the outer one
            if pkg == "optimus_lens" or not any(
                name.startswith(p + ".") for p in ROOTS if p != pkg and len(p) > len(pkg)
            ):
                out[name] = f
    return out


def edges(module: str, source: str, is_package: bool) -> list[Edge]:
    """Every import in ``source`` (of ``module``), relative ones resolved."""
    tree = ast.parse(source)
    pkg = module if is_package else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [Edge(module, a.name, node.lineno, False) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for a in node.names:
                out.append(Edge(module, f"{base}.{a.name}", node.lineno, a.name.startswith("_")))
    return out


def resolve(target: str, files: dict[str, Path]) -> str | None:
    """The module an import target names (``a.b.name`` -> ``a.b`` when ``name`` is not a module)."""
    while target:
        if target in files:
            return target
        target = target.rpartition(".")[0]
    return None


def graph(files: dict[str, Path]) -> dict[str, list[Edge]]:
    return {m: edges(m, f.read_text(), f.name == "__init__.py") for m, f in sorted(files.items())}


def layer_violations(g: dict[str, list[Edge]], files: dict[str, Path]) -> list[str]:
    bad = []
    for m, es in g.items():
        src = layer_of(m)
        for e in es:
            if e.target.split(".")[0] == "streamlit" and src != "app":
                bad.append(f"{m}:{e.line} imports streamlit")
            tgt_mod = resolve(e.target, files)
            if tgt_mod is None:
                continue
            tgt = layer_of(tgt_mod)
            if tgt != src and tgt not in ALLOWED[src]:
                bad.append(f"{m}:{e.line} ({src}) imports {tgt_mod} ({tgt})")
    return bad


def circles(g: dict[str, list[Edge]], files: dict[str, Path]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    succ = {m: sorted({t for e in es if (t := resolve(e.target, files)) and t != m}) for m, es in g.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        # iterative Tarjan: (node, iterator over successors)
        work = [(v, iter(succ.get(v, ())))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(succ.get(w, ()))))
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))

    for v in succ:
        if v not in index:
            visit(v)
    return out


def reach(g: dict[str, list[Edge]], files: dict[str, Path], start: str) -> set[str]:
    """Every import target (module or external name) reachable from ``start``."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        m = todo.pop()
        for e in g.get(m, ()):
            t = resolve(e.target, files) or e.target
            if t not in seen:
                seen.add(t)
                if t in g:
                    todo.append(t)
    return seen


@pytest.fixture(scope="module")
def house():
    files = module_files()
    return files, graph(files)


def test_the_top_level_is_the_design_cards_and_installs_one_package():
    for folder in ("optimus", "app", "viz", "sample_models", "tests"):
        assert (REPO / folder).is_dir(), folder
    assert (REPO / "pyproject.toml").is_file()
    for root in ROOTS.values():
        assert (root / "__init__.py").is_file(), root
    assert not (REPO / "optimus_lens").exists(), "the package is built from the card's folders"
    import optimus_lens.app
    import optimus_lens.sample_models
    import optimus_lens.viz

    for pkg, mod in [("optimus_lens.app", optimus_lens.app), ("optimus_lens.viz", optimus_lens.viz)]:
        assert Path(mod.__file__).resolve().parent == ROOTS[pkg], pkg


def test_every_import_follows_the_layer_table(house):
    files, g = house
    assert len(files) > 100
    assert layer_violations(g, files) == []


def test_no_files_import_each_other_in_a_circle(house):
    files, g = house
    assert circles(g, files) == []


def test_what_the_viewer_reaches_holds_no_catalogue_app_or_streamlit(house):
    files, g = house
    for m in files:
        if layer_of(m) == "viz":
            bad = sorted(t for t in reach(g, files, m) if t.startswith(VIZ_NEVER))
            assert not bad, f"{m} reaches {bad}"


def test_the_engine_never_reaches_the_catalogue(house):
    files, g = house
    reached = reach(g, files, "optimus_lens.core.engine")
    assert not any(t.startswith("optimus_lens.passes") for t in reached)


def test_no_private_name_is_imported_from_another_file(house):
    files, g = house
    bad = [
        f"{m}:{e.line} imports {e.target}"
        for m, es in g.items()
        for e in es
        if e.private
        and resolve(e.target, files) not in (None, m)
        and e.target.startswith("optimus_lens")
        # a package's own private submodules (sample_models._registry) are its business
        and resolve(e.target, files).rpartition(".")[0] != m
    ]
    assert bad == []


def test_nothing_imports_the_bare_folder_names(house):
    files, g = house
    bare = {"optimus", "app", "viz", "sample_models"}
    bad = [f"{m}:{e.line} imports {e.target}" for m, es in g.items() for e in es if e.target.split(".")[0] in bare]
    assert bad == []


def test_no_file_of_the_package_is_longer_than_the_limit(house):
    files, _ = house
    long = {m: n for m, f in files.items() if (n := len(f.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_the_checks_catch_a_planted_upward_import_and_a_planted_circle():
    files = {
        "optimus_lens.core.trace": Path("a"),
        "optimus_lens.core.engine": Path("b"),
        "optimus_lens.passes.batch": Path("c"),
        "optimus_lens.viz.graph": Path("d"),
    }
    g = {
        "optimus_lens.core.trace": edges(
            "optimus_lens.core.trace", "def f():\n    import optimus_lens.core.engine\n", False
        ),
        "optimus_lens.core.engine": edges(
            "optimus_lens.core.engine",
            "from optimus_lens.core.trace import Trace\ndef g():\n    from optimus_lens.passes.batch import X\n",
            False,
        ),
        "optimus_lens.passes.batch": edges("optimus_lens.passes.batch", "X = 1\n", False),
        "optimus_lens.viz.graph": edges("optimus_lens.viz.graph", "from optimus_lens.core.engine import E\n", False),
    }
    bad = layer_violations(g, files)
    assert bad == ["optimus_lens.core.engine:3 (core) imports optimus_lens.passes.batch (passes)"]
    assert circles(g, files) == [["optimus_lens.core.engine", "optimus_lens.core.trace"]]
    assert "optimus_lens.passes.batch" in reach(g, files, "optimus_lens.viz.graph")
