"""Position and level of every live node of a graph, kept up to date step by step.

The batch searches (:mod:`optimus_lens.core.search`) ask "does this member depend on
that one?" and the engine keeps the node list topologically valid after every step;
both use the two numberings of :class:`GraphIndex` instead of re-walking the graph:
``pos`` (list order, with gaps, so inserts and moves renumber locally) and ``level`` (a
height function: every edge goes from a lower to a higher level, spaced by
``LEVEL_SLACK`` so a fusion's new chain fits under its users without relabelling them).
After a step, :meth:`GraphIndex.repair` moves only the nodes that now precede one of
their inputs, so the graph stays topologically valid without a sort.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from torch.fx import Graph, Node

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
        at, height = pos.__getitem__, level.__getitem__
        nodes = list(nodes)
        moved: list[Node] = []
        work = deque(nodes)
        # inlined (this loop runs once per moved node and per user of one: ~200k times
        # a run at 21k nodes); ``_input_nodes`` is the dict ``all_input_nodes`` copies
        while work:
            v = work.popleft()
            if v._erased or v.op == "root" or not v._input_nodes:
                continue
            latest = max(v._input_nodes, key=at)
            if pos[latest] >= pos[v]:
                latest.append(v)
                self._place(v)
                moved.append(v)
                work.extend(v.users)
        work = deque(nodes)
        work.extend(moved)
        while work:
            v = work.popleft()
            if v._erased or v.op == "root" or not v._input_nodes:
                continue
            top = max(map(height, v._input_nodes))
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
