"""Guided walks through the predefined patterns, built from the patterns themselves.

:func:`walkthrough` runs one pattern (a one-pattern :class:`~optimus_lens.core.pipeline.Pass`)
over its teaching model (the sample model whose ``teaches`` names it) and gathers what a
lesson shows, as plain data:

1. the graph before, and what the pattern looks for (its ``description`` and
   ``preconditions``, as registered);
2. the search: for a batch pattern, replayed from :mod:`optimus_lens.core.search` with the very
   functions the engine runs (:func:`search_frames`), one :class:`Frame` per move a
   learner can scrub; for a rewrite pattern, every anchor node and what ``match`` said;
3. the match: each step's sites;
4. the graph after, with provenance (the Trace's steps);
5. what it bought: node counts, latency before/after measured side by side by
   :func:`optimus_lens.perf.bench.measure` (median, p10-p90), and peak memory;

plus an :class:`Exercise`: a variant of the teaching model's graph where the pattern
does not fire, with the answer :class:`optimus_lens.debug.why.DryRun` gives to "why not?".

Nothing here is written per pattern: every sentence comes from the pattern's
registration, the engine's own search functions, the trace or the why-not machinery.
``viz.lesson`` draws a Walkthrough; the app's Teach page shows it.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
from torch.fx import GraphModule, Node

from optimus_lens.core import meta
from optimus_lens.core.engine import Engine, RunOptions, copy_graph_module
from optimus_lens.core.index import GraphIndex
from optimus_lens.core.pattern import (
    BatchPattern,
    Miss,
    Pattern,
    SearchOptions,
    graph_unchanged,
    why_not,
)
from optimus_lens.core.pipeline import Pass, Pipeline
from optimus_lens.core.record import snapshot_graph
from optimus_lens.core.search import (
    _ancestors_in,
    global_groups,
    is_search_root,
    member_depths,
)
from optimus_lens.core.trace import GraphSnapshot, Trace
from optimus_lens.perf.bench import Stage, measure

KEY_TEXT = 90  # characters of a group key shown before "..."


class TeachError(KeyError):
    """Unknown pattern, or a pattern without a teaching model; the message lists the known ones."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@dataclass
class Frame:
    """One move of the search, as a learner scrubs it.

    ``marks`` maps node name -> group index (colour) and ``labels[i]`` names group i
    (a depth ring, a key class, a fused group); ``left_out`` maps a node to why it is
    not (or no longer) in a group. ``groups`` is set on the frames that produce groups."""

    title: str
    text: str
    marks: dict[str, int] = field(default_factory=dict)
    labels: list[str] = field(default_factory=list)
    left_out: dict[str, str] = field(default_factory=dict)
    groups: list[list[str]] = field(default_factory=list)


@dataclass
class Search:
    """A replayed search: ``mode`` ("global" or "upstream"), the frames in order, and the
    groups the search hands to the pattern's ``fuse`` (the last frame's ``groups``)."""

    mode: str
    frames: list[Frame]
    groups: list[list[str]]
    root: str | None = None
    #: the graph searched when it is not the lesson's graph before (a variant), and how it differs
    graph: GraphSnapshot | None = None
    change: str = ""


@dataclass
class Gain:
    """What the pattern bought on the teaching model: node counts, latency in ms (median,
    p10, p90 over ``repeats`` samples, both graphs timed round-robin in one run), peak
    memory in bytes (``peak_source``: "estimate" = liveness of the graph on CPU, "cuda"
    = measured), ``method`` the timer and ``device``."""

    nodes_before: int
    nodes_after: int
    before_ms: tuple[float, float, float]
    after_ms: tuple[float, float, float]
    peak_before: int
    peak_after: int
    peak_source: str
    method: str
    device: str
    repeats: int

    @property
    def speedup(self) -> float:
        return self.before_ms[0] / self.after_ms[0] if self.after_ms[0] > 0 else float("nan")


