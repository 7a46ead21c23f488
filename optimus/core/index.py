"""Position and level of every live node of a graph, kept up to date step by step.

The batch searches (:mod:`optimus_lens.core.search`) ask "does this member depend on
that one?" and the engine keeps the node list topologically valid after every step;
both use the two numberings of :class:`GraphIndex` instead of re-walking the graph:
``pos`` (list order, with gaps, so inserts and moves renumber locally) and ``level`` (a
height function: every edge goes from a lower to a higher level, spaced by
``LEVEL_SLACK`` so a fusion's new chain fits under its users without relabelling them).
After a step, :meth:`GraphIndex.repair` moves the nodes that now precede an input (one
block, :func:`repair_plan`, in a graph without effects), so the graph stays topologically
valid without a sort.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any, NamedTuple

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
            top = -LEVEL_SLACK  # one above the highest input (0 for a node without inputs)
            for i in n._input_nodes:
                if level[i] > top:
                    top = level[i]
            level[n] = top + LEVEL_SLACK

    def _renumber(self) -> None:
        self.renumbers += 1
        nodes = self.graph.nodes
        self.pos.update(zip(nodes, range(GAP, (len(nodes) + 1) * GAP, GAP)))  # (i + 1) * GAP for the i-th

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

    def update(
        self, created: Iterable[Node], erased: Iterable[Node], rewired: Iterable[Node], block: bool = False
    ) -> int:
        """Bring the index up to date after one step and repair the list order.

        Created nodes get a position from their neighbours and a level from their inputs;
        then :meth:`repair` (with ``block``) moves the created or rewired nodes that
        precede an input and what they drag along. Returns the number of nodes moved.
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
        return self.repair([*created, *(r for r in rewired if not r._erased)], block)

    def _set_level(self, n: Node) -> None:
        level = self.level
        try:  # every input placed (a fusion's nodes are made in order): one more than the highest
            level[n] = max((level[i] for i in n._input_nodes), default=-1) + 1
            return
        except KeyError:
            pass
        stack = [n]
        while stack:
            m = stack[-1]
            missing = [i for i in m._input_nodes if i not in level]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            if m not in level:
                level[m] = max((level[i] for i in m._input_nodes), default=-1) + 1

    def repair(self, nodes: Iterable[Node], block: bool = False) -> int:
        """Restore a topological list order and the level invariant after a step.

        Order, with ``block`` (the engine's choice in a graph where no node writes,
        changes state or draws random numbers, so no place can matter but the data
        edges'): :func:`repair_plan` picks the nodes to move and where (one block, after
        the latest input it reads or before the earliest node that reads it), and they
        are moved there in the block's order and renumbered as one run. Without: nodes
        are taken first in, first out from ``nodes``; one that precedes its latest input
        is moved to just after that input, and its users are queued (forward moves only,
        so this terminates; :func:`optimus_lens.core.stepcheck.final_places` predicts
        these moves for the write-epoch proofs). Levels: a node not above all of its
        inputs is raised to one more than the highest, and its users are re-checked.
        Returns the number of nodes that changed place."""
        level = self.level
        height = level.__getitem__
        nodes = list(nodes)
        moved = self._move_block(nodes) if block else self._move_each(nodes)
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

    def _move_each(self, nodes: list[Node]) -> list[Node]:
        """Repair without ``block`` (see :meth:`repair`); returns the moved nodes."""
        pos = self.pos
        at = pos.__getitem__
        moved: list[Node] = []
        work = deque(nodes)
        # inlined (this loop runs once per moved node and per user of one); ``_input_nodes``
        # is the dict ``all_input_nodes`` copies
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
        return moved

    def _move_block(self, nodes: list[Node]) -> list[Node]:
        """Repair with ``block`` (see :meth:`repair`); returns the nodes that changed place."""
        plan = repair_plan(nodes, self.pos.get)
        if plan is None:
            return []
        moved: list[Node] = []
        block = plan.block
        if plan.after:
            cur = plan.anchor
            for v in block:
                if cur._next is not v:
                    cur.append(v)
                    moved.append(v)
                cur = v
        else:
            z = plan.anchor
            for v in reversed(block):
                if z._prev is not v:
                    z.prepend(v)
                    moved.append(v)
                z = v
        self._place_run(block)
        return moved

    def _place_run(self, run: list[Node]) -> None:
        """Renumber ``run``, a contiguous stretch of the list, between its neighbours."""
        pos = self.pos
        p, q = run[0].prev, run[-1].next
        lo = 0 if p.op == "root" else pos[p]
        if q.op == "root":
            for k, r in enumerate(run, 1):
                pos[r] = lo + k * GAP
        elif pos[q] - lo > len(run):
            step = (pos[q] - lo) // (len(run) + 1)
            for k, r in enumerate(run, 1):
                pos[r] = lo + k * step
        else:
            self._spread(run[0], run[-1])

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


class RepairPlan(NamedTuple):
    """Where :meth:`GraphIndex.repair` puts one step's misplaced nodes: ``block``, in
    this order, right after ``anchor`` (``after``) or right before it."""

    after: bool
    anchor: Node
    block: list[Node]


