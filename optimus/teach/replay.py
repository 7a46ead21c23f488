"""A batch pattern's search replayed as the frames a learner scrubs.

The frames are recorded, not recomputed: :func:`search_frames` runs the engine's own
search functions of :mod:`optimus_lens.core.search` on the unchanged graph with an
observer (:class:`optimus_lens.core.search.SearchObserver`) and turns what they report
into :class:`~optimus_lens.teach.data.Frame`\\ s. The default global search:
:func:`~optimus_lens.core.search.key_classes` (the candidates and the nodes left out, with
the reason), the member depths each round of
:func:`~optimus_lens.core.search.global_groups` splits a class by, and the groups it
yields. Upstream's bounded search: the visits of
:func:`~optimus_lens.core.search.fusion_candidates` from the first root that finds a large
enough bucket, and every round of :func:`~optimus_lens.core.search.independent_subsets`
with why each other candidate waited.

The engine fuses each group before asking for the next; a replay cannot change the
graph, so a member of a group counts as gone instead (``still``).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from torch.fx import GraphModule, Node

from optimus_lens.core.index import GraphIndex
from optimus_lens.core.memo import graph_unchanged
from optimus_lens.core.miss import Miss
from optimus_lens.core.pattern import BatchPattern, SearchOptions
from optimus_lens.core.search import (
    UNUSED,
    SearchObserver,
    fusion_candidates,
    global_groups,
    independent_subsets,
    is_search_root,
    key_classes,
)
from optimus_lens.teach.data import Frame, Search
from optimus_lens.teach.lookup import search_options

KEY_TEXT = 90  # characters of a group key shown before "..."


def key_text(key: object) -> str:
    """``repr(key)``, cut to ``KEY_TEXT`` characters (ending "...") when longer."""
    text = repr(key)
    return text if len(text) <= KEY_TEXT else text[: KEY_TEXT - 3] + "..."


def _names(nodes: Iterable[Node]) -> list[str]:
    return [n.name for n in nodes]


class _Recorder(SearchObserver):
    """What the search functions report, kept for the frames. ``anchored``: the pattern
    names its anchor targets, so every anchor node left out is shown with the pattern's
    reason (otherwise only candidates left out for having no users are: every other
    node of the graph has no key)."""

    def __init__(self, anchored: bool):
        self.anchored = anchored
        self.left: dict[str, str] = {}
        self.classes: dict[Hashable, list[Node]] = {}
        self.visits: list[tuple[int, Node, bool]] = []
        self.rounds: list[tuple[list[Node], dict[str, str]]] = []
        self.depths: list[tuple[dict[Node, int], dict[Node, frozenset[Node]]]] = []

    def on_left_out(self, node: Node, reason: Miss) -> None:
        if self.anchored or reason is UNUSED:
            self.left[node.name] = str(reason)

    def on_classes(self, classes: dict[Hashable, list[Node]]) -> None:
        self.classes = classes

    def on_visit(self, depth: int, node: Node, key: Hashable | None) -> None:
        self.visits.append((depth, node, key is not None))

    def on_round(self, subset: list[Node], waiting: dict[Node, str]) -> None:
        self.rounds.append((subset, {n.name: why for n, why in waiting.items()}))

    def on_depths(self, depths: dict[Node, int], above: dict[Node, frozenset[Node]]) -> None:
        self.depths.append((depths, above))


def _searched(gm: GraphModule, pattern: BatchPattern) -> list[Node]:
    """The nodes the global search keys, in graph order: those with an anchor target when
    the pattern names anchors, else all."""
    anchors = pattern.anchors
    if not anchors:
        return list(gm.graph.nodes)
    return [n for n in gm.graph.nodes if n.op in ("call_function", "call_method") and n.target in anchors]


def _classes(gm: GraphModule, pattern: BatchPattern, index: GraphIndex, opts: SearchOptions):
    """:func:`~optimus_lens.core.search.key_classes` observed: the classes large enough to
    fuse, in the engine's order, and the recorder holding every class and the nodes left out."""
    rec = _Recorder(bool(pattern.anchors))
    with graph_unchanged():
        todo = key_classes(_searched(gm, pattern), pattern.key, index, opts, rec)
    return todo, rec


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
        lines.append(f"class {i + 1} ({len(ms)} nodes{size}), key {key_text(k)}")
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