@dataclass
class Exercise:
    """A variant of the teaching model's graph on which the pattern does not fire.

    ``change`` says in words how the variant differs, ``added`` names the nodes it added,
    ``graph`` is its snapshot, ``question`` asks about node ``node``, and ``answer`` is
    what :meth:`optimus_lens.debug.why.DryRun.explain` says for it (verbatim)."""

    change: str
    graph: GraphSnapshot
    added: list[str]
    node: str
    question: str
    answer: str
    #: the variant itself (a GraphModule with example values), to run it again
    gm: GraphModule | None = field(default=None, repr=False, compare=False)


@dataclass
class Slide:
    """One slide: ``kind`` ("before", "search", "dependent" (the search on a variant where
    one member depends on another), "match", "after", "gain", "exercise"),
    a title and its lines of text (every line derived, none written per pattern)."""

    kind: str
    title: str
    lines: list[str]


@dataclass
class Walkthrough:
    """Everything a lesson on ``pattern`` shows (see the module docstring). ``trace`` holds
    only this pattern's steps on ``model``; ``sites`` lists each step's site nodes;
    ``anchors`` (rewrite patterns) maps each anchor node of the captured graph to None
    (it matched) or the pattern's reason."""

    pattern: str
    kind: str
    description: str
    preconditions: list[str]
    upstream: str
    source: str
    model: str
    model_description: str
    trace: Trace
    sites: list[list[str]]
    search: Search | None
    anchors: dict[str, str | None]
    #: batch patterns: the same search on a variant where one member depends on another
    dependent: Search | None
    #: per step, why its sites matched: the group key they share (batch) or the anchor ``match`` accepted
    why_sites: list[str] = field(default_factory=list)
    gain: Gain | None = None
    exercise: Exercise | None = None
    slides: list[Slide] = field(default_factory=list)


# ----------------------------------------------------------------------------- lookup


def predefined() -> list[str]:
    """Every shipped pattern's name, in registration order (what ``optimus passes`` lists)."""
    from optimus_lens.passes import pass_catalogue

    return [c["name"] for c in pass_catalogue()]


def teaching_model(pattern_name: str) -> str:
    """The sample model that teaches ``pattern_name``: the first model of kind "teaching"
    whose ``teaches`` names it. Raises TeachError (unknown pattern, or none teaches it)."""
    from optimus_lens import sample_models

    names = predefined()
    if pattern_name not in names:
        raise TeachError(f"unknown pattern {pattern_name!r}; known: {', '.join(names)}")
    for m in sample_models.REGISTRY.values():
        if m.kind == "teaching" and pattern_name in m.teaches:
            return m.name
    raise TeachError(
        f"no teaching model teaches {pattern_name!r} (a sample model of kind 'teaching' with it in its teaches field)"
    )


def _pattern(name: str) -> Pattern:
    from optimus_lens.core.pattern import get

    if name not in predefined():
        raise TeachError(f"unknown pattern {name!r}; known: {', '.join(predefined())}")
    return get(name)


def lesson_pipeline(pattern: Pattern) -> Pipeline:
    """The one-pass pipeline a lesson runs: ``pattern`` alone, with its own search options."""
    return Pipeline([Pass(pattern.name, [pattern], description=pattern.description)])


def _opts(pattern: Pattern, search: str | None = None) -> SearchOptions:
    opts = getattr(pattern, "options", SearchOptions())
    return opts.replace(search=search) if search else opts


def _key(pattern: BatchPattern):
    def k(n: Node):
        r = pattern.key(n)
        return None if isinstance(r, Miss) else r

    return k


def _short(text: str, limit: int = KEY_TEXT) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _names(nodes) -> list[str]:
    return [n.name for n in nodes]


# ----------------------------------------------------------------------------- search replay


