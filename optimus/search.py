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
"""
from __future__ import annotations

import operator
from collections import deque
from typing import Callable, Hashable, Iterable, Iterator

from torch.fx import Graph, Node

from optimus.pattern import Miss, SearchOptions

GAP = 1 << 20
LEVEL_SLACK = 16


class GraphIndex:
    """Position and level of every live node of ``graph``.

    ``pos[n]`` increases along the node list; ``level[n] > level[i]`` for every input
    ``i`` of ``n``. Call :meth:`update` after each step with the nodes it created,
    erased and rewired.
    """

    def __init__(self, graph: Graph):
        self.graph = graph
        self.pos: dict[Node, int] = {}
        self.level: dict[Node, int] = {}
        self.renumbers = 0
        self._renumber()
        for n in graph.nodes:
            self.level[n] = max((self.level[i] for i in n.all_input_nodes), default=-LEVEL_SLACK) + LEVEL_SLACK

    def _renumber(self) -> None:
        self.renumbers += 1
        for i, n in enumerate(self.graph.nodes):
            self.pos[n] = (i + 1) * GAP

    def _bounds(self, n: Node) -> tuple[int, int | None]:
        p = n.prev
        lo = 0 if p.op == "root" else self.pos[p]
        q = n.next
        hi = None if q.op == "root" else self.pos.get(q)
        return lo, hi

    def _place(self, n: Node) -> None:
        """Give ``n`` a position between its list neighbours (which must be placed)."""
        lo, hi = self._bounds(n)
        if hi is None:
            self.pos[n] = lo + GAP
        elif hi - lo >= 2:
            self.pos[n] = (lo + hi) // 2
        else:
            self._renumber()

    def update(self, created: Iterable[Node], erased: Iterable[Node], rewired: Iterable[Node]) -> int:
        """Bring the index up to date after one step and repair the list order.

        Created nodes get a position from their neighbours and a level from their inputs;
        then every created or rewired node that precedes an input is moved to just after
        its latest input, and its users re-checked (forward only, so it terminates).
        Returns the number of nodes moved.
        """
        for n in erased:
            self.pos.pop(n, None)
            self.level.pop(n, None)
        created = [n for n in created if not n._erased]
        # place runs of new nodes between placed neighbours, in list order
        for n in created:
            if n in self.pos:
                continue
            first = n
            while first.prev.op != "root" and first.prev not in self.pos:
                first = first.prev
            run = []
            m = first
            while m.op != "root" and m not in self.pos:
                run.append(m)
                m = m.next
            lo = 0 if first.prev.op == "root" else self.pos[first.prev]
            hi = None if m.op == "root" else self.pos[m]
            if hi is None:
                for k, r in enumerate(run):
                    self.pos[r] = lo + (k + 1) * GAP
            elif hi - lo > len(run):
                step = (hi - lo) // (len(run) + 1)
                for k, r in enumerate(run):
                    self.pos[r] = lo + (k + 1) * step
            else:
                self._renumber()
        for n in created:
            self._set_level(n)
        return self.repair([*created, *(r for r in rewired if not r._erased)])

    def _set_level(self, n: Node) -> None:
        stack = [n]
        while stack:
            m = stack[-1]
            missing = [i for i in m.all_input_nodes if i not in self.level]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            if m not in self.level:
                self.level[m] = max((self.level[i] for i in m.all_input_nodes), default=-1) + 1

    def repair(self, nodes: Iterable[Node]) -> int:
        """Move nodes that precede one of their inputs forward, and raise levels that are
        not above their inputs', following users until nothing changes."""
        moved = 0
        work = deque(nodes)
        pos, level = self.pos, self.level
        while work:
            v = work.popleft()
            if v._erased or v.op == "root":
                continue
            inputs = v.all_input_nodes
            if not inputs:
                continue
            latest = max(inputs, key=pos.__getitem__)
            changed = False
            if pos[latest] >= pos[v]:
                latest.append(v)
                self._place(v)
                moved += 1
                changed = True
            top = max(level[i] for i in inputs)
            if level[v] <= top:
                level[v] = top + 1
                changed = True
            if changed:
                work.extend(v.users)
        return moved

    def check(self) -> None:
        """Assert both numberings are consistent with the graph (tests call this)."""
        last = -1
        for n in self.graph.nodes:
            assert self.pos[n] > last, f"pos out of order at {n}"
            last = self.pos[n]
            for i in n.all_input_nodes:
                assert self.pos[i] < self.pos[n], f"{i} is after its user {n}"
                assert self.level[i] < self.level[n], f"level of {i} >= level of its user {n}"


KeyFn = Callable[[Node], "Hashable | Miss"]


def fusion_candidates(root: Node, key: KeyFn, depth: int) -> dict[Hashable, list[Node]]:
    """Nodes within ``depth`` producer hops of ``root`` bucketed by group key, in BFS
    order (nearest first, then argument order). Matching nodes are not expanded; a
    getitem root yields nothing (upstream's ``SEARCH_EXCLUSIONS``)."""
    if root.op == "call_function" and root.target is operator.getitem:
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


def _ancestors_in(n: Node, members: set[Node], floor: int, level: dict[Node, int],
                  memo: dict[Node, frozenset]) -> frozenset:
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
    formed too small a subset are dropped, as upstream does."""
    node_list = list(dict.fromkeys(nodes))
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
