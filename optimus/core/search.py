"""The batch search: which nodes of a BatchPattern fuse together, group by group.

Both searches bucket nodes by the pattern's group key and fuse only mutually independent
nodes (none an ancestor of another); they differ in where they look.

* **The global search** (the default, ``SearchOptions.search="global"``):
  :func:`key_classes` takes every live node with users and a group key; each class of
  at least ``min_fuse_set_size`` nodes is split by :func:`global_groups` into groups of
  mutually independent members, wherever they lie: the member depths
  (:func:`member_depths`) cut the class into anti-chains, fused layer by layer, and a
  maximum anti-chain (:func:`max_antichain`, Dilworth via König) is taken from the
  leftovers.
* **Upstream's bounded search** (``search="upstream"``; torch/_inductor/fx_passes/
  group_batch_fusion.py: ``apply_group_batch_fusion``, ``get_fusion_candidates``,
  ``find_independent_subset_greedy``): roots in reverse topological order; from each, a
  breadth-first search over producers up to ``max_fuse_search_depth``
  (:func:`fusion_candidates`) buckets the matching nodes by group key (matches are not
  expanded); each bucket is packed greedily, first fit, into anti-chains of at most
  ``max_fuse_set_size`` (:func:`independent_subsets`); anti-chains of at least
  ``min_fuse_set_size`` are fused.

Either way the caller fuses each group before the next is formed. The bookkeeping keeps
the search near-linear: dependencies are read off the numberings of
:class:`optimus_lens.core.index.GraphIndex`; an ancestor query never walks below the
lowest level of the members it is asked about and reuses its work across them (upstream
walks all ancestors of every candidate); :class:`KeyCache` computes each node's group
key once per pass; :class:`CandidateSearch` shares the search below single-input chains
between roots; :func:`downstream` finds the roots whose search a step can have changed,
so the engine re-searches only those (see ``Engine._run_pass``).

A :class:`SearchObserver` passed to the search functions is told each move as it is
made (the lessons of :mod:`optimus_lens.teach.replay` are recorded this way); without
one the search computes nothing for it.
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator

from torch.fx import Node

from optimus_lens.core.index import GraphIndex
from optimus_lens.core.miss import Miss
from optimus_lens.core.pattern import SearchOptions

KeyFn = Callable[[Node], "Hashable | Miss"]

#: why :func:`key_classes` leaves a node out when its key is None (no reason given)
NO_KEY = Miss("no match")
#: why :func:`key_classes` leaves out a node with a key but no users
UNUSED = Miss("its output is unused (only nodes with users are candidates)")


class SearchObserver:
    """Told each move of a search as it is made, to show the search (a lesson's frames,
    :mod:`optimus_lens.teach.replay`); every method does nothing here. Pass one as
    ``observer`` to :func:`key_classes`, :func:`fusion_candidates`,
    :func:`independent_subsets` or :func:`global_groups`; with the default None the
    search computes nothing for it and finds the same groups either way."""

    def on_left_out(self, node: Node, reason: Miss) -> None:
        """:func:`key_classes`: ``node`` is no candidate, for ``reason`` (the key's
        :class:`Miss`, ``NO_KEY``, or ``UNUSED``)."""

    def on_classes(self, classes: dict[Hashable, list[Node]]) -> None:
        """:func:`key_classes`: every key class, too small ones too, in order of first
        member, each in the order of the nodes given."""

    def on_visit(self, depth: int, node: Node, key: Hashable | None) -> None:
        """:func:`fusion_candidates`: ``node``, ``depth`` producer hops from the root, was
        examined; ``key`` is its group key (it is bucketed and not walked through) or None
        (it does not match: walked through while under the depth limit)."""

    def on_round(self, subset: list[Node], waiting: dict[Node, str]) -> None:
        """:func:`independent_subsets`: one first-fit round took ``subset`` (yielded when it
        has at least ``min_fuse_set_size`` members, else dropped); every other node of the
        round waits for the next, for the reason given."""

    def on_depths(self, depths: dict[Node, int], above: dict[Node, frozenset[Node]]) -> None:
        """:func:`global_groups`: one round's member depths (:func:`member_depths`) and, per
        member, the members that are its ancestors (:func:`member_ancestors`)."""


def fusion_candidates(
    root: Node, key: KeyFn, depth: int, exclude_getitem: bool = True, observer: SearchObserver | None = None
) -> dict[Hashable, list[Node]]:
    """Nodes within ``depth`` producer hops of ``root`` bucketed by group key, in BFS
    order (nearest first, then argument order). Matching nodes are not expanded; a
    getitem root yields nothing (upstream's ``SEARCH_EXCLUSIONS``) unless
    ``exclude_getitem`` is False. ``observer.on_visit`` sees every node examined, in order."""
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
            if observer is not None:
                observer.on_visit(d, n, k)
            continue
        if observer is not None:
            observer.on_visit(d, n, None)
        if d < depth:
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
    :meth:`counts` says how many cached nodes share each key."""

    def __init__(self, key: KeyFn):
        super().__init__()
        self.key = key
        self._one: dict[Hashable, Hashable] = {}  # each key value once: equal keys are one object

    def __missing__(self, n: Node):
        k = self.key(n)
        if isinstance(k, Miss):
            k = None
        elif k is not None:
            k = self._one.setdefault(k, k)  # so that comparing a member's key with its class's is an identity test
        self[n] = k
        return k

    def forget(self, nodes: Iterable[Node]) -> None:
        for n in nodes:
            self.pop(n, None)

    def counts(self) -> dict[Hashable, int]:
        """How many cached nodes share each key (None left out), counted when asked: only
        the upstream search's start reads it, and a count kept up to date cost every key
        computed or forgotten two hashes of its key tuple."""
        out: dict[Hashable, int] = {}
        for k in self.values():
            if k is not None:
                out[k] = out.get(k, 0) + 1
        return out


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


def key_classes(
    nodes: Iterable[Node], key: KeyFn, index: GraphIndex, opts: SearchOptions, observer: SearchObserver | None = None
) -> list[tuple[Hashable, list[Node]]]:
    """The global search's candidates: each live node of ``nodes`` that has users and a
    group key (``key(n)`` neither None nor a :class:`Miss`), bucketed by key (members in
    the order of ``nodes``). Returns (key, members) for the classes of at least
    ``min_fuse_set_size`` members, in graph order of their first member: the order the
    engine fuses them in. With an ``observer``, nodes without users are keyed too, so
    that each node left out is reported with its reason (``on_left_out``), then every
    class (``on_classes``)."""
    classes: dict[Hashable, list[Node]] = {}
    for n in nodes:
        if n._erased or (observer is None and not n.users):
            continue
        k = key(n)
        if k is None or isinstance(k, Miss):
            if observer is not None:
                observer.on_left_out(n, NO_KEY if k is None else k)
            continue
        if not n.users:
            if observer is not None:
                observer.on_left_out(n, UNUSED)
            continue
        classes.setdefault(k, []).append(n)
    if observer is not None:
        observer.on_classes(classes)
    pos = index.pos
    big = [(k, ms) for k, ms in classes.items() if len(ms) >= opts.min_fuse_set_size]
    return sorted(big, key=lambda km: min(map(pos.__getitem__, km[1])))


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


def member_ancestors(members: list[Node], index: GraphIndex) -> dict[Node, frozenset[Node]]:
    """For each of ``members`` (in that order): the members that are its strict ancestors.
    Walks only nodes at or above the lowest member's level, each once."""
    memo: dict[Node, frozenset] = {}
    floor = min(index.level[n] for n in members)
    member = set(members)
    return {v: _ancestors_in(v, member, floor, index.level, memo) for v in members}


def independent_subsets(
    nodes: list[Node], index: GraphIndex, opts: SearchOptions, observer: SearchObserver | None = None
) -> Iterator[list[Node]]:
    """Greedy first-fit anti-chains of ``nodes`` (upstream's
    ``find_independent_subset_greedy``): each yielded list has between
    ``min_fuse_set_size`` and ``max_fuse_set_size`` members, none an ancestor of
    another, in candidate order. The caller may fuse each subset before asking for the
    next: dependencies are recomputed on the mutated graph. Nodes of a round that
    formed too small a subset are dropped, as upstream does. Erased nodes are skipped.
    ``observer.on_round`` sees every round, with why each node not taken waits."""
    node_list = [n for n in dict.fromkeys(nodes) if not n._erased]
    while node_list:
        members = set(node_list)
        floor = min(index.level[n] for n in node_list)
        memo: dict[Node, frozenset] = {}
        subset: list[Node] = []
        chosen: set[Node] = set()
        chosen_deps: set[Node] = set()
        next_round: list[Node] = []
        waiting: dict[Node, str] | None = None if observer is None else {}
        for n in node_list:
            if len(subset) >= opts.max_fuse_set_size or n in chosen_deps:
                next_round.append(n)
                if waiting is not None:
                    full = len(subset) >= opts.max_fuse_set_size
                    waiting[n] = (
                        f"the subset is full ({opts.max_fuse_set_size})" if full else "a chosen member depends on it"
                    )
                continue
            deps = _ancestors_in(n, members, floor, index.level, memo)
            if chosen.isdisjoint(deps):
                subset.append(n)
                chosen.add(n)
                chosen_deps |= deps
            else:
                next_round.append(n)
                if waiting is not None:
                    waiting[n] = f"depends on chosen {', '.join(sorted(m.name for m in deps & chosen))}"
        if observer is not None and waiting is not None:
            observer.on_round(subset, waiting)
        if len(subset) >= opts.min_fuse_set_size:
            yield subset
            next_round = [n for n in next_round if not n._erased]
        node_list = next_round


# ----------------------------------------------------------------------------- global search

#: key classes of at most this many leftover members get an exact maximum anti-chain
EXACT_LIMIT = 256


#: :func:`member_depths` walks the node list from the first member to the last while that
#: stretch holds at most this many nodes per member (plus ``SPAN_SLACK``)
SPAN_PER_MEMBER = 4
SPAN_SLACK = 64


def member_depths(members: list[Node], index: GraphIndex) -> dict[Node, int]:
    """For each of ``members``: the largest number of members on one producer path above
    it (0 for a member no other member reaches). Members of equal depth are mutually
    independent (a member above another has a smaller depth), so the depths split the
    class into anti-chains; the first (depth 0) is the set of its minimal elements.

    One pass in a topological order gives each node the most members on a path ending at
    it, itself included (:func:`_most_members`). The nodes passed: the stretch of the
    node list from the first member to the last (:func:`_span`), which holds every path
    between members, when it is at most ``SPAN_PER_MEMBER`` nodes per member long (a
    class spread over the graph, such as every linear of the towers: the list is walked
    in memory order, about three times faster per node than a walk over inputs);
    otherwise only the members and their producers at or above the lowest member's level
    (:func:`_region`; nothing below that level reaches a member), sorted by level. Either
    way O(members + nodes and edges walked), and the list walk, when taken, is at most
    ``SPAN_PER_MEMBER`` (+ slack) nodes per member."""
    member = set(members)
    pos = index.pos
    first = min(member, key=pos.__getitem__)
    last = max(member, key=pos.__getitem__)
    order = _span(first, last, SPAN_PER_MEMBER * len(member) + SPAN_SLACK)
    if order is None:
        level = index.level
        order = _region(member, level, min(level[n] for n in member))
        order.sort(key=level.__getitem__)  # every edge goes up a level: inputs come first
    above = _most_members(order, member)
    return {n: above[n] for n in members}


def _span(first: Node, last: Node, limit: int) -> list[Node] | None:
    """The nodes of the list from ``first`` to ``last`` (both included, in list order), or
    None when there are more than ``limit``. A node before ``first`` in a topologically
    ordered list is no member's descendant."""
    out = [first]
    n = first
    while n is not last:
        if len(out) >= limit:
            return None
        n = n._next
        out.append(n)
    return out


def _region(members: set[Node], level: dict[Node, int], floor: int) -> list[Node]:
    """``members`` and every producer of one at or above level ``floor``, each once (a
    walk over inputs that does not enter nodes below ``floor``)."""
    seen = set(members)
    out = list(seen)
    stack = list(out)
    while stack:
        for i in stack.pop()._input_nodes:  # FX's dict of the node's inputs
            if i not in seen and level[i] >= floor:
                seen.add(i)
                out.append(i)
                stack.append(i)
    return out


def _most_members(order: list[Node], member: set[Node]) -> dict[Node, int]:
    """For each member in ``order``: the most members on one path strictly above it.
    ``order`` is topological (inputs first) and holds, with each member, every node on a
    path between two members; an input not in ``order`` counts as having no member above
    it or in it (it lies before the first member in the list, or below the lowest
    member's level)."""
    upto: dict[Node, int] = {}  # node -> most members on a path ending at it, itself included
    get = upto.get
    above: dict[Node, int] = {}
    for m in order:
        best = 0
        for i in m._input_nodes:
            u = get(i)
            if u is not None and u > best:
                best = u
        if m in member:
            above[m] = best
            best += 1
        upto[m] = best
    return above


def max_antichain(members: list[Node], index: GraphIndex) -> list[Node]:
    """A largest set of mutually independent ``members`` (none an ancestor of another),
    in the order of ``members``. Dilworth's theorem via König's: a maximum matching of
    the comparability bipartite graph (member u -> member v when u is an ancestor of
    v), then the members whose left copy is reachable from an unmatched left copy by
    alternating paths and whose right copy is not. O(k * E) for k members and E
    comparable pairs."""
    if len(members) < 2:
        return list(members)
    below: dict[Node, list[Node]] = {n: [] for n in members}  # u -> members u is an ancestor of
    for v, above in member_ancestors(members, index).items():
        for u in above:
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
    getitem = operator.getitem

    def provenance(n: Node) -> tuple:
        x = n
        for _ in range(hops):
            ins = x._input_nodes  # FX's dict of the node's inputs, in argument order
            if not ins:
                break
            x = next(iter(ins))
            if x.target is getitem and x.op == "call_function" and isinstance(x._args[1], int):
                return (pos[x._args[0]], x._args[1], pos[n])
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
    members: list[Node],
    index: GraphIndex,
    opts: SearchOptions,
    still: Callable[[Node], bool],
    observer: SearchObserver | None = None,
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
    in :func:`group_order`. ``observer.on_depths`` sees each round's member depths."""
    pos = index.pos
    left = sorted((n for n in dict.fromkeys(members) if still(n)), key=pos.__getitem__)
    while len(left) >= opts.min_fuse_set_size:
        fused = False
        layers: dict[int, list[Node]] = {}
        depths = member_depths(left, index)
        if observer is not None:
            observer.on_depths(depths, member_ancestors(left, index))
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