def _candidates(gm: GraphModule, pattern: BatchPattern) -> tuple[dict, dict[str, str]]:
    """Key classes as the engine's global sweep builds them (live nodes with users and a
    key, in graph order), and the anchor nodes left out with the pattern's reason."""
    classes: dict = {}
    left: dict[str, str] = {}
    anchors = pattern.anchors
    with graph_unchanged():
        for n in gm.graph.nodes:
            if anchors and (n.op not in ("call_function", "call_method") or n.target not in anchors):
                continue
            r = pattern.key(n)
            if r is None or isinstance(r, Miss):
                if anchors:
                    left[n.name] = str(r) if r is not None else "no match"
                continue
            if not n.users:
                left[n.name] = "its output is unused (only nodes with users are candidates)"
                continue
            classes.setdefault(r, []).append(n)
    return classes, left


def _class_frames(classes: dict, left: dict[str, str], opts: SearchOptions) -> list[Frame]:
    keyed = [n for ms in classes.values() for n in ms]
    frames = [
        Frame(
            "Candidates",
            f"{len(keyed)} node(s) have a group key: {', '.join(_names(keyed)) or 'none'}."
            + (f" {len(left)} anchor node(s) are left out (listed with the reason)." if left else ""),
            marks={n.name: 0 for n in keyed},
            labels=["candidate (has a group key)"],
            left_out=dict(left),
        )
    ]
    marks, labels, lines = {}, [], []
    for i, (k, ms) in enumerate(classes.items()):
        labels.append(f"key class {i + 1} ({len(ms)} nodes)")
        for n in ms:
            marks[n.name] = i
        size = "" if len(ms) >= opts.min_fuse_set_size else f": too small, a group needs {opts.min_fuse_set_size}"
        lines.append(f"class {i + 1} ({len(ms)} nodes{size}), key {_short(repr(k))}")
    frames.append(
        Frame(
            "Bucketed by group key",
            "Nodes fuse only with nodes of the same group key. " + "; ".join(lines),
            marks,
            labels,
            dict(left),
        )
    )
    return frames


def global_frames(gm: GraphModule, pattern: BatchPattern, opts: SearchOptions) -> Search:
    """The default global search replayed on ``gm`` (unchanged) with the engine's own
    functions: key classes (:meth:`Engine._sweep_global`'s rule), member depths
    (:func:`optimus_lens.core.search.member_depths`: equal depths are independent), and the groups
    :func:`optimus_lens.core.search.global_groups` yields, a fused member counting as gone (the
    engine fuses each group before asking for the next)."""
    classes, left = _candidates(gm, pattern)
    frames = _class_frames(classes, left, opts)
    index = GraphIndex(gm.graph)
    pos = index.pos
    todo = sorted(
        (ms for ms in classes.values() if len(ms) >= opts.min_fuse_set_size),
        key=lambda ms: min(map(pos.__getitem__, ms)),
    )
    groups: list[list[str]] = []
    taken: set[Node] = set()
    for members in todo:
        depths = member_depths(members, index)
        floor = min(index.level[n] for n in members)
        memo: dict = {}
        member = set(members)
        dep_left = {}
        marks, labels = {}, []
        for d in sorted(set(depths.values())):
            labels.append(f"depth {d} ({sum(1 for v in depths.values() if v == d)} members)")
        order = sorted(set(depths.values()))
        for n, d in depths.items():
            marks[n.name] = order.index(d)
            if d:
                above = [m for m in _ancestors_in(n, member, floor, index.level, memo)]
                dep_left[n.name] = (
                    f"depends on {', '.join(sorted(_names(above)))}, so it cannot be in a group with "
                    f"{'it' if len(above) == 1 else 'them'}"
                )
        frames.append(
            Frame(
                "Independent layers",
                "Depth = most members on one producer path above a member; "
                "members of equal depth are mutually independent, so each depth is an anti-chain. "
                + (
                    f"{len(dep_left)} member(s) depend on another member."
                    if dep_left
                    else "No member depends on another: one layer."
                ),
                marks,
                labels,
                dep_left,
            )
        )
        for g in global_groups(members, index, opts, lambda n: n not in taken):
            taken.update(g)
            groups.append(_names(g))
            out = [n for n in dep_left if n not in groups[-1]]
            frames.append(
                Frame(
                    f"Group {len(groups)}",
                    f"{len(g)} mutually independent members fuse as one step: "
                    f"{', '.join(_names(g))}." + (f" Left out: {', '.join(out)} (depends on a member)." if out else ""),
                    {x: 0 for x in _names(g)},
                    [f"group {len(groups)}"],
                    {n: r for n, r in dep_left.items() if n not in groups[-1]},
                    [list(x) for x in groups],
                )
            )
    if not groups:
        frames.append(
            Frame(
                "No group",
                f"No key class has {opts.min_fuse_set_size} mutually independent members.",
                left_out=dict(left),
            )
        )
    return Search("global", frames, groups)


