"""An Inductor pattern as an FX graph: what a ``register_replacement`` search function traced
to, or what a ``register_graph_pattern`` tree spells, drawn beside the model's graph.

``PatternExpr`` trees (``torch._inductor.pattern_matcher``) become one FX graph: each
``CallFunction`` / ``CallMethod`` / ``CallModule`` a call node on its first target (named as
AOTAutograd names ATen nodes: ``mul``, ``add_1``), each ``KeywordArg`` / ``ExclusiveKeywordArg``
a placeholder of its name (one per name), each ``Arg`` / ``Ignored`` a placeholder of its own
(``arg``, ``ignored``: anything matches there), a ``*VarArgs`` target a call on one ``varargs``
placeholder; ``ListOf`` and ``RepeatedExpr`` draw their inner pattern, a ``MultiOutputPattern``
an output of every output. A sub-pattern used twice is one node, as Inductor requires the same
node there. ``fx_to_pattern`` (how ``register_replacement`` turns the search function's traced
graph into a pattern) keeps one sub-pattern per call node, so for that form this graph is the
traced graph, with the arguments Inductor ignores shown as ``ignored``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._inductor import pattern_matcher as pm
from torch.fx import Graph, Node

from optimus_lens.core.record import snapshot_graph
from optimus_lens.core.trace import GraphSnapshot


def _name_of(fn: Any) -> str:
    if isinstance(fn, torch._ops.OpOverload):
        return fn._opname  # noqa: SLF001 - ``mul`` of aten.mul.Tensor, as AOTAutograd names nodes
    if isinstance(fn, str):
        return fn
    return getattr(fn, "__name__", None) or "call"


def pattern_graph(pattern: pm.PatternExpr) -> tuple[Graph, dict[int, str]]:
    """``pattern`` as an FX graph (see the module docstring), and the name of the node each
    sub-pattern became, by ``id`` of the sub-pattern (what a near miss's path points at).
    Raises TypeError for a sub-pattern of a kind this module does not know."""
    g = Graph()
    built: dict[int, Node] = {}
    inputs: dict[str, Node] = {}
    names: dict[int, str] = {}

    def leaf(p: pm.PatternExpr) -> Node:
        if isinstance(p, (pm.KeywordArg, pm.ExclusiveKeywordArg)):
            if p.name not in inputs:
                inputs[p.name] = g.placeholder(p.name)
            return inputs[p.name]
        return g.placeholder("ignored" if isinstance(p, pm.Ignored) else "arg")

    def conv(a: Any) -> Any:
        if isinstance(a, pm.PatternExpr):
            return node(a)
        if isinstance(a, (list, tuple)):
            return type(a)(conv(x) for x in a)
        if isinstance(a, dict):
            return {k: conv(v) for k, v in a.items()}
        return a

    def node(p: pm.PatternExpr) -> Node:
        if id(p) in built:
            return built[id(p)]
        if isinstance(p, (pm.KeywordArg, pm.ExclusiveKeywordArg, pm.Arg, pm.Ignored)):
            n = leaf(p)
        elif isinstance(p, pm.ListOf):
            n = node(p.pattern)
        elif isinstance(p, pm.RepeatedExpr):
            n = node(p.inner_pattern)
        elif isinstance(p, pm._TargetArgsExpr):  # noqa: SLF001 - CallFunction / CallMethod / CallModule
            args, kwargs = conv(tuple(p.args)), conv(dict(p.kwargs))
            n = g.create_node(p.op, p.fns[0], args, kwargs, name=_name_of(p.fns[0]))
        elif isinstance(p, pm._TargetExprVarArgs):  # noqa: SLF001
            n = g.create_node(p.op, p.fns[0], (leaf(pm.Arg()),), {}, name=_name_of(p.fns[0]))
        else:
            raise TypeError(f"cannot draw a {type(p).__name__} sub-pattern")
        built[id(p)] = n
        names[id(p)] = n.name
        return n

    if isinstance(pattern, pm.MultiOutputPattern):
        outs = [node(o) for o in pattern.outputs if o is not None]
        g.output(tuple(outs))
    else:
        g.output(node(pattern))
    return g, names


def pattern_snapshot(pattern: pm.PatternExpr) -> tuple[GraphSnapshot, dict[int, str]]:
    """:func:`pattern_graph` as a GraphSnapshot (what the viewer draws) and the sub-pattern
    names; raises what :func:`pattern_graph` raises."""
    g, names = pattern_graph(pattern)
    return snapshot_graph(g), names