def _layers_frame(depths: dict[Node, int], above: dict[Node, frozenset[Node]]) -> tuple[Frame, dict[str, str]]:
    """The frame of one round's member depths, and each dependent member's reason."""
    order = sorted(set(depths.values()))
    labels = [f"depth {d} ({sum(1 for v in depths.values() if v == d)} members)" for d in order]
    marks, dep_left = {}, {}
    for n, d in depths.items():
        marks[n.name] = order.index(d)
        if d:
            up = above[n]
            dep_left[n.name] = (
                f"depends on {', '.join(sorted(_names(up)))}, so it cannot be in a group with "
                f"{'it' if len(up) == 1 else 'them'}"
            )
    frame = Frame(
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
    return frame, dep_left


def global_frames(gm: GraphModule, pattern: BatchPattern, opts: SearchOptions) -> Search:
    """The default global search replayed on ``gm`` (unchanged): the key classes
    :func:`~optimus_lens.core.search.key_classes` builds, then per class large enough the
    member depths of the first round of :func:`~optimus_lens.core.search.global_groups`
    (equal depths are independent) and each group it yields, a member of a group
    counting as gone."""
    index = GraphIndex(gm.graph)
    todo, rec = _classes(gm, pattern, index, opts)
    frames = _class_frames(rec.classes, rec.left, opts)
    groups: list[list[str]] = []
    taken: set[Node] = set()
    for _, members in todo:
        rec.depths = []
        found: list[list[str]] = []
        for g in global_groups(members, index, opts, lambda n: n not in taken, rec):
            taken.update(g)
            found.append(_names(g))
        frame, dep_left = _layers_frame(*rec.depths[0])  # the class's first round, before any group
        frames.append(frame)
        for names in found:
            groups.append(names)
            out = [n for n in dep_left if n not in names]
            frames.append(
                Frame(
                    f"Group {len(groups)}",
                    f"{len(names)} mutually independent members fuse as one step: {', '.join(names)}."
                    + (f" Left out: {', '.join(out)} (depends on a member)." if out else ""),
                    {x: 0 for x in names},
                    [f"group {len(groups)}"],
                    {n: r for n, r in dep_left.items() if n not in names},
                    [list(x) for x in groups],
                )
            )
    if not groups:
        frames.append(
            Frame(
                "No group",
                f"No key class has {opts.min_fuse_set_size} mutually independent members.",
                left_out=dict(rec.left),
            )
        )
    return Search("global", frames, groups)


def upstream_frames(gm: GraphModule, pattern: BatchPattern, opts: SearchOptions) -> Search:
    """Upstream's bounded search (``--search upstream``) replayed on ``gm``: the roots in the
    engine's order (from the output backwards; getitems and placeholders are no roots),
    the first root whose breadth-first walk over producers
    (:func:`~optimus_lens.core.search.fusion_candidates`: at most ``max_fuse_search_depth``
    hops, stopping at matches) finds a bucket of at least ``min_fuse_set_size`` nodes; its
    depth rings, its buckets by group key, and each round of
    :func:`~optimus_lens.core.search.independent_subsets` on each large bucket."""
    root, rec, buckets = None, _Recorder(bool(pattern.anchors)), {}
    with graph_unchanged():
        for node in reversed(gm.graph.nodes):
            if not is_search_root(node):
                continue
            seen = _Recorder(bool(pattern.anchors))
            found = fusion_candidates(node, pattern.key, opts.max_fuse_search_depth, observer=seen)
            if any(len(ms) >= opts.min_fuse_set_size for ms in found.values()):
                root, rec, buckets = node, seen, found
                break
    index = GraphIndex(gm.graph)
    if root is None:
        _, rec = _classes(gm, pattern, index, opts)
        frames = _class_frames(rec.classes, rec.left, opts)
        frames.append(
            Frame(
                "No root",
                f"No search root sees {opts.min_fuse_set_size} candidates of one key within "
                f"{opts.max_fuse_search_depth} producer hops.",
                left_out=rec.left,
            )
        )
        return Search("upstream", frames, [])
    frames = _ring_frames(root, rec.visits, opts)
    marks, labels, lines = {}, [], []
    for i, (k, ms) in enumerate(buckets.items()):
        labels.append(f"bucket {i + 1} ({len(ms)})")
        marks.update({n.name: i for n in ms})
        size = "" if len(ms) >= opts.min_fuse_set_size else f": too small, a group needs {opts.min_fuse_set_size}"
        lines.append(f"bucket {i + 1} ({len(ms)} nodes{size}), key {key_text(k)}")
    frames.append(Frame("Bucketed by group key", "; ".join(lines), marks, labels))
    groups: list[list[str]] = []
    for ms in buckets.values():
        if len(ms) < opts.min_fuse_set_size:
            continue
        rec.rounds = []
        for _ in independent_subsets(ms, index, opts, rec):
            pass  # a replay fuses nothing: the rounds are what the observer saw
        for subset, why in rec.rounds:
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


def _ring_frames(root: Node, visits: list[tuple[int, Node, bool]], opts: SearchOptions) -> list[Frame]:
    """One frame per producer hop from ``root``: the nodes visited up to it, the
    candidates found at it and the nodes walked through."""
    frames = []
    for d in range(1, max(d for d, _, _ in visits) + 1):
        marks = {root.name: 0}
        for dd, n, _hit in visits:
            if dd <= d:
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
    return frames


def search_frames(gm: GraphModule, pattern: BatchPattern, search: str | None = None) -> Search:
    """The search of ``pattern`` over ``gm`` as frames: the default global search, or
    upstream's bounded search with ``search="upstream"``. ``gm`` is not changed."""
    opts = search_options(pattern, search)
    return upstream_frames(gm, pattern, opts) if opts.search == "upstream" else global_frames(gm, pattern, opts)
