"""User patterns: load a pattern file, turn each form into a :class:`~optimus_lens.core.pattern.Pattern`,
and preview where the patterns match without changing the graph.

A pattern file is a Python file with either

* module-level ``pattern(...)`` and ``replacement(...)`` functions (one pattern, named after
  the file): both are traced by ``torch.fx.symbolic_trace`` as
  ``torch.fx.subgraph_rewriter.replace_pattern`` takes them, the pattern graph becomes a
  declarative :mod:`optimus_lens.core.lang` pattern (so its near misses are explained), and the
  replacement graph is inlined at each match with the pattern's inputs bound; or
* a list ``PATTERNS`` whose items are :class:`optimus_lens.core.lang.Rule` objects (the declarative
  form), :class:`~optimus_lens.core.pattern.BatchPattern` / :class:`~optimus_lens.core.pattern.RewritePattern`
  subclasses or instances, or ``(pattern_fn, replacement_fn)`` pairs; or
* Inductor's own pattern language: ``PatternMatcherPass`` objects filled by ``register_replacement`` /
  ``register_graph_pattern`` (:mod:`optimus_lens.frontend.inductor_patterns`), one pass of ours each.

Loading runs the file's code: callers run it only when the user asks for it.
"""

from __future__ import annotations

import importlib.util
import inspect
import itertools
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from torch.fx import Graph, GraphModule, Node

from optimus_lens.core import lang
from optimus_lens.core.miss import Miss
from optimus_lens.core.pattern import BatchPattern, Pattern, RewritePattern
from optimus_lens.core.rewriter import Rewriter

_LOADS = itertools.count()


class PatternFileError(ValueError):
    """A pattern file that cannot be loaded: a syntax error, an exception while it runs,
    or contents that define no pattern. ``line`` is the 1-based line in the file, when known."""

    def __init__(self, path: str, message: str, line: int | None = None):
        self.path, self.line = path, line
        super().__init__(f"{path}{f':{line}' if line else ''}: {message}")


# --------------------------------------------------------------------------- function pairs -> lang


def _trace(fn: Callable, what: str, path: str) -> GraphModule:
    try:
        return torch.fx.symbolic_trace(fn)
    except Exception as e:  # noqa: BLE001 - any tracing failure is the file's problem
        raise PatternFileError(
            path, f"cannot trace {what} {getattr(fn, '__name__', fn)!r}: {type(e).__name__}: {e}", _line_of(fn)
        ) from e


def _line_of(fn: Any) -> int | None:
    try:
        return inspect.getsourcelines(fn)[1]
    except (TypeError, OSError):
        return None


def graph_to_pattern(graph: Graph) -> lang.Op:
    """The declarative pattern of a traced pattern function's graph: each call node an
    :class:`~optimus_lens.core.lang.Op` over its target with its arguments as sub-patterns, each
    placeholder a :class:`~optimus_lens.core.lang.Var` of its name, constants :class:`~optimus_lens.core.lang.Const`.
    A node the pattern uses twice binds one name, so both uses must be the same node
    in the matched graph. Every call node is captured as ``%name`` (the site).

    Raises ValueError for a pattern with other than one output, or with get_attr /
    call_module nodes (a pattern must be a function of its inputs)."""
    out = next(n for n in graph.nodes if n.op == "output")
    root = out.args[0]
    if not isinstance(root, Node) or root.op not in ("call_function", "call_method"):
        raise ValueError("the pattern must return one value computed by a function or method call")
    built: dict[Node, lang.Pat] = {}

    def conv(a: Any) -> Any:
        if isinstance(a, Node):
            return to_pat(a)
        if isinstance(a, (list, tuple)):
            return lang.Seq(tuple(lang._pat(conv(v)) for v in a))
        return lang.Const(a)

    def to_pat(n: Node) -> lang.Pat:
        if n in built:  # used again: must be the very node bound the first time
            return lang.Var(n.name if n.op == "placeholder" else f"%{n.name}")
        if n.op == "placeholder":
            p: lang.Pat = lang.Var(n.name)
        elif n.op in ("call_function", "call_method"):
            p = lang.Op(
                n.target, *[conv(a) for a in n.args], name=f"%{n.name}", **{k: conv(v) for k, v in n.kwargs.items()}
            )
        else:
            raise ValueError(f"pattern node {n.name} is {n.op}; a pattern may only call functions and methods")
        built[n] = p
        return p

    return cast(lang.Op, to_pat(root))  # the root is a call: to_pat made an Op