def repair_plan(nodes: Iterable[Node], at: Callable[[Node], Any]) -> RepairPlan | None:
    """The one move that makes a step's graph topologically valid again, or ``None``
    when no node of ``nodes`` (the step's created and rewired nodes) precedes an input.

    ``at(n)`` is a node's position (comparable, increasing along the node list) or
    ``None`` for a node it does not know (ignored). The *late* nodes are those of
    ``nodes`` at or before one of their inputs. Two repairs are weighed, each moving
    one block:

    * **down**: the late nodes and every user of a moved node that lies at or before
      the latest input a moved node reads, placed after that input;
    * **up**: every input of a late node that lies at or after it, and every input of
      a moved node that lies at or after the earliest late node, placed before the
      first unmoved node from there (never a placeholder: their order is the graph's
      signature).

    The smaller block is taken (down on a tie), found by growing both in lockstep, so
    the cost is that of the smaller one. A block is ordered by the longest path to it
    from its own first nodes, then by position, so a fusion that feeds one node of
    each of k towers leaves their later layers layer by layer. :func:`optimus_lens.core.
    stepcheck.final_places` predicts the same placement from the positions before the
    step. (Upstream leaves the graph unsorted until ``stable_topological_sort``.)"""
    late: dict[Node, None] = {}
    seen: set[Node] = set()
    for v in nodes:
        if v in seen or v._erased or v.op == "root":
            continue
        seen.add(v)
        pv = at(v)
        if pv is None:
            continue
        for i in v._input_nodes:
            pi = at(i)
            if pi is not None and pi >= pv:
                late[v] = None
                break
    if not late:
        return None
    down, up = _down(late, at), _up(late, at)
    while True:
        try:
            next(down)
        except StopIteration as done:
            return done.value
        if up is not None:
            try:
                next(up)
            except StopIteration as done:
                if done.value is not None:
                    return done.value
                up = None


def _down(late: dict[Node, None], at: Callable[[Node], Any]) -> Generator[None, None, RepairPlan]:
    """The down block (see :func:`repair_plan`); yields once per node taken."""
    members: dict[Node, None] = {}
    top, top_node = None, None
    waiting: list[tuple[Any, int, Node]] = []  # users after ``top``, by position
    work: deque[Node] = deque()
    seq = 0
    pending = list(late)
    while pending or work:
        for v in pending:  # take v: it moves, and so must what it reaches at or before top
            if v in members:
                continue
            members[v] = None
            work.append(v)
            for i in v._input_nodes:
                pi = at(i)
                if pi is not None and (top is None or pi > top):
                    top, top_node = pi, i
            yield
        pending = []
        while waiting and waiting[0][0] <= top:
            u = heapq.heappop(waiting)[2]
            if u not in members:
                pending.append(u)
        if pending:
            continue
        if not work:
            break
        v = work.popleft()
        for u in v.users:
            if u in members:
                continue
            pu = at(u)
            if pu is None:
                continue
            if pu <= top:
                pending.append(u)
            else:
                seq += 1
                heapq.heappush(waiting, (pu, seq, u))
    anchor = top_node
    while anchor in members:
        anchor = anchor.prev
    return RepairPlan(True, anchor, _block_order(members, at))


def _up(late: dict[Node, None], at: Callable[[Node], Any]) -> Generator[None, None, RepairPlan | None]:
    """The up block (see :func:`repair_plan`), or ``None`` when it would move a
    placeholder; yields once per node taken."""
    first = min(late, key=at)
    start = at(first)
    members: dict[Node, None] = {}
    work: deque[Node] = deque()
    for v in late:
        pv = at(v)
        for i in v._input_nodes:
            pi = at(i)
            if pi is not None and pi >= pv and i not in members:
                if i.op == "placeholder":
                    return None
                members[i] = None
                work.append(i)
                yield
    while work:
        v = work.popleft()
        for i in v._input_nodes:
            pi = at(i)
            if pi is not None and pi >= start and i not in members:
                if i.op == "placeholder":
                    return None
                members[i] = None
                work.append(i)
                yield
    if not members:
        return None
    anchor = first
    while anchor in members:
        anchor = anchor.next
    return RepairPlan(False, anchor, _block_order(members, at))


def _block_order(members: dict[Node, None], at: Callable[[Node], Any]) -> list[Node]:
    """``members`` by the longest path to each from members with no member input, then
    by position: an order in which every input comes first."""
    deg = {v: sum(1 for i in v._input_nodes if i in members) for v in members}
    depth = dict.fromkeys(members, 0)
    ready = deque(v for v, d in deg.items() if d == 0)
    while ready:
        v = ready.popleft()
        d = depth[v] + 1
        for u in v.users:
            if u in deg:
                if depth[u] < d:
                    depth[u] = d
                deg[u] -= 1
                if deg[u] == 0:
                    ready.append(u)
    return sorted(members, key=lambda v: (depth[v], at(v)))


def find_cycle(changed: list[Node], level: dict | None) -> list[Node] | None:
    """A cycle through the nodes whose inputs a step set (``changed``), as a path that
    starts and ends at one node, or None. One depth-first walk up the inputs from all of
    them (grey = on the walk's path, black = done), so O(nodes and edges visited).

    Before the step the graph was acyclic, so every cycle has an edge into a changed node,
    and an unchanged node on it reaches a changed pre-existing node along old edges, whose
    ``level`` (increasing along every edge before the step) is lower. So with ``level`` the
    walk does not enter unchanged nodes below the lowest level among changed nodes."""
    if not changed:
        return None
    cset = set(changed)
    floor = None
    if level is not None:
        known = [level[n] for n in changed if n in level]
        floor = min(known) if known else float("inf")
    state: dict[Node, int] = {}  # 1 grey, 2 black
    for start in changed:
        if start in state:
            continue
        state[start] = 1
        stack: list[tuple[Node, Iterator[Node]]] = [(start, iter(start._input_nodes))]  # FX's dict of inputs
        while stack:
            n, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[n] = 2
                stack.pop()
                continue
            st = state.get(nxt)
            if st == 2:
                continue
            if st == 1:
                path = [m for m, _ in stack]
                return path[path.index(nxt) :] + [nxt]
            if floor is not None and level is not None and nxt not in cset and nxt in level and level[nxt] < floor:
                continue
            state[nxt] = 1
            stack.append((nxt, iter(nxt._input_nodes)))
    return None
