"""One import namespace, data flowing one way: the core (``optimus_lens`` and its
``passes``) never imports ``optimus_lens.viz`` or ``optimus_lens.app``; ``viz`` never
imports ``app`` or streamlit. Checked on the source (every import, also inside functions)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "optimus_lens"
LAYERS = {"viz", "app", "sample_models"}


def imported(path: Path) -> set[str]:
    """Absolute module names imported anywhere in ``path`` (relative imports resolved)."""
    tree = ast.parse(path.read_text())
    pkg = ".".join(path.relative_to(PKG.parent).with_suffix("").parts[:-1])
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def _core_files() -> list[Path]:
    return [f for f in PKG.rglob("*.py") if f.relative_to(PKG).parts[0] not in LAYERS]


def test_the_package_is_one_namespace_with_the_viewer_app_and_samples_inside():
    assert (PKG / "__init__.py").is_file()
    for sub in LAYERS:
        assert (PKG / sub / "__init__.py").is_file(), sub
    top = {p.name for p in PKG.parent.iterdir() if (p / "__init__.py").is_file()}
    assert top == {"optimus_lens"}, f"one top-level package in the repo, not {sorted(top)}"


@pytest.mark.parametrize("path", _core_files(), ids=lambda p: str(p.relative_to(PKG)))
def test_the_core_never_imports_the_viewer_or_the_app(path):
    bad = {m for m in imported(path) if m.startswith(("optimus_lens.viz", "optimus_lens.app", "streamlit"))}
    assert not bad, f"{path.relative_to(PKG)} imports {sorted(bad)}"


@pytest.mark.parametrize("path", sorted((PKG / "viz").rglob("*.py")), ids=lambda p: str(p.relative_to(PKG)))
def test_the_viewer_never_imports_the_app_or_streamlit(path):
    bad = {m for m in imported(path) if m.startswith(("optimus_lens.app", "streamlit"))}
    assert not bad, f"{path.relative_to(PKG)} imports {sorted(bad)}"
