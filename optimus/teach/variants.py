"""Variants of a lesson's graph on which the pattern behaves differently, built from the
pattern's own sites: the dependent search (one member made to depend on another) and
the exercise (a variant where the pattern does not fire, with the why-not answer)."""

from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from optimus_lens.core import meta
from optimus_lens.core.engine import copy_graph_module
from optimus_lens.core.pattern import BatchPattern, Pattern
from optimus_lens.core.record import snapshot_graph
from optimus_lens.core.trace import Trace
from optimus_lens.teach.data import Exercise, Search
from optimus_lens.teach.lookup import lesson_pipeline
from optimus_lens.teach.replay import search_frames


def depend_last(gm: GraphModule, sites: list[str]) -> tuple[str, list[str], str]:
    """The last member reads ``its input + sum(first member)``: it now depends on the first."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    by = {n.name: n for n in gm.graph.nodes}
    members = sorted((by[s] for s in sites if s in by), key=order.__getitem__)
    first_m, last = members[0], members[-1]
    inp = last.all_input_nodes[0]
    with gm.graph.inserting_before(last):
        s = gm.graph.call_function(torch.sum, (first_m,))
        meta.infer(s)
        a = gm.graph.call_function(torch.add, (inp, s))
        meta.infer(a)
    last.replace_input_with(inp, a)
    gm.recompile()
    return (
        f"{last.name} now reads its input plus the sum of {first_m.name}: it depends on {first_m.name}",
        [s.name, a.name],
        last.name,
    )


def dependent_search(gm: GraphModule, pattern: BatchPattern, sites: list[str], search: str | None = None) -> Search:
    """The search on a variant of ``gm`` (copied) where the last member of the group
    ``sites`` depends on the first: the frames show it left out, with the reason."""
    gm = copy_graph_module(gm)
    change, _, _ = depend_last(gm, sites)
    out = search_frames(gm, pattern, search)
    out.graph, out.change = snapshot_graph(gm.graph), change
    return out


def _chain_members(gm: GraphModule, sites: list[str]) -> tuple[str, list[str], str]:
    """Each member after the first reads ``its input + sum(previous member)``: every member
    now depends on the one before it, so no two are independent."""
    by = {n.name: n for n in gm.graph.nodes}
    members = sorted((by[s] for s in sites if s in by), key=list(gm.graph.nodes).index)
    added = []
    for prev, n in zip(members, members[1:]):
        first = n.all_input_nodes[0]
        with gm.graph.inserting_before(n):
            s = gm.graph.call_function(torch.sum, (prev,))
            meta.infer(s)
            a = gm.graph.call_function(torch.add, (first, s))
            meta.infer(a)
        n.replace_input_with(first, a)
        added += [s.name, a.name]
    gm.recompile()
    return (
        f"a dependency between members: each of {', '.join(m.name for m in members[1:])} now reads its input "
        f"plus the sum of the member before it",
        added,
        members[-1].name,
    )


def _site_source(gm: GraphModule, sites: list[str]) -> tuple[list[Node], Node]:
    """The site's nodes in graph order and the first tensor its first node reads from outside it."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    by = {n.name: n for n in gm.graph.nodes}
    site = sorted((by[s] for s in sites if s in by), key=order.__getitem__)
    inside = set(site)
    outside = [i for n in site for i in n.all_input_nodes if i not in inside and meta.tensor(i) is not None]
    if not outside:
        raise ValueError("the site reads no tensor from outside it")
    return site, outside[0]


def _write_input(gm: GraphModule, sites: list[str]) -> tuple[str, list[str], str]:
    """An in-place write (``add_``) on the tensor the site reads, after the site."""
    site, target = _site_source(gm, sites)
    with gm.graph.inserting_after(site[-1]):
        w = gm.graph.call_method("add_", (target, 1.0))
    w.meta["example_value"] = meta.value(target)
    gm.recompile()
    return f"an in-place write: {target.name}.add_(1.0) after the site", [w.name], sites[0]


def _mix_dtype(gm: GraphModule, sites: list[str]) -> tuple[str, list[str], str]:
    """A dtype mix: the tensor the site reads first is cast to float64 for the site."""
    site, target = _site_source(gm, sites)
    user = next(n for n in site if target in n.all_input_nodes)
    with gm.graph.inserting_before(user):
        c = gm.graph.call_method("to", (target, torch.float64))
        meta.infer(c)
    user.replace_input_with(target, c)
    gm.recompile()
    return f"a dtype mix: {user.name} reads {target.name} cast to float64", [c.name], sites[0]


def _already_rewritten(gm: GraphModule, trace: Trace) -> tuple[str, list[str], str]:
    """The graph after the pattern (its own fixed point): ask about a node its step made."""
    step = trace.steps[0]
    names = {n.name for n in gm.graph.nodes}
    node = next((n for n in list(step.replaced.values()) + step.created if n in names), None)
    if node is None:
        raise ValueError("the step left no node to ask about")
    return "the graph after the pattern ran: its own output", [], node


def exercise(pattern: Pattern, before: GraphModule, after: GraphModule, trace: Trace) -> Exercise | None:
    """A variant of the lesson's graph where ``pattern`` does not fire, and why.

    Variants tried in order (the first on which the one-pattern pass makes no step and
    :class:`optimus_lens.debug.why.DryRun` names a reason wins): for a batch pattern, a dependency
    chain between the members of its first group; for any pattern, an in-place write on
    the tensor its first site reads; that tensor cast to float64 (a dtype mix); the graph
    after the pattern (its fixed point). The question asks about the site's first node
    (its anchor), else the first site node the answer names a reason for. None
    when no variant stops it."""
    from optimus_lens.debug.why import DryRun

    if not trace.steps:
        return None
    sites = trace.steps[0].sites
    makers = []
    if isinstance(pattern, BatchPattern):
        makers.append(lambda g: _chain_members(g, sites))
    makers += [lambda g: _write_input(g, sites), lambda g: _mix_dtype(g, sites), lambda g: _already_rewritten(g, trace)]
    pipe = lesson_pipeline(pattern)
    for i, make in enumerate(makers):
        gm = copy_graph_module(after if i == len(makers) - 1 else before)
        try:
            change, added, node = make(gm)
            dry = DryRun(gm, pipe)
        except Exception:  # noqa: BLE001 - a variant that cannot be built here is skipped
            continue
        if any(s.pattern == pattern.name and s.error is None for s in dry.steps):
            continue
        names = {n.name for n in gm.graph.nodes}
        asked = [node] + [s for s in sites if s != node and s in names]
        verdicts = [(x, dry.explain(x, [pattern.name]).verdicts[0]) for x in asked if x in names]
        real = [(x, v) for x, v in verdicts if not v.applies and not v.text.startswith(("not an anchor", "no match"))]
        if not real:
            continue
        node, verdict = real[0]
        return Exercise(
            change,
            snapshot_graph(gm.graph),
            added,
            node,
            f"Here {pattern.name} does not fire. Why not? (asked about node {node})",
            verdict.text,
            gm,
        )
    return None