def bfs_rings(root: Node, key, depth: int) -> tuple[list[tuple[int, Node, bool]], dict]:
    """:func:`optimus_lens.core.search.fusion_candidates` from ``root`` with its visits recorded:
    (hops, node, matched) in visiting order (a matched node is not expanded), and the
    buckets it returns (the same as ``fusion_candidates(root, key, depth)``)."""
    from collections import deque

    visits: list[tuple[int, Node, bool]] = []
    buckets: dict = {}
    if root.op == "call_function" and root.target is operator.getitem:
        return visits, buckets
    inputs = root.all_input_nodes
    seen = set(inputs)
    q = deque((1, n) for n in inputs)
    while q:
        d, n = q.popleft()
        k = key(n)
        hit = k is not None and not isinstance(k, Miss)
        visits.append((d, n, hit))
        if hit:
            buckets.setdefault(k, []).append(n)
        elif d < depth:
            for m in n.all_input_nodes:
                if m not in seen:
                    seen.add(m)
                    q.append((d + 1, m))
    return visits, buckets


def greedy_rounds(nodes: list[Node], index: GraphIndex, opts: SearchOptions) -> list[tuple[list[Node], dict[str, str]]]:
    """:func:`optimus_lens.core.search.independent_subsets` (upstream's
    ``find_independent_subset_greedy``) on an unchanged graph, recording each round's
    subset and why every other candidate waited: (subset, node name -> reason) per round."""
    out = []
    node_list = [n for n in dict.fromkeys(nodes) if not n._erased]
    while node_list:
        members = set(node_list)
        floor = min(index.level[n] for n in node_list)
        memo: dict = {}
        subset, chosen, chosen_deps, nxt = [], set(), set(), []
        why: dict[str, str] = {}
        for n in node_list:
            if len(subset) >= opts.max_fuse_set_size:
                nxt.append(n)
                why[n.name] = f"the subset is full ({opts.max_fuse_set_size})"
                continue
            if n in chosen_deps:
                nxt.append(n)
                why[n.name] = "a chosen member depends on it"
                continue
            deps = _ancestors_in(n, members, floor, index.level, memo)
            if chosen.isdisjoint(deps):
                subset.append(n)
                chosen.add(n)
                chosen_deps |= deps
            else:
                nxt.append(n)
                why[n.name] = f"depends on chosen {', '.join(sorted(_names(deps & chosen)))}"
        out.append((subset, why))
        node_list = nxt
        if len(subset) < opts.min_fuse_set_size and not nxt:
            break
    return out