LangPattern = lang.RulePattern  #: a pattern file's declarative rule as a RewritePattern


def function_rule(name: str, pattern: Callable, replacement: Callable, path: str = "<pattern>") -> lang.Rule:
    """A :class:`~optimus_lens.core.lang.Rule` from a ``pattern`` / ``replacement`` function pair:
    the replacement graph is inlined at each match, its inputs bound to the pattern's
    inputs by position. Raises PatternFileError when a function does not trace, the two
    take different numbers of inputs, or the pattern is not one call tree."""
    pg, rg = _trace(pattern, "pattern", path), _trace(replacement, "replacement", path)
    p_in = [n.name for n in pg.graph.nodes if n.op == "placeholder"]
    r_in = [n for n in rg.graph.nodes if n.op == "placeholder"]
    if len(p_in) != len(r_in):
        raise PatternFileError(
            path, f"pattern takes {len(p_in)} inputs but replacement takes {len(r_in)}", _line_of(replacement)
        )
    try:
        pat = graph_to_pattern(pg.graph)
    except ValueError as e:
        raise PatternFileError(path, str(e), _line_of(pattern)) from e

    def replace(rw: Rewriter, **b: Any) -> Any:
        env: dict[Node, Any] = {r: b[p] for p, r in zip(p_in, r_in)}
        result = None
        for n in rg.graph.nodes:
            if n.op == "placeholder":
                continue
            args = torch.fx.node.map_arg(n.args, lambda a: env[a])
            kwargs = torch.fx.node.map_arg(n.kwargs, lambda a: env[a])
            if n.op == "output":
                result = args[0]
            elif n.op == "call_function":
                env[n] = rw.call(n.target, *args, **kwargs)
            elif n.op == "call_method":
                env[n] = rw.create("call_method", n.target, args, kwargs)
            else:
                raise ValueError(
                    f"replacement node {n.name} is {n.op}; a replacement may only call functions and methods"
                )
        return result

    doc = (inspect.getdoc(pattern) or "").split("\n")[0]
    return lang.Rule(name, pat, replace, description=doc or f"{pat.describe()} -> {replacement.__name__}(...)")


# --------------------------------------------------------------------------- loading


@dataclass
class PatternFile:
    """A loaded pattern file: its path and the patterns it defines, in file order."""

    path: str
    patterns: list[Pattern]
    #: an Inductor-language file's passes: (pass name, its patterns), one of our passes each
    groups: list[tuple[str, list[Pattern]]] = field(default_factory=list)

    @property
    def pass_name(self) -> str:
        """The name of the pass the file's patterns form (the file's stem)."""
        return Path(self.path).stem


