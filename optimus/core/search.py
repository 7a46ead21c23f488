"""Greedy candidate search and independent-subset grouping for BatchPatterns.

The algorithm is upstream's (torch/_inductor/fx_passes/group_batch_fusion.py:
``apply_group_batch_fusion``, ``get_fusion_candidates``,
``find_independent_subset_greedy``): roots in reverse topological order; from each, a
breadth-first search over producers up to ``max_fuse_search_depth`` buckets the
matching nodes by group key (matches are not expanded); each bucket is packed greedily,
first fit, into anti-chains (no member depends on another) of at most
``max_fuse_set_size``; anti-chains of at least ``min_fuse_set_size`` are fused, the
caller fusing each before the next is formed.

What differs is the bookkeeping, which keeps the search near-linear:

* :class:`GraphIndex` keeps two numberings up to date after each step instead of
  re-walking the graph: ``pos`` (list order, with gaps, so inserts and moves renumber
  locally) and ``level`` (a height function: every edge goes from a lower to a higher
  level, spaced by ``LEVEL_SLACK`` so a fusion's new chain fits under its users without
  relabelling them).
* An ancestor query never walks below the lowest level of the bucket it is asked
  about, and reuses its work across the bucket (memoised per round). Upstream walks all
  ancestors of every candidate.
* After a step, :meth:`GraphIndex.repair` moves only the nodes that now precede one of
  their inputs, so the graph stays topologically valid after every step without a sort.
* :class:`KeyCache` computes each node's group key once per pass;
  :class:`CandidateSearch` shares the search below single-input chains between roots;
  :func:`downstream` finds the roots whose search a step can have changed, so the
  engine re-searches only those (see ``Engine._run_pass``).
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator

from torch.fx import Graph, Node

from optimus_lens.core.pattern import Miss, SearchOptions

GAP = 1 << 32  # spacing of positions after a (re)numbering
SPREAD = 1 << 12  # a relabelled window leaves at least this much room between neighbours
LEVEL_SLACK = 16


class GraphIndex:
    """Position and level of every live node of ``graph``.

    ``pos[n]`` increases along the node list; ``level[n] > level[i]`` for every input
    ``i`` of ``n``. Call :meth:`update` after each step with the nodes it created,
    erased and rewired.

    Positions are integers with gaps (order-maintenance labels): a node placed between
    two neighbours takes the midpoint; when there is no room, only a window of list
    neighbours is relabelled evenly, the smallest (doubling) whose label range leaves
    ``SPREAD`` between them, so many inserts at one spot relabel a few nodes now and
    then instead of renumbering the graph. ``renumbers`` counts whole-graph
    renumberings (only the first, today), ``relabels`` local ones and ``relabelled`` the
    nodes they relabelled.
    """

    def __init__(self, graph: Graph):
        self.graph = graph
        self.pos: dict[Node, int] = {}
        self.level: dict[Node, int] = {}
        self.renumbers = 0
        self.relabels = 0
        self.relabelled = 0
        self._renumber()
        level = self.level
        for n in graph.nodes:
            level[n] = max((level[i] for i in n.all_input_nodes), default=-LEVEL_SLACK) + LEVEL_SLACK

    def _renumber(self) -> None:
        self.renumbers += 1
        for i, n in enumerate(self.graph.nodes):
            self.pos[n] = (i + 1) * GAP

    def _place(self, n: Node) -> None:
        """Give ``n`` a position between its list neighbours (which must be placed)."""
        p, q = n.prev, n.next
        lo = 0 if p.op == "root" else self.pos[p]
        if q.op == "root":
            self.pos[n] = lo + GAP
            return
        hi = self.pos[q]
        if hi - lo >= 2:
            self.pos[n] = (lo + hi) // 2
        else:
            self._spread(n, n)

    def _spread(self, first: Node, last: Node) -> None:
        """Relabel the nodes from ``first`` to ``last`` (a contiguous run of the list, not
        necessarily placed) and as few neighbours as needed, evenly, leaving at least
        ``SPREAD`` between consecutive labels."""
        pos = self.pos
        count = 1
        m = first
        while m is not last:
            m = m.next
            count += 1
        grow = max(count, 8)
        while True:
            # widen the window by ``grow`` placed neighbours on each side
            for _ in range(grow):
                if first.prev.op == "root":
                    break
                first = first.prev
                count += 1
            for _ in range(grow):
                if last.next.op == "root":
                    break
                last = last.next
                count += 1
            # the window's bounds must be placed nodes (or the list's ends)
            while first.prev.op != "root" and first.prev not in pos:
                first = first.prev
                count += 1
            while last.next.op != "root" and last.next not in pos:
                last = last.next
                count += 1
            lo = 0 if first.prev.op == "root" else pos[first.prev]
            if last.next.op == "root":  # the end of the list has room for anything
                hi = lo + (count + 1) * GAP
                break
            hi = pos[last.next]
            if hi - lo >= (count + 1) * SPREAD:
                break
            grow *= 2
        self.relabels += 1
        self.relabelled += count
        step = (hi - lo) // (count + 1)
        m = first
        for k in range(1, count + 1):
            pos[m] = lo + k * step
            m = m.next

    def update(self, created: Iterable[Node], erased: Iterable[Node], rewired: Iterable[Node]) -> int:
        """Bring the index up to date after one step and repair the list order.

        Created nodes get a position from their neighbours and a level from their inputs;
        then :meth:`repair` moves every created or rewired node that precedes an input.
        Returns the number of nodes moved.
        """
        pos = self.pos
        for n in erased:
            pos.pop(n, None)
            self.level.pop(n, None)
        created = [n for n in created if not n._erased]
        # place runs of new nodes between placed neighbours, in list order
        for n in created:
            if n in pos:
                continue
            first = n
            while first.prev.op != "root" and first.prev not in pos:
                first = first.prev
            run = []
            m = first
            while m.op != "root" and m not in pos:
                run.append(m)
                m = m.next
            lo = 0 if first.prev.op == "root" else pos[first.prev]
            if m.op == "root":
                for k, r in enumerate(run):
                    pos[r] = lo + (k + 1) * GAP
            elif pos[m] - lo > len(run):
                step = (pos[m] - lo) // (len(run) + 1)
                for k, r in enumerate(run):
                    pos[r] = lo + (k + 1) * step
            else:
                self._spread(run[0], run[-1])
        for n in created:
            self._set_level(n)
        return self.repair([*created, *(r for r in rewired if not r._erased)])

    def _set_level(self, n: Node) -> None:
        stack = [n]
        level = self.level
        while stack:
            m = stack[-1]
            missing = [i for i in m.all_input_nodes if i not in level]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            if m not in level:
                level[m] = max((level[i] for i in m.all_input_nodes), default=-1) + 1

    def repair(self, nodes: Iterable[Node]) -> int:
        """Restore a topological list order and the level invariant after a step.

        Order: nodes are taken first in, first out from ``nodes``; one that precedes its
        latest input is moved to just after that input, and its users are queued
        (forward moves only, so this terminates). Levels: a node not above all of its
        inputs is raised to one more than the highest, and its users are re-checked.
        Returns the number of moves."""
        pos, level = self.pos, self.level
        nodes = list(nodes)
        moved: list[Node] = []
        work = deque(nodes)
        for v, inputs in _with_inputs(work):
            latest = max(inputs, key=pos.__getitem__)
            if pos[latest] >= pos[v]:
                latest.append(v)
                self._place(v)
                moved.append(v)
                work.extend(v.users)
        work = deque(nodes)
        work.extend(moved)
        for v, inputs in _with_inputs(work):
            top = max(level[i] for i in inputs)
            if level[v] <= top:
                level[v] = top + 1
                work.extend(v.users)
        return len(moved)

    def check(self) -> None:
        """Assert both numberings are consistent with the graph (tests call this)."""
        last = -1
        count = 0
        for n in self.graph.nodes:
            count += 1
            assert self.pos[n] > last, f"pos out of order at {n}"
            last = self.pos[n]
            for i in n.all_input_nodes:
                assert self.pos[i] < self.pos[n], f"{i} is after its user {n}"
                assert self.level[i] < self.level[n], f"level of {i} >= level of its user {n}"
        assert count == len(self.pos) == len(self.level), "index holds erased nodes"


def _with_inputs(work: deque) -> Iterator[tuple[Node, list[Node]]]:
    """Pop ``work`` first in, first out (the caller may append while iterating), yielding
    each live node that has inputs, with its inputs."""
    while work:
        v = work.popleft()
        if v._erased or v.op == "root":
            continue
        inputs = v.all_input_nodes
        if inputs:
            yield v, inputs


KeyFn = Callable[[Node], "Hashable | Miss"]


def fusion_candidates(root: Node, key: KeyFn, depth: int, exclude_getitem: bool = True) -> dict[Hashable, list[Node]]:
    """Nodes within ``depth`` producer hops of ``root`` bucketed by group key, in BFS
    order (nearest first, then argument order). Matching nodes are not expanded; a
    getitem root yields nothing (upstream's ``SEARCH_EXCLUSIONS``) unless
    ``exclude_getitem`` is False."""
    if exclude_getitem and root.op == "call_function" and root.target is operator.getitem:
        return {}
    buckets: dict[Hashable, list[Node]] = {}
    inputs = root.all_input_nodes
    seen = set(inputs)
    q = deque((1, n) for n in inputs)
    while q:
        d, n = q.popleft()
        k = key(n)
        if k is not None and not isinstance(k, Miss):
            buckets.setdefault(k, []).append(n)
        elif d < depth:
            for m in n.all_input_nodes:
                if m not in seen:
                    seen.add(m)
                    q.append((d + 1, m))
    return buckets


def is_search_root(n: Node) -> bool:
    """False for the nodes a sweep never searches from: getitems (upstream's
    ``SEARCH_EXCLUSIONS``) and placeholders (they have no producers)."""
    return not (n.op == "placeholder" or (n.op == "call_function" and n.target is operator.getitem))


class KeyCache(dict):
    """``key(node)`` of one BatchPattern, memoised: a group key, or None where the
    pattern does not match (a :class:`Miss` is stored as None). ``cache[n]`` computes on
    first use; :meth:`forget` drops the entries of nodes whose key may have changed.
    ``counts`` holds how many cached nodes share each key."""

    def __init__(self, key: KeyFn):
        super().__init__()
        self.key = key
        self.counts: dict[Hashable, int] = {}

    def __missing__(self, n: Node):
        k = self.key(n)
        if isinstance(k, Miss):
            k = None
        self[n] = k
        if k is not None:
            self.counts[k] = self.counts.get(k, 0) + 1
        return k

    def forget(self, nodes: Iterable[Node]) -> None:
        for n in nodes:
            k = self.pop(n, None)
            if k is not None:
                self.counts[k] -= 1


def downstream(sources: Iterable[Node], key: Callable[[Node], object], depth: int) -> set[Node]:
    """Every node whose :func:`fusion_candidates` search (same ``key`` and ``depth``)
    examines one of ``sources``: the users of a source, and their users through
    non-matching nodes, up to ``depth`` hops (a multi-source breadth-first walk towards
    consumers: the search run backwards). O(nodes and edges walked)."""
    dist: dict[Node, int] = {}
    out: set[Node] = set()
    q: deque = deque()
    for s in sources:
        if s not in dist and not s._erased:
            dist[s] = 0
            q.append(s)
    while q:
        n = q.popleft()
        d = dist[n] + 1
        for u in n.users:
            out.add(u)  # also a source: it may see another source
            if u in dist:
                continue
            dist[u] = d
            if d < depth and key(u) is None:
                q.append(u)
    return out


class CandidateSearch:
    """:func:`fusion_candidates` for one key and depth, sharing work between roots.

    A node with a single input that does not match searches exactly what that input
    would search with one hop less (same nodes, same order), so those results are
    memoised per (node, hops left): the many roots below one wide node (e.g. the users
    of an ``unbind``'s getitems, all behind one ``stack`` of 300 inputs) search it once.
    Call :meth:`forget` with every node whose search range changed (see
    :func:`downstream`). The returned buckets are shared: do not mutate them."""

    def __init__(self, key: Callable[[Node], object], depth: int):
        self.key = key
        self.depth = depth
        self.memo: dict[tuple[Node, int], dict] = {}

    def __call__(self, root: Node) -> dict[Hashable, list[Node]]:
        if root.op == "call_function" and root.target is operator.getitem:
            return {}
        return self._search(root, self.depth)

    def _search(self, x: Node, depth: int) -> dict[Hashable, list[Node]]:
        inputs = x.all_input_nodes
        if len(inputs) != 1:
            return fusion_candidates(x, self.key, depth, exclude_getitem=False)
        (i,) = inputs
        k = self.key(i)
        if k is not None and not isinstance(k, Miss):
            return {k: [i]}
        if depth <= 1:
            return {}
        got = self.memo.get((i, depth - 1))
        if got is None:
            got = self.memo[(i, depth - 1)] = self._search(i, depth - 1)
        return got

    def forget(self, nodes: Iterable[Node]) -> None:
        memo = self.memo
        if not memo:
            return
        for n in nodes:
            for d in range(1, self.depth):
                memo.pop((n, d), None)


def _ancestors_in(
    n: Node, members: set[Node], floor: int, level: dict[Node, int], memo: dict[Node, frozenset]
) -> frozenset:
    """Members of ``members`` that are strict ancestors of ``n``. Walks only nodes above
    level ``floor`` (the bucket's lowest level: nothing below it can reach a member);
    ``memo`` holds the answer for every node walked, reused by later queries."""
    stack = [n]
    while stack:
        m = stack[-1]
        if m in memo:
            stack.pop()
            continue
        pending = [i for i in m.all_input_nodes if i not in memo and level[i] >= floor]
        if pending:
            stack.extend(pending)
            continue
        stack.pop()
        acc: set[Node] = set()
        for i in m.all_input_nodes:
            if level[i] < floor:
                continue
            if i in members:
                acc.add(i)
            acc |= memo[i]
        memo[m] = frozenset(acc)
    return memo[n]


def independent_subsets(nodes: list[Node], index: GraphIndex, opts: SearchOptions) -> Iterator[list[Node]]:
    """Greedy first-fit anti-chains of ``nodes`` (upstream's
    ``find_independent_subset_greedy``): each yielded list has between
    ``min_fuse_set_size`` and ``max_fuse_set_size`` members, none an ancestor of
    another, in candidate order. The caller may fuse each subset before asking for the
    next: dependencies are recomputed on the mutated graph. Nodes of a round that
    formed too small a subset are dropped, as upstream does. Erased nodes are skipped."""
    node_list = [n for n in dict.fromkeys(nodes) if not n._erased]
    while node_list:
        members = set(node_list)
        floor = min(index.level[n] for n in node_list)
        memo: dict[Node, frozenset] = {}
        subset: list[Node] = []
        chosen: set[Node] = set()
        chosen_deps: set[Node] = set()
        next_round: list[Node] = []
        for n in node_list:
            if len(subset) >= opts.max_fuse_set_size or n in chosen_deps:
                next_round.append(n)
                continue
            deps = _ancestors_in(n, members, floor, index.level, memo)
            if chosen.isdisjoint(deps):
                subset.append(n)
                chosen.add(n)
                chosen_deps |= deps
            else:
                next_round.append(n)
        if len(subset) >= opts.min_fuse_set_size:
            yield subset
            next_round = [n for n in next_round if not n._erased]
        node_list = next_round


# ----------------------------------------------------------------------------- global search

#: key classes of at most this many leftover members get an exact maximum anti-chain
EXACT_LIMIT = 256


def member_depths(members: list[Node], index: GraphIndex) -> dict[Node, int]:
    """For each of ``members``: the largest number of members on one producer path above
    it (0 for a member no other member reaches). Members of equal depth are mutually
    independent (a member above another has a smaller depth), so the depths split the
    class into anti-chains; the first (depth 0) is the set of its minimal elements.
    Walks only nodes at or above the lowest member's level; O(nodes and edges walked)."""
    level = index.level
    floor = min(level[n] for n in members)
    member = set(members)
    above: dict[Node, int] = {}  # node -> most members on a path strictly above it
    for start in members:
        stack = [start]
        while stack:
            m = stack[-1]
            if m in above:
                stack.pop()
                continue
            pending = [i for i in m.all_input_nodes if i not in above and level[i] >= floor]
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            above[m] = max((above[i] + (i in member) for i in m.all_input_nodes if level[i] >= floor), default=0)
    return {n: above[n] for n in members}


def max_antichain(members: list[Node], index: GraphIndex) -> list[Node]:
    """A largest set of mutually independent ``members`` (none an ancestor of another),
    in the order of ``members``. Dilworth's theorem via König's: a maximum matching of
    the comparability bipartite graph (member u -> member v when u is an ancestor of
    v), then the members whose left copy is reachable from an unmatched left copy by
    alternating paths and whose right copy is not. O(k * E) for k members and E
    comparable pairs."""
    if len(members) < 2:
        return list(members)
    memo: dict[Node, frozenset] = {}
    floor = min(index.level[n] for n in members)
    member = set(members)
    below: dict[Node, list[Node]] = {n: [] for n in members}  # u -> members u is an ancestor of
    for v in members:
        for u in _ancestors_in(v, member, floor, index.level, memo):
            below[u].append(v)
    match_right: dict[Node, Node] = {}  # right copy v -> left copy u matched to it
    match_left: dict[Node, Node] = {}

    def augment(u: Node, seen: set) -> bool:
        for v in below[u]:
            if v in seen:
                continue
            seen.add(v)
            if v not in match_right or augment(match_right[v], seen):
                match_right[v], match_left[u] = u, v
                return True
        return False

    for u in members:
        if below[u]:
            augment(u, set())
    # König: Z = vertices reachable from unmatched left vertices by alternating paths
    left_z = {u for u in members if u not in match_left}
    right_z: set[Node] = set()
    work = deque(left_z)
    while work:
        u = work.popleft()
        for v in below[u]:
            if v not in right_z:
                right_z.add(v)
                w = match_right.get(v)
                if w is not None and w not in left_z:
                    left_z.add(w)
                    work.append(w)
    return [n for n in members if n in left_z and n not in right_z]


def group_order(nodes: list[Node], index: GraphIndex, hops: int = 8) -> list[Node]:
    """``nodes`` in the order of what they read: each is keyed by the first getitem found
    walking up first inputs (at most ``hops``), as (its source's position, its index),
    else by the node reached; ties by position. Members that read the pieces of one
    split or unbind come out in piece order, so the fused ``stack``/``unbind`` lines up
    with its neighbours' and the split/cat cleanups cancel them (upstream gets this from
    its breadth-first walk over the consumers' arguments)."""
    pos = index.pos

    def provenance(n: Node) -> tuple:
        x = n
        for _ in range(hops):
            ins = x.all_input_nodes
            if not ins:
                break
            x = ins[0]
            if x.op == "call_function" and x.target is operator.getitem and isinstance(x.args[1], int):
                return (pos[x.args[0]], x.args[1], pos[n])
        return (pos[x], 0, pos[n])

    return sorted(nodes, key=provenance)


def chunks(group: list[Node], opts: SearchOptions) -> list[list[Node]]:
    """``group`` cut into runs of at most ``max_fuse_set_size``, as even as possible so
    that none is shorter than ``min_fuse_set_size`` (upstream cuts 300, 300, ...,
    remainder and drops a short remainder); when even runs would be too short, runs of
    ``max_fuse_set_size`` and the rest is not returned."""
    n, cap = len(group), opts.max_fuse_set_size
    parts = -(-n // cap)
    size, extra = divmod(n, parts)
    if size < opts.min_fuse_set_size:  # even parts would all be too short: full parts, the rest left over
        return [group[i : i + cap] for i in range(0, n - n % cap, cap)]
    out, at = [], 0
    for k in range(parts):
        step = size + (k < extra)
        out.append(group[at : at + step])
        at += step
    return [c for c in out if len(c) >= opts.min_fuse_set_size]


def global_groups(
    members: list[Node], index: GraphIndex, opts: SearchOptions, still: Callable[[Node], bool]
) -> Iterator[list[Node]]:
    """Groups of mutually independent nodes of one key class (``members``, any order),
    each of ``min_fuse_set_size`` to ``max_fuse_set_size`` nodes, until
    no ``min_fuse_set_size`` independent members are left. The caller fuses each group
    before asking for the next; ``still(n)`` says whether ``n`` is still a member on the
    changed graph (alive, same key).

    Round after round: the member depths (:func:`member_depths`) split the class into
    anti-chains, fused in order of depth, each large enough one whole (so the towers'
    first layers fuse together, then their second layers: fusing an anti-chain of
    minimal members adds no dependency between the members left). Members of anti-chains
    too small to fuse are left over; if enough are left, a maximum anti-chain of them
    (:func:`max_antichain`) is the next group. Classes of more than ``EXACT_LIMIT``
    leftovers get a greedy first-fit anti-chain instead of a maximum one. Each group is
    in :func:`group_order`."""
    pos = index.pos
    left = sorted((n for n in dict.fromkeys(members) if still(n)), key=pos.__getitem__)
    while len(left) >= opts.min_fuse_set_size:
        fused = False
        layers: dict[int, list[Node]] = {}
        depths = member_depths(left, index)
        for n, d in depths.items():
            layers.setdefault(d, []).append(n)
        for d in sorted(layers):
            layer = layers[d]
            if len(layer) < opts.min_fuse_set_size:
                continue
            for part in chunks(group_order(layer, index), opts):
                part = [n for n in part if still(n)]
                if len(part) >= opts.min_fuse_set_size:
                    fused = True
                    yield part
        left = sorted((n for n in left if still(n)), key=pos.__getitem__)
        if len(left) < opts.min_fuse_set_size:
            return
        if fused:
            continue
        if len(left) - max(depths.values()) < opts.min_fuse_set_size:  # nothing fused: depths still hold
            return  # a chain through max+1 members: at most len - max of them are independent
        if len(left) <= EXACT_LIMIT:
            group = max_antichain(left, index)
        else:
            group = next(independent_subsets(left, index, opts.replace(max_fuse_set_size=len(left))), [])
        if len(group) < opts.min_fuse_set_size:
            return
        for part in chunks(group_order(group, index), opts):
            part = [n for n in part if still(n)]
            if len(part) >= opts.min_fuse_set_size:
                fused = True
                yield part
        if not fused:
            return
        left = sorted((n for n in left if still(n)), key=pos.__getitem__)