def upstream_frames(gm: GraphModule, pattern: BatchPattern, opts: SearchOptions) -> Search:
    """Upstream's bounded search (``--search upstream``) replayed on ``gm``: the roots in the
    engine's order (from the output backwards; getitems and placeholders are no roots),
    the first root whose breadth-first walk over producers (at most
    ``max_fuse_search_depth`` hops, stopping at matches) finds a bucket of at least
    ``min_fuse_set_size`` nodes; its depth rings, its buckets by group key, and the
    greedy split of each large bucket into independent subsets."""
    key = _key(pattern)
    frames: list[Frame] = []
    root, visits, buckets = None, [], {}
    with graph_unchanged():
        node = gm.graph.output_node()
        while node.op != "root":
            if is_search_root(node):
                v, b = bfs_rings(node, key, opts.max_fuse_search_depth)
                if any(len(ms) >= opts.min_fuse_set_size for ms in b.values()):
                    root, visits, buckets = node, v, b
                    break
            node = node.prev
    if root is None:
        classes, left = _candidates(gm, pattern)
        frames = _class_frames(classes, left, opts)
        frames.append(
            Frame(
                "No root",
                f"No search root sees {opts.min_fuse_set_size} candidates of one key within "
                f"{opts.max_fuse_search_depth} producer hops.",
                left_out=left,
            )
        )
        return Search("upstream", frames, [])
    depth_max = max(d for d, _, _ in visits)
    for d in range(1, depth_max + 1):
        shown = [(dd, n, hit) for dd, n, hit in visits if dd <= d]
        marks = {root.name: 0}
        for dd, n, _hit in shown:
            marks[n.name] = dd
        labels = ["search root"] + [f"{k} hop{'s' * (k > 1)}" for k in range(1, d + 1)]
        hits = [n.name for dd, n, hit in visits if dd == d and hit]
        walked = [n.name for dd, n, hit in visits if dd == d and not hit]
        frames.append(
            Frame(
                f"Ring {d} from {root.name}",
                f"{d} producer hop(s) from root {root.name}: "
                f"{len(hits)} candidate(s) found ({', '.join(hits) or 'none'}; a candidate is not walked "
                f"through), {len(walked)} other node(s) walked through"
                + (
                    f" (the walk stops at {opts.max_fuse_search_depth} hops)."
                    if d == opts.max_fuse_search_depth
                    else "."
                ),
                marks,
                labels,
            )
        )
    marks, labels, lines = {}, [], []
    for i, (k, ms) in enumerate(buckets.items()):
        labels.append(f"bucket {i + 1} ({len(ms)})")
        marks.update({n.name: i for n in ms})
        size = "" if len(ms) >= opts.min_fuse_set_size else f": too small, a group needs {opts.min_fuse_set_size}"
        lines.append(f"bucket {i + 1} ({len(ms)} nodes{size}), key {_short(repr(k))}")
    frames.append(Frame("Bucketed by group key", "; ".join(lines), marks, labels))
    index = GraphIndex(gm.graph)
    groups: list[list[str]] = []
    for ms in buckets.values():
        if len(ms) < opts.min_fuse_set_size:
            continue
        for subset, why in greedy_rounds(ms, index, opts):
            ok = len(subset) >= opts.min_fuse_set_size
            if ok:
                groups.append(_names(subset))
            frames.append(
                Frame(
                    f"Greedy round: {'group ' + str(len(groups)) if ok else 'too few'}",
                    f"First fit in candidate order: take a node unless it depends on a node taken or a "
                    f"node taken depends on it. Taken: {', '.join(_names(subset))}"
                    + ("" if ok else f" (fewer than {opts.min_fuse_set_size}: dropped, as upstream does)")
                    + ".",
                    {n.name: 0 for n in subset},
                    ["taken" if ok else "too few"],
                    why,
                    [list(g) for g in groups],
                )
            )
    return Search("upstream", frames, groups, root.name)


def search_frames(gm: GraphModule, pattern: BatchPattern, search: str | None = None) -> Search:
    """The search of ``pattern`` over ``gm`` as frames: the default global search, or
    upstream's bounded search with ``search="upstream"``. ``gm`` is not changed."""
    opts = _opts(pattern, search)
    return upstream_frames(gm, pattern, opts) if opts.search == "upstream" else global_frames(gm, pattern, opts)


# ----------------------------------------------------------------------------- exercises


def _depend_last(gm: GraphModule, sites: list[str]) -> tuple[str, list[str], str]:
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
    change, _, _ = _depend_last(gm, sites)
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


# ----------------------------------------------------------------------------- the walk