def load_pattern_file(path: str | Path) -> PatternFile:
    """Run the pattern file at ``path`` and return its patterns (see the module docstring
    for the forms). Each pattern's ``source`` is ``file:line`` of its definition.

    Raises PatternFileError (with the line) for a missing file, a syntax error, an
    exception while the file runs, an item of ``PATTERNS`` of no known form, a function
    that does not trace, or a file that defines no pattern; nothing is registered
    globally, so a failed load leaves every shipped pattern as it was."""
    path = str(path)
    stem = Path(path).stem
    if not Path(path).is_file():
        raise PatternFileError(path, "no such file")
    mod_name = f"optimus_user_patterns_{stem}_{next(_LOADS)}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise PatternFileError(path, "not a Python file that can be imported")
    module = importlib.util.module_from_spec(spec)
    regs: list = []
    try:
        with _inductor_registrations(path) as regs:
            spec.loader.exec_module(module)
    except SyntaxError as e:
        raise PatternFileError(path, f"syntax error: {e.msg}", e.lineno) from e
    except Exception as e:  # noqa: BLE001 - the file's own code failed
        line = next(
            (
                f.lineno
                for f in reversed(traceback.extract_tb(e.__traceback__))
                if Path(f.filename).resolve() == Path(path).resolve()
            ),
            None,
        )
        raise PatternFileError(path, _inductor_failure(e) or f"{type(e).__name__}: {e}", line) from e
    finally:
        sys.modules.pop(mod_name, None)
    items: list[Any]
    if hasattr(module, "PATTERNS"):
        items = list(module.PATTERNS)
    elif callable(getattr(module, "pattern", None)) and callable(getattr(module, "replacement", None)):
        items = [(stem, module.pattern, module.replacement)]
    elif regs or "PatternMatcherPass" in Path(path).read_text(errors="replace"):
        return _inductor_file(module, regs, path)
    else:
        raise PatternFileError(
            path,
            "defines neither `pattern` and `replacement` functions, a `PATTERNS` list, nor a PatternMatcherPass",
        )
    out = [_as_pattern(item, i, stem, path) for i, item in enumerate(items)]
    names = [p.name for p in out]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise PatternFileError(path, f"two patterns are named {dup!r}")
    return PatternFile(path, out)


def _inductor_registrations(path: str):
    """Inductor's registrations recorded while the file runs, where the file speaks Inductor's
    pattern language (else nothing: ``torch._inductor`` is not imported for other files)."""
    from contextlib import nullcontext

    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        text = ""
    if "pattern_matcher" not in text and "PatternMatcherPass" not in text:
        return nullcontext([])
    from optimus_lens.frontend.inductor_patterns import registrations

    return registrations(path)


def _inductor_failure(e: BaseException) -> str | None:
    """An exception from inside Inductor's ``register_replacement`` told as what failed."""
    if "torch._inductor.pattern_matcher" not in sys.modules:
        return None
    from optimus_lens.frontend.inductor_patterns import registration_failure

    return registration_failure(e)


def _inductor_file(module: Any, regs: list, path: str) -> PatternFile:
    """A file of ``PatternMatcherPass`` objects as a PatternFile with one group per pass."""
    from optimus_lens.frontend.inductor_patterns import file_passes

    groups = file_passes(module, regs, path)
    if not groups:
        raise PatternFileError(path, "its PatternMatcherPass objects hold no patterns (nothing was registered)")
    names = [n for n, _ in groups]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise PatternFileError(path, f"two PatternMatcherPass objects are named {dup!r}")
    pats: list[Pattern] = [p for _, ps in groups for p in ps]
    seen: set[str] = set()
    for p in pats:  # pattern names are unique in a file: one taken in an earlier pass gets its pass's name
        if p.name in seen:
            p.name = f"{p.pass_name}.{p.name}"  # type: ignore[attr-defined]
        seen.add(p.name)
    return PatternFile(path, pats, [(n, list(ps)) for n, ps in groups])


def _as_pattern(item: Any, i: int, stem: str, path: str) -> Pattern:
    if isinstance(item, type) and issubclass(item, (BatchPattern, RewritePattern)):
        item = item()
    if isinstance(item, (BatchPattern, RewritePattern)):
        if not item.name:
            raise PatternFileError(path, f"PATTERNS[{i}] ({type(item).__name__}) has no name", _line_of(type(item)))
        item.source = item.source or f"{path}:{_line_of(type(item)) or 1}"
        return item
    if isinstance(item, lang.Rule):
        return LangPattern(item, f"{path}:{_line_of(item.replace) or 1}")
    if isinstance(item, tuple) and len(item) in (2, 3) and all(callable(f) for f in item[-2:]):
        name = item[0] if len(item) == 3 else f"{stem}_{i}"
        pat_fn, rep_fn = item[-2:]
        return LangPattern(function_rule(name, pat_fn, rep_fn, path), f"{path}:{_line_of(pat_fn) or 1}")
    raise PatternFileError(
        path,
        f"PATTERNS[{i}] is {type(item).__name__}; expected a Rule, a BatchPattern or "
        "RewritePattern (class or instance), or a (pattern, replacement) pair",
    )


