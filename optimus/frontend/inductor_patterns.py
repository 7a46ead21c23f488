"""Pattern files in Inductor's own pattern language (``torch._inductor.pattern_matcher``).

A file that defines :class:`~torch._inductor.pattern_matcher.PatternMatcherPass` objects, filled by
``register_replacement(search_fn, replace_fn, example_inputs, trace_fn, pass_dicts)``,
``gen_register_replacement``, ``register_graph_pattern(CallFunction(aten.x, KeywordArg("a"), ...),
pass_dict=...)`` or ``register_lowering_pattern``, is a pattern file (the form vLLM's and
torchao's custom post-grad passes and Inductor's own ``fx_passes`` are written in). Each pass
becomes one of our passes, named by its ``pass_name`` or else by the module-level variable it
is bound to; each registration (a ``PatternEntry``) becomes an :class:`InductorPattern`, named
after its search function (``register_replacement``) or its handler (``register_graph_pattern``).

Matching drives Inductor's own matcher and nothing else: :func:`explain` runs
``PatternExpr.match`` through a :class:`~torch._inductor.pattern_matcher.MatchContext` that
only watches (it records which sub-pattern was being matched against which node), so a
``FailedMatch`` is reported where Inductor stopped, named as a path from the pattern's root by
the ATen schema's argument names (``add.self: expected aten.mul.Tensor, found aten.div.Tensor``).
After a match, :class:`InductorPattern` applies the checks ``PatternMatcherPass.apply`` applies
(one mutation region, one stream, Inductor's CPU fallback rule, the entry's ``extra_check``;
for ``register_replacement`` the re-trace of the search function with the matched shapes, whose
own ``FailedMatch`` is explained the same way) and its rewrite is the entry's own ``apply``, run
inside :meth:`optimus_lens.core.rewriter.Rewriter.adopting` so each replacement is one recorded,
checked step that rolls back on error. A pass runs one sweep, last node first, as
``PatternMatcherPass.apply`` does; within a pass, our engine tries the entries one after the
other over all nodes where Inductor tries all entries at each node, so two entries of one pass
that compete for the same nodes may apply in another order.
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch._inductor import pattern_matcher as pm
from torch.fx import Node

from optimus_lens.core.miss import Miss
from optimus_lens.core.pattern import Match, RewritePattern, off_anchor

#: stages an Inductor pattern file can be run on
STAGES = ("post-grad", "pre-grad")


# --------------------------------------------------------------------------- registrations


@dataclass
class Registration:
    """One ``PatternEntry.register`` call made while a pattern file ran: the entry, its name
    (the search function's or the handler's), the line of the file that made it, and for
    ``register_replacement`` the search function, the ``extra_check`` it was given and the
    GraphModule the search function traced to (``search_gm``)."""

    entry: pm.PatternEntry
    name: str
    line: int | None
    search_fn: Any = None
    extra_check: Any = None
    search_gm: Any = None


def _registration(entry: pm.PatternEntry, path: str) -> Registration:
    """What the registering call knows: read from the frames above ``PatternEntry.register``
    (``register_replacement``'s arguments; the first frame in the pattern file)."""
    here = Path(path).resolve()
    line, search_fn, extra, gm = None, None, None, None
    f = inspect.currentframe()
    while f is not None:
        if f.f_code.co_name == "register_replacement" and f.f_globals.get("__name__") == pm.__name__:
            search_fn, extra, gm = f.f_locals.get("search_fn"), f.f_locals.get("extra_check"), f.f_locals.get("gm")
        if line is None and Path(f.f_code.co_filename).resolve() == here:
            line = f.f_lineno
        f = f.f_back
    if search_fn is not None:
        name = getattr(search_fn, "__name__", "replacement")
    else:
        handler = getattr(entry, "handler", None)
        name = getattr(handler, "__name__", type(entry).__name__)
    if search_fn is None:  # register_graph_pattern and the others: the entry's own check is the user's
        extra = entry.extra_check
    if extra is pm._return_true:  # noqa: SLF001 - Inductor's default: no check of the user's
        extra = None
    return Registration(entry, name, line, search_fn, extra, gm)


@contextmanager
def registrations(path: str) -> Iterator[list[Registration]]:
    """Record every ``PatternEntry.register`` call made in the block (the outermost one per
    entry), in order: how a file's registrations are named and located."""
    found: list[Registration] = []
    original = pm.PatternEntry.register
    depth = [0]

    @functools.wraps(original)
    def register(self, pass_dicts, target=None, prepend=False):
        if depth[0] == 0:
            found.append(_registration(self, path))
        depth[0] += 1
        try:
            return original(self, pass_dicts, target, prepend)
        finally:
            depth[0] -= 1

    pm.PatternEntry.register = register  # type: ignore[method-assign]
    try:
        yield found
    finally:
        pm.PatternEntry.register = original  # type: ignore[method-assign]


def passes_of(module: types.ModuleType) -> list[tuple[str, pm.PatternMatcherPass]]:
    """The module's ``PatternMatcherPass`` objects (bound to a module-level name, or in a
    module-level list or tuple), each once, in definition order, named by ``pass_name`` or
    else by the variable (``passes[1]`` for an item of a list)."""
    out: list[tuple[str, pm.PatternMatcherPass]] = []
    seen: set[int] = set()
    for var, v in vars(module).items():
        items = [(var, v)] if isinstance(v, pm.PatternMatcherPass) else []
        if isinstance(v, (list, tuple)):
            items = [(f"{var}[{i}]", x) for i, x in enumerate(v) if isinstance(x, pm.PatternMatcherPass)]
        for name, p in items:
            if id(p) not in seen:
                seen.add(id(p))
                out.append((p.pass_name or name, p))
    return out


def entries_of(p: pm.PatternMatcherPass) -> list[pm.PatternEntry]:
    """The pass's entries, each once, in registration order (an entry is filed under every
    target of its pattern)."""
    out: dict[int, pm.PatternEntry] = {}
    for es in p.patterns.values():
        for e in es:
            out.setdefault(id(e), e)
    return list(out.values())


def file_passes(
    module: types.ModuleType, regs: list[Registration], path: str, stage: str = "post-grad"
) -> list[tuple[str, list[InductorPattern]]]:
    """Each pass of ``module`` with its entries as :class:`InductorPattern` s (named after
    their registrations; a name taken twice in a pass gets ``_2``, ``_3`` ...)."""
    by_entry = {id(r.entry): r for r in regs}
    out: list[tuple[str, list[InductorPattern]]] = []
    for pass_name, p in passes_of(module):
        pats: list[InductorPattern] = []
        taken: dict[str, int] = {}
        for i, e in enumerate(entries_of(p)):
            r = by_entry.get(id(e)) or Registration(e, f"{type(e).__name__}_{i}", None)
            taken[r.name] = taken.get(r.name, 0) + 1
            name = r.name if taken[r.name] == 1 else f"{r.name}_{taken[r.name]}"
            pats.append(InductorPattern(r, name, f"{path}:{r.line or 1}", pass_name, stage, p))
        if pats:
            out.append((pass_name, pats))
    return out


# --------------------------------------------------------------------------- why a match fails


class _Watching(pm.MatchContext):
    """Inductor's MatchContext, unchanged in what it matches, that remembers the chain of
    (sub-pattern, node) pairs being matched when each FailedMatch arose, and the nodes that
    target sub-patterns matched."""

    def __init__(self, outputs: list, graph: torch.fx.Graph):
        super().__init__(outputs, graph=graph)
        self.chain: list[tuple[Any, Any]] = []
        self.origin: dict[int, tuple[pm.FailedMatch, list[tuple[Any, Any]]]] = {}
        self.matched: list[Node] = []
        self.matched_patterns: list[Any] = []

    def match(self, pattern: pm.PatternExpr, node: Any) -> pm.MatchResult:
        self.chain.append((pattern, node))
        try:
            r = super().match(pattern, node)
        except pm.FailedMatch as e:
            self.origin.setdefault(id(e), (e, list(self.chain)))
            raise
        finally:
            chain = list(self.chain)
            self.chain.pop()
        if not pm.is_match(r):
            self.origin.setdefault(id(r), (r, chain))
        elif isinstance(node, Node) and isinstance(pattern, pm._TargetExpr):  # noqa: SLF001
            self.matched.append(node)
            self.matched_patterns.append(pattern)
        return r


@dataclass
class Explained:
    """Inductor's answer at one node: ``match`` (a ``Match``) or ``failed`` (its
    ``FailedMatch``) with ``miss``, the reason named as a path, and ``partial``, the nodes its
    target sub-patterns matched before it stopped; ``stopped`` is the node (or constant) the
    failing sub-pattern met, ``stopped_pattern`` that sub-pattern, ``matched_patterns`` the
    target sub-patterns that matched."""

    match: pm.Match | None
    failed: pm.FailedMatch | None
    miss: Miss | None
    partial: list[Node]
    stopped: Any = None
    stopped_pattern: Any = None
    matched_patterns: tuple = ()


def explain(pattern: pm.PatternExpr, node: Node) -> Explained:
    """Run Inductor's ``pattern.match(node)`` (as ``PatternExpr.match`` does: a fresh
    ``MatchContext`` over the pattern's outputs) and, where it fails, name the sub-pattern
    where matching stopped as a path from the root, with a plain reading of Inductor's reason
    and its own text. Raises what the pattern raises (other than FailedMatch)."""
    outputs = list(pattern.outputs) if isinstance(pattern, pm.MultiOutputPattern) else [pattern]
    ctx = _Watching(outputs, node.graph)
    try:
        r = ctx.match(pattern, node)
    except pm.FailedMatch as e:
        r = e
    if pm.is_match(r):
        return Explained(r, None, None, list(r.nodes), matched_patterns=tuple(ctx.matched_patterns))
    failed = r
    _, chain = ctx.origin.get(id(failed), (failed, [(pattern, node)]))
    partial = list(dict.fromkeys(ctx.matched))
    miss = Miss(f"{_path(chain)}: {reading(failed, chain[-1][1])} [Inductor: {_short(str(failed))}]")
    miss.partial = partial
    miss.stopped = chain[-1][1].name if isinstance(chain[-1][1], Node) else ""  # type: ignore[attr-defined]
    return Explained(None, failed, miss, partial, chain[-1][1], chain[-1][0], tuple(ctx.matched_patterns))


def _short(text: str, n: int = 160) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def op_text(fn: Any) -> str:
    """An op as Inductor's patterns print it: ``aten.mul.Tensor``, ``operator.getitem``, a method name."""
    if isinstance(fn, str):
        return fn
    if isinstance(fn, torch._ops.OpOverload):
        return str(fn)
    mod = getattr(fn, "__module__", "") or ""
    return f"{mod.replace('torch._ops.', '')}.{getattr(fn, '__name__', fn)}".lstrip(".")


def _node_text(x: Any) -> str:
    if not isinstance(x, Node):
        return f"the constant {x!r}"
    if x.op == "placeholder":
        return f"the graph input {x.name}"
    if x.op in ("call_function", "call_method"):
        return f"{op_text(x.target)} ({x.name})"
    return f"{x.op} {x.name}"


def _arg_names(parent: Any, node: Any) -> list[tuple[str, Any]]:
    """(argument name, sub-pattern or constant) for each argument of a target sub-pattern,
    named by the schema of the node it was matched against (else by the pattern's first
    target; ``args[i]`` where neither has a schema); list items as ``name[j]``."""
    target = node.target if isinstance(node, Node) else parent.fns[0]
    schema = getattr(target, "_schema", None)
    positional = [a.name for a in schema.arguments] if schema is not None else []
    out: list[tuple[str, Any]] = []

    def walk(name: str, a: Any) -> None:
        out.append((name, a))
        if isinstance(a, (list, tuple)):
            for j, x in enumerate(a):
                walk(f"{name}[{j}]", x)

    for i, a in enumerate(getattr(parent, "args", ())):
        walk(positional[i] if i < len(positional) else f"args[{i}]", a)
    for k, a in getattr(parent, "kwargs", {}).items():
        walk(str(k), a)
    return out


def _root_name(pattern: Any, node: Any) -> str:
    fns = getattr(pattern, "fns", None)
    fn = node.target if isinstance(node, Node) and node.op != "placeholder" else (fns[0] if fns else None)
    if isinstance(fn, torch._ops.OpOverload):
        return fn._opname  # noqa: SLF001 - ``add`` of aten.add.Tensor, as AOTAutograd names nodes
    return getattr(fn, "__name__", None) or str(fn or type(pattern).__name__)


def _path(chain: list[tuple[Any, Any]]) -> str:
    """The chain of (sub-pattern, node) pairs from the root as a dotted path: the root's op
    name, then each child's argument name in its parent (``add.self.other``)."""
    root, node = chain[0]
    if isinstance(root, pm.MultiOutputPattern) and len(chain) > 1:  # the outputs: named by the first
        chain = chain[1:]
        root, node = chain[0]
    parts = [_root_name(root, node)]
    for (parent, pnode), (child, _) in zip(chain, chain[1:]):
        if isinstance(parent, pm.MultiOutputPattern):
            parts.append(f"outputs[{parent.outputs.index(child)}]")
            continue
        name = next((n for n, a in _arg_names(parent, pnode) if a is child), None)
        parts.append(name or type(child).__name__)
    return ".".join(parts)


def reading(failed: pm.FailedMatch, node: Any) -> str:
    """Inductor's FailedMatch read out for a person: what the sub-pattern expected and what
    the node it was matched against is (from the FailedMatch's own format and arguments)."""
    fmt, args, kw = failed.format_string, failed.args, failed.kwargs
    if fmt.startswith("function_mismatch") and len(args) == 2:
        got, pat = args
        want = " or ".join(op_text(f) for f in getattr(pat, "fns", [])[:3]) or repr(pat)
        if isinstance(got, Node) and getattr(pat, "_match_fns", None) and pat._match_fns(got):  # noqa: SLF001
            return f"expected {want} with {len(getattr(pat, 'args', ()))} positional arguments, found {len(got.args)}"
        return f"expected {want}, found {_node_text(got)}"
    if fmt.startswith("multiple_users") and isinstance(node, Node):
        pat = args[0] if args else None
        want = getattr(pat, "users", 1)
        return f"{node.name} has {len(node.users)} users; the pattern needs {'any number' if want is pm.MULTIPLE else want}"
    if fmt.startswith("constant_args") and len(args) == 2:
        return (
            f"an argument of {_node_text(args[0])} is {args[1]!r}; the pattern has the constant {kw.get('pattern')!r}"
        )
    if fmt == "repeated pattern differs":
        return f"this sub-pattern appears twice in the pattern, and here it meets {_node_text(node)}, another node"
    if fmt.startswith("kwarg mismatch"):
        return f"KeywordArg {args[0]!r} would bind two different values"
    if fmt.startswith("args_structure"):
        return "the arguments are nested differently from the pattern's"
    if fmt == "exclusive arg appears twice":
        return f"the ExclusiveKeywordArg would bind {_node_text(node)} a second time"
    return str(failed)


# --------------------------------------------------------------------------- the pattern


class InductorPattern(RewritePattern):
    """One ``PatternEntry`` of a user's ``PatternMatcherPass`` as a RewritePattern.

    ``match(node)``: Inductor's match (:func:`explain`), then the checks
    ``PatternMatcherPass.apply`` makes before applying, each refusal a Miss; the Match carries
    Inductor's ``Match`` (``info["inductor"]``) and the bound KeywordArgs
    (``info["keyword_args"]``: name -> node name or constant text). ``rewrite``: the entry's own
    ``apply``, adopted by the Rewriter. ``pattern_text``: the pattern as Inductor's
    ``PatternPrettyPrinter`` prints it (for ``register_replacement``: what the search function
    traced to). ``matcher_pass``: the user's ``PatternMatcherPass`` that holds the entry.
    ``drawing``: the pattern as a graph (:func:`optimus_lens.frontend.inductor_graph.pattern_snapshot`),
    and a near miss's ``pattern_partial`` / ``pattern_stopped`` name its nodes."""

    def __init__(
        self,
        reg: Registration,
        name: str,
        source: str,
        pass_name: str,
        stage: str = "post-grad",
        matcher_pass: pm.PatternMatcherPass | None = None,
    ):
        self.registration, self.entry, self.matcher_pass = reg, reg.entry, matcher_pass
        self.name, self.source, self.stage, self.pass_name = name, source, stage, pass_name
        pat = self.entry.pattern
        op = getattr(pat, "op", None)
        fns = list(getattr(pat, "fns", []) or [])
        self.anchors = frozenset() if op == "call_module" else frozenset(fns)
        kind = {pm.ReplacementPatternEntry: "register_replacement", pm.GraphPatternEntry: "register_graph_pattern"}
        self.form = kind.get(type(self.entry), type(self.entry).__name__)
        self.upstream = f"{pass_name} ({self.form})"
        try:
            self.pattern_text = pm.PatternPrettyPrinter.run(pat)
        except Exception:  # noqa: BLE001 - a pattern the printer does not know: its repr
            self.pattern_text = repr(pat)
        self.description = f"{self.form} in PatternMatcherPass {pass_name!r}, anchored at " + (
            ", ".join(op_text(f) for f in fns[:3]) or "any node"
        )

    @functools.cached_property
    def drawing(self) -> tuple[Any, dict[int, str]] | None:
        """(GraphSnapshot of the pattern, sub-pattern id -> its node name), or None for a
        pattern that cannot be drawn."""
        from optimus_lens.frontend.inductor_graph import pattern_snapshot

        try:
            return pattern_snapshot(self.entry.pattern)
        except TypeError:
            return None

    def _in_pattern(self, miss: Miss, patterns: Any, stopped: Any = None) -> Miss:
        """``miss`` with the pattern graph's nodes that matched and the one where matching stopped."""
        names = self.drawing[1] if self.drawing else {}
        miss.pattern_partial = [names[id(p)] for p in patterns if id(p) in names]  # type: ignore[attr-defined]
        miss.pattern_stopped = names.get(id(stopped), "") if stopped is not None else ""  # type: ignore[attr-defined]
        return miss

    def match(self, node: Node) -> Match | Miss:
        miss = off_anchor(self, node)
        if miss is not None:
            return miss
        ans = explain(self.entry.pattern, node)
        if ans.match is None:
            return self._in_pattern(ans.miss or Miss("no match"), ans.matched_patterns, ans.stopped_pattern)
        m = ans.match
        refusal = self._apply_checks(m, node)
        if refusal is not None:
            refusal.partial = list(m.nodes)
            refusal.stopped = ""  # type: ignore[attr-defined]
            return self._in_pattern(refusal, ans.matched_patterns)
        return Match(node, list(m.nodes), {"inductor": m, "keyword_args": bindings(m)})

    def _apply_checks(self, m: pm.Match, node: Node) -> Miss | None:
        """The checks of ``PatternMatcherPass.apply`` after a match, in its order."""
        graph = node.graph
        if pm.should_compute_mutation_region_ids(graph):
            pm.compute_mutation_region_ids(graph)
        if len({pm.get_mutation_region_id(graph, n) for n in m.nodes}) != 1:
            return Miss("the match crosses a mutation (its nodes lie in different mutation regions)")
        if len({n.meta.get("custom", {}).get("stream", 0) for n in m.nodes}) != 1:
            return Miss("the match crosses a stream boundary")
        from torch._inductor.lowering import fallback_node_due_to_unsupported_type

        if fallback_node_due_to_unsupported_type(node, allow_cpu_inputs=False):
            return Miss(f"Inductor does not apply patterns at {node.name}: its inputs or outputs fall back to eager")
        return self._extra_check(m)

    def _extra_check(self, m: pm.Match) -> Miss | None:
        """The entry's ``extra_check``; for ``register_replacement`` that is its re-trace of the
        search function with the matched shapes (whose FailedMatch is explained) and then the
        user's own check."""
        specific: list[pm.PatternExpr] = []
        original = pm.fx_to_pattern

        def watched(*a: Any, **k: Any) -> pm.PatternExpr:
            p = original(*a, **k)
            specific.append(p)
            return p

        trace_failures: list[BaseException] = []
        log_failure = pm.log_trace_failure

        def logged(search_fn: Any, e: RuntimeError) -> None:
            trace_failures.append(e)
            log_failure(search_fn, e)

        replacement = isinstance(self.entry, pm.ReplacementPatternEntry)
        if replacement:
            pm.fx_to_pattern, pm.log_trace_failure = watched, logged
        try:
            ok = torch.fx.experimental.symbolic_shapes.guard_or_false(self.entry.extra_check(m))
        except Exception as e:
            if replacement:
                raise RetraceError(self.retrace_text(e)) from e
            raise
        finally:
            pm.fx_to_pattern, pm.log_trace_failure = original, log_failure
        if ok:
            return None
        user = self.registration.extra_check
        user_name = getattr(user, "__name__", "extra_check")
        if trace_failures:  # Inductor logs this at INFO level and moves on: say it
            return Miss(self.retrace_text(trace_failures[-1]))
        if replacement and specific:
            out = m.output_nodes()[0]
            again = explain(specific[-1], out) if out is not None else None
            if again is not None and again.miss is not None:
                fn = getattr(self.registration.search_fn, "__name__", "the search function")
                return Miss(f"re-traced with the matched shapes, {fn} does not match: {again.miss}")
            if user is not None:
                return Miss(f"extra_check {user_name} refused the match")
            return Miss("register_replacement's check refused the match after its re-trace matched")
        if replacement:
            return Miss(
                f"register_replacement's check refused the match "
                f"({'extra_check ' + user_name if user else 'its re-trace of the search function failed'})"
            )
        return Miss(f"extra_check {user_name} refused the match")

    def retrace_text(self, e: BaseException) -> str:
        """What a failed re-trace of the search function with the matched shapes says."""
        fn = getattr(self.registration.search_fn, "__name__", "the search function")
        first = (str(e).strip().splitlines() or [""])[0]
        return (
            f"re-tracing {fn} with the matched shapes failed ({type(e).__name__}: {_short(first, 300)}); "
            "register_replacement re-traces the search function at every match"
        )

    def rewrite(self, rw, match: Match) -> None:
        """Inductor's ``entry.apply(match, graph, node)`` on the live graph, every change it makes
        adopted by ``rw`` (:meth:`~optimus_lens.core.rewriter.Rewriter.adopting`); mutation region
        ids renumbered afterwards when a mutation was created or erased."""
        m: pm.Match = match.info["inductor"]
        node = match.anchor
        graph = node.graph
        gm = graph.owning_module
        if gm is None:
            raise ValueError("an Inductor pattern applies to a graph owned by a GraphModule")
        keep = list(dict.fromkeys([*m.nodes, *(i for n in m.nodes for i in n.all_input_nodes)]))
        mutation = any(pm.is_mutation_op(n) for n in m.nodes)
        with rw.adopting(gm, keep_meta=keep):
            self.entry.apply(m, graph, node)
        if mutation or any(pm.is_mutation_op(n) for n in rw.created if not n._erased):
            pm.compute_mutation_region_ids(graph)


class RetraceError(RuntimeError):
    """A ``register_replacement`` re-trace that raised something other than RuntimeError (which
    Inductor takes as "no match"): Inductor's compile would raise it too."""


def bindings(m: pm.Match) -> dict[str, str]:
    """A Match's KeywordArgs: name -> the node name, or the constant's repr."""
    return {k: (v.name if isinstance(v, Node) else repr(v)) for k, v in m.kwargs.items()}


def is_inductor_file(module: types.ModuleType) -> bool:
    """True when the module defines a ``PatternMatcherPass`` (bound to a name or in a list)."""
    return bool(passes_of(module))


def registration_failure(e: BaseException) -> str | None:
    """What an exception raised inside ``register_replacement`` while a file ran means (its
    first trace of the search function, or of the replacement, with the example inputs);
    None for an exception raised elsewhere."""
    tb = e.__traceback__
    search_fn = None
    while tb is not None:
        f = tb.tb_frame
        if f.f_code.co_name == "register_replacement" and f.f_globals.get("__name__") == pm.__name__:
            search_fn = f.f_locals.get("search_fn")
        tb = tb.tb_next
    if search_fn is None:
        return None
    first = (str(e).strip().splitlines() or [""])[0]
    name = getattr(search_fn, "__name__", "the search function")
    return (
        f"register_replacement could not trace the search function {name} with its example inputs "
        f"({type(e).__name__}: {_short(first, 300)})"
    )