def _gain(
    before: GraphModule, after: GraphModule, inputs: tuple, repeats: int, warmup: int, threads: int | None = 1
) -> Gain:
    """Both graphs timed by :func:`optimus_lens.perf.bench.measure` on the CPU with ``threads`` torch
    threads (restored after; None: as set). One thread is the default: the teaching models
    are tiny, and on a loaded machine a multi-threaded kernel's thread pool waits for cores
    (a 6 x 8 x 16 bmm measured 20 ms with 2 threads at load 8, 3 us with one), which would
    teach the machine's load, not the pattern; one thread is timed by its CPU time."""
    old = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        res = measure(
            [Stage("before", before, inputs, "baseline"), Stage("after", after, inputs, "pass")],
            repeats=repeats,
            warmup=warmup,
            device="cpu",
        )
    finally:
        torch.set_num_threads(old)
    b, a = res.stages
    return Gain(
        sum(1 for _ in before.graph.nodes),
        sum(1 for _ in after.graph.nodes),
        (b.median_ms, b.p10_ms, b.p90_ms),
        (a.median_ms, a.p10_ms, a.p90_ms),
        b.peak_bytes,
        a.peak_bytes,
        b.peak_source,
        res.method,
        res.device,
        repeats,
    )


def _anchors(gm: GraphModule, pattern: Pattern) -> dict[str, str | None]:
    out = {}
    with graph_unchanged():
        for n in gm.graph.nodes:
            if n.op not in ("call_function", "call_method"):
                continue
            if pattern.anchors and n.target not in pattern.anchors:
                continue
            try:
                out[n.name] = why_not(pattern, n)
            except Exception as e:  # noqa: BLE001 - a raising pattern is itself the answer
                out[n.name] = f"raised {type(e).__name__}: {e}"
    return out


def _why_sites(gm: GraphModule, pattern: Pattern, sites: list[str]) -> str:
    """Why a step's sites went together, read on the graph before: the group key the
    members share (a batch pattern) or the anchor node whose ``match`` returned the site."""
    by = {n.name: n for n in gm.graph.nodes}
    if isinstance(pattern, BatchPattern):
        with graph_unchanged():
            k = pattern.key(by[sites[0]]) if sites[0] in by else None
        return (
            f"all {len(sites)} share the group key {_short(repr(k))} and none depends on another"
            if k is not None and not isinstance(k, Miss)
            else ""
        )
    return f"{pattern.name}.match({sites[0]}) returned these nodes: the anchor and the rest of its match"


def _fmt_ms(t: tuple[float, float, float]) -> str:
    return f"{t[0]:.3f} ms (p10-p90 {t[1]:.3f}-{t[2]:.3f})"


def _slides(w: Walkthrough) -> list[Slide]:
    words = (
        "a batch (horizontal) fusion: independent nodes of one kind become one"
        if w.kind == "batch"
        else "a rewrite (vertical): one pattern of connected nodes becomes another"
    )
    slides = [
        Slide(
            "before",
            f"{w.pattern}: what it looks for",
            [
                w.description,
                f"Kind: {words}.",
                "It fires only where all of these hold:",
                *[f"• {p}" for p in w.preconditions],
                f"Teaching model: {w.model} — {w.model_description}",
                f"Upstream counterpart: {w.upstream or '(none)'}; defined at {w.source}.",
            ],
        )
    ]
    if w.search is not None:
        slides.append(
            Slide(
                "search",
                f"The search ({w.search.mode})",
                [
                    f"{len(w.search.frames)} frames: scrub them to follow the search step by step.",
                    f"Groups handed to the fusion: {'; '.join(', '.join(g) for g in w.search.groups) or 'none'}.",
                ],
            )
        )
        if w.dependent is not None:
            slides.append(
                Slide(
                    "dependent",
                    "A member that depends on another",
                    [
                        f"The same search on a variant where {w.dependent.change}.",
                        f"Groups: {'; '.join(', '.join(g) for g in w.dependent.groups) or 'none'}.",
                    ],
                )
            )
    else:
        hits = [n for n, r in w.anchors.items() if r is None]
        slides.append(
            Slide(
                "search",
                "Where it looks",
                [
                    f"{len(w.anchors)} anchor node(s) (the targets the pattern can start from); "
                    f"{len(hits)} match: {', '.join(hits) or 'none'}.",
                    *[f"• {n}: {'matches' if r is None else r}" for n, r in w.anchors.items()],
                ],
            )
        )
    match = []
    for i, s in enumerate(w.sites, 1):
        match.append(f"Step {i}: sites {', '.join(s)}")
        if i <= len(w.why_sites):
            match.append(f"• {w.why_sites[i - 1]}")
    slides.append(Slide("match", "The match", match or ["No step."]))
    prov = [f"{o} → {n}" for s in w.trace.steps for o, n in s.replaced.items()]
    created = [c for s in w.trace.steps for c in s.created]
    slides.append(
        Slide(
            "after",
            "The graph after",
            [
                f"{w.trace.nodes_before} → {w.trace.nodes_after} nodes.",
                f"Created: {', '.join(created) or 'none'}.",
                f"Provenance (replaced → replacement): {', '.join(prov) or 'none'}.",
            ],
        )
    )
    if w.gain is not None:
        g = w.gain
        slides.append(
            Slide(
                "gain",
                "What it bought",
                [
                    f"Nodes: {g.nodes_before} → {g.nodes_after}.",
                    f"Latency before: {_fmt_ms(g.before_ms)}; after: {_fmt_ms(g.after_ms)} — "
                    f"{g.speedup:.2f}x, measured here ({g.device}, {g.method}, {g.repeats} samples each, "
                    f"round-robin in one run). Overlapping spreads mean no measurable difference.",
                    f"Peak memory ({g.peak_source}): {g.peak_before:,} → {g.peak_after:,} bytes.",
                ],
            )
        )
    if w.exercise is not None:
        e = w.exercise
        slides.append(Slide("exercise", "Exercise: why not?", [f"The variant: {e.change}.", e.question]))
    return slides