# --------------------------------------------------------------------------- preview


@dataclass
class PreviewMatch:
    """One place a pattern matches: the pattern, the anchor node's name and the site's node
    names (a batch pattern: one group of nodes sharing a key)."""

    pattern: str
    anchor: str
    sites: list[str]
    #: what the match bound (Inductor's KeywordArgs): name -> node name or constant
    bindings: dict = field(default_factory=dict)


@dataclass
class NearMiss:
    """A node a pattern could start from (its op is one of the pattern's anchors) where it
    does not match: the reason, and the nodes matched before the failing condition;
    ``stopped``, the node where matching stopped (Inductor patterns; "" when unknown or when a
    check refused a whole match), and in the pattern's own graph (Inductor patterns:
    ``PatternInfo.graph``) the nodes that matched (``pattern_partial``) and the one that
    did not (``pattern_stopped``)."""

    pattern: str
    node: str
    reason: str
    partial: list[str]
    stopped: str = ""
    pattern_partial: list[str] = field(default_factory=list)
    pattern_stopped: str = ""

    @property
    def reach(self) -> int:
        """How far matching got: the nodes matched before it stopped."""
        return len(self.partial)


@dataclass
class Preview:
    """What :func:`preview` found: ``matches`` and ``near_misses``, in graph order per pattern."""

    matches: list[PreviewMatch]
    near_misses: list[NearMiss]

    def best_near_miss(self, pattern: str | None = None) -> NearMiss | None:
        """The near miss (of ``pattern``, None: of any) that got furthest (most nodes matched
        before it stopped; the first in graph order among equals), or None when there is none."""
        near = [m for m in self.near_misses if pattern is None or m.pattern == pattern]
        return max(near, key=lambda m: m.reach, default=None)

    def to_json(self) -> dict:
        from dataclasses import asdict

        return {"matches": [asdict(m) for m in self.matches], "near_misses": [asdict(m) for m in self.near_misses]}

    @classmethod
    def from_json(cls, d: dict) -> Preview:
        return cls([PreviewMatch(**m) for m in d["matches"]], [NearMiss(**m) for m in d["near_misses"]])


def preview(gm: GraphModule, patterns: list[Pattern]) -> Preview:
    """Every place ``patterns`` match in ``gm``'s graph, without changing it, and every near
    miss: each RewritePattern at every node of its ``anchors`` (overlapping matches
    included; where it does not match, the reason); each BatchPattern, keying the nodes of
    its ``anchors``, as the groups of 2+ nodes sharing a key (before the search splits them
    into independent subsets; a node with a Miss key is a near miss). A pattern that raises
    while matching raises :class:`PatternPreviewError` naming it and the node."""
    matches: list[PreviewMatch] = []
    misses: list[NearMiss] = []
    for p in patterns:
        anchors = getattr(p, "anchors", None)
        nodes = [n for n in gm.graph.nodes if not anchors or _target(n) in anchors]
        if isinstance(p, BatchPattern):
            groups: dict[Any, list[str]] = {}
            for n in nodes:
                k = _call(p, p.key, n)
                if isinstance(k, Miss):
                    misses.append(NearMiss(p.name, n.name, str(k), []))
                elif k is not None:
                    groups.setdefault(k, []).append(n.name)
            for names in groups.values():
                if len(names) >= 2:
                    matches.append(PreviewMatch(p.name, names[0], names))
                else:
                    misses.append(NearMiss(p.name, names[0], "no other node shares its group key", []))
            continue
        for n in nodes:
            m = _call(p, p.match, n)  # type: ignore[attr-defined]
            if isinstance(m, Miss):
                misses.append(
                    NearMiss(
                        p.name,
                        n.name,
                        str(m),
                        [x.name for x in getattr(m, "partial", [])],
                        getattr(m, "stopped", ""),
                        list(getattr(m, "pattern_partial", [])),
                        getattr(m, "pattern_stopped", ""),
                    )
                )
            elif m is not None:
                matches.append(PreviewMatch(p.name, n.name, [x.name for x in m.nodes], m.info.get("keyword_args", {})))
    return Preview(matches, misses)