def walkthrough(
    pattern_name: str,
    repeats: int = 7,
    warmup: int = 2,
    timing: bool = True,
    search: str | None = None,
    threads: int | None = 1,
) -> Walkthrough:
    """The walk through ``pattern_name`` on its teaching model (see the module docstring).

    ``repeats``/``warmup``: samples per graph for the latency figures (``timing`` False
    leaves them out: ``gain`` None; ``threads``: CPU threads while timing, see
    :func:`_gain`). ``search`` ("global" or "upstream") picks which
    search a batch pattern's frames replay (default: the pattern's own, global).
    Raises TeachError for an unknown pattern or one no teaching model teaches."""
    from optimus_lens.frontend.capture import capture
    from optimus_lens.frontend.run import model_and_inputs

    pattern = _pattern(pattern_name)
    model_name = teaching_model(pattern_name)
    from optimus_lens import sample_models

    model, inputs, _ = model_and_inputs("sample:" + model_name)
    cap = capture(model, tuple(inputs))
    before = copy_graph_module(cap.gm)
    search_data = search_frames(before, pattern, search) if isinstance(pattern, BatchPattern) else None
    anchors = {} if isinstance(pattern, BatchPattern) else _anchors(before, pattern)
    pipe = lesson_pipeline(pattern)
    if search is not None and isinstance(pattern, BatchPattern):
        pipe = Pipeline([Pass(pattern.name, [pattern], options=_opts(pattern, search))])
    eng = Engine(
        cap.gm, cap.example_inputs, pipe, RunOptions(verify="end"), model_name=model_name, capture_info=cap.info()
    )
    trace = eng.run()
    after = eng.gm
    gain = _gain(before, after, cap.example_inputs, repeats, warmup, threads) if timing and trace.steps else None
    w = Walkthrough(
        pattern.name,
        pattern.kind,
        pattern.description,
        list(pattern.preconditions),
        pattern.upstream,
        pattern.source,
        model_name,
        sample_models.REGISTRY[model_name].description,
        trace,
        [list(s.sites) for s in trace.steps if s.error is None],
        search_data,
        anchors,
        dependent_search(before, pattern, trace.steps[0].sites, search)
        if search_data is not None and trace.steps
        else None,
        why_sites=[_why_sites(before, pattern, s.sites) for s in trace.steps if s.error is None],
        gain=gain,
        exercise=exercise(pattern, before, after, trace),
    )
    w.slides = _slides(w)
    return w