@dataclass
class PatternInfo:
    """What a pattern file's pattern is, for drawing beside the model's graph: its name, form
    (``register_replacement``, ``register_graph_pattern``, ...), pass, ``file:line``, the pattern
    as Inductor prints it and as a graph (``graph``: a GraphSnapshot, what the search function
    traced to; None where the pattern cannot be drawn)."""

    name: str
    form: str
    pass_name: str
    source: str
    text: str = ""
    graph: Any = None

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "form": self.form,
            "pass": self.pass_name,
            "source": self.source,
            "text": self.text,
            "graph": None if self.graph is None else self.graph.to_json(),
        }

    @classmethod
    def from_json(cls, d: dict) -> PatternInfo:
        from optimus_lens.core.trace import GraphSnapshot

        g = d.get("graph")
        return cls(
            d["name"], d["form"], d["pass"], d["source"], d.get("text", ""), GraphSnapshot.from_json(g) if g else None
        )


def pattern_infos(patterns: list[Pattern]) -> list[PatternInfo]:
    """The drawable facts of each pattern that has its own graph (Inductor-language
    patterns: ``drawing``); other forms are left out."""
    out = []
    for p in patterns:
        drawing = getattr(p, "drawing", None)
        if not hasattr(p, "pattern_text"):
            continue
        out.append(
            PatternInfo(
                p.name,
                getattr(p, "form", ""),
                getattr(p, "pass_name", ""),
                p.source,
                p.pattern_text,  # type: ignore[attr-defined]
                drawing[0] if drawing else None,
            )
        )
    return out


def _target(n: Node) -> Any:
    return n.target if n.op in ("call_function", "call_method") else None


class PatternPreviewError(RuntimeError):
    """A pattern raised while matching during a preview."""


def _call(p: Pattern, fn: Callable, n: Node) -> Any:
    try:
        return fn(n)
    except Exception as e:  # noqa: BLE001
        raise PatternPreviewError(f"pattern {p.name!r} ({p.source}) raised at {n.name}: {type(e).__name__}: {e}") from e


def pipeline_with(pattern_file: PatternFile, passes: list[str] | None = None, base=None):
    """``base`` (default: the default pipeline) with ``pattern_file``'s patterns as one
    extra pass (named after the file; an Inductor-language file: one pass per ``PatternMatcherPass``,
    one sweep each, as ``PatternMatcherPass.apply``) at the end, judged by the catalogue's profit estimate
    where a pattern asks for ``profitable_only``. ``passes`` names the enabled passes, the file's pass
    included (``["swish"]`` runs the file's patterns alone; for an Inductor-language file the
    file's stem stands for all its passes, so ``["addcmul"]`` runs every ``PatternMatcherPass`` of
    ``addcmul.py``); None enables all. Raises KeyError for an unknown pass name."""
    from optimus_lens.core.pipeline import Pass, Pipeline
    from optimus_lens.passes import default_pipeline
    from optimus_lens.passes.profit import group_estimate

    base = base or default_pipeline()
    groups = pattern_file.groups or [(pattern_file.pass_name, pattern_file.patterns)]
    for name, _ in groups:
        if name in base.names():
            raise KeyError(f"pattern file pass {name!r} has the name of a shipped pass; rename it")
    pipe = Pipeline(
        base.passes
        + [
            Pass(
                name,
                pats,
                description=f"patterns of {pattern_file.path}",
                estimate=group_estimate,
                # a PatternMatcherPass sweeps the graph once (PatternMatcherPass.apply)
                max_iterations=1 if pattern_file.groups else 10,
            )
            for name, pats in groups
        ]
    )
    if passes is not None and pattern_file.groups and pattern_file.pass_name not in [n for n, _ in groups]:
        stem = pattern_file.pass_name
        passes = [x for p in passes for x in ([n for n, _ in groups] if p == stem else [p])]
    return pipe.only(list(passes)) if passes is not None else pipe
