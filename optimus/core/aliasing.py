"""Graph-wide effects: alias classes, the writes to each, regions, and write epochs.

Built on the node-level answers of :mod:`optimus_lens.core.effects`:

* **Alias classes.** Two values are in one class when they may share memory: their
  example values share a storage (FakeTensors keep storages, so the views of one tensor,
  and graph inputs that are views of one buffer, share one), an op's schema or probe
  says its result may alias an input where the example does not show it (``contiguous``
  of a non-contiguous tensor, eval-mode dropout), or the real example inputs given to
  :func:`note_inputs` share a storage. A value without example value is its own atom,
  joined through alias edges.
* **Writes**: each class's writers in program order (in place, ``out=``, a custom op's
  ``mutates_args``, an unknown callable that receives it). A value's **write epoch** for a
  class is the number of writes to the class before it; a step must not move a read of a
  class across a write to it, so a batch fusion groups only members whose reads share
  epochs (:func:`signature`) and the engine checks every step
  (:mod:`optimus_lens.core.stepcheck`).
* **Regions**: nodes that change global state (``_set_grad_enabled``,
  ``_enter_autocast``/``_exit_autocast``, ``_enter_inference_mode``; unknown callables)
  cut the program into regions (``with torch.no_grad():``, ``torch.autocast(...)``
  blocks); :func:`region` numbers them. Random ops are ordered among themselves the same
  way (one class, the generator's state).

The analysis of a graph is cached (:func:`analysis`) and kept current cheaply: the
Rewriter reports every node a step creates, erases or rewires (:func:`touch`), only those
are read again, and the tables (classes, writes, regions) are rebuilt at the next query
after a change, only when the graph has a write, a state change or a random op at all:
O(changed nodes) per step otherwise, so a graph without effects pays nothing but a
per-node look-up once. A change made around the Rewriter (the node count differs from
the last one seen) rescans the graph.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch.fx import Graph, Node

from optimus_lens.core import meta
from optimus_lens.core.effects import PURE, NodeEffect, effect, is_plain
from optimus_lens.core.memo import keep, kept
from optimus_lens.core.meta import storage_key, storages
from optimus_lens.core.miss import Miss
from optimus_lens.core.strides import reads_offset

_EFFECTS = "_optimus_effects"  # the GraphEffects kept on a graph (core.memo.keep)


class GraphEffects:
    """The effects of one FX graph (see the module docstring); get it with :func:`analysis`."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.effectful: dict[Node, NodeEffect] = {}  # writes, state or rng
        self.odd: dict[Node, NodeEffect] = {}  # alias edges the example storages do not show
        self.offset_readers: set[Node] = set()  # nodes that read their input's storage offset
        self.pending: set[Node] | None = None  # None: scan the whole graph
        self.seen_len = -1
        self.positions: Mapping[Node, int] | None = None  # the engine's GraphIndex.pos, when registered
        self.input_groups: list[list[Node]] = []  # placeholders whose real inputs share a storage
        self.tables: _Tables | None = None
        self.last_tables: _Tables | None = None  # the tables before the latest change (barriers, during a step)
        self.version = 0

    # ---------------------------------------------------------------- upkeep
    def refresh(self, later: Node | None = None) -> GraphEffects:
        """Read the nodes changed since the last query (all of them after an outside change).
        ``later``, a pending node whose example value is not computed yet (the node
        :func:`state_before` is computing it for), stays pending: read now, it would be
        classified without its value and again with it."""
        g = self.graph
        keep = None
        if self.pending is None or g._len != self.seen_len and not self.pending:  # FX's count, no node list made
            self.effectful, self.odd, self.offset_readers = {}, {}, set()
            todo: Iterable[Node] = g.nodes
            self.tables = None
        elif self.pending:
            todo = self.pending
            if later is not None and later in todo:
                if len(todo) == 1:
                    return self
                todo, keep = todo - {later}, {later}
            self.tables = None
        else:
            return self
        for n in todo:
            self.effectful.pop(n, None)
            self.odd.pop(n, None)
            self.offset_readers.discard(n)
            if n._erased or n.graph is not g:
                continue
            if reads_offset(n):
                self.offset_readers.add(n)
            eff, odd = _classify(n)
            if eff.effectful:
                self.effectful[n] = eff
            if odd:
                self.odd[n] = eff
        self.pending = keep or set()
        self.seen_len = g._len
        self.version += 1
        return self

    def classified(self, node: Node) -> bool | None:
        """:func:`known_effectful` of ``node`` in this analysis's graph."""
        if self.pending is None or node in self.pending or not self.pending and self.graph._len != self.seen_len:
            return None  # not read, changed since, or the graph changed around the Rewriter (as refresh tells)
        return node in self.effectful

    def pos(self, n: Node) -> int:
        """``n``'s position in program order: the engine's index when registered (a node
        it has not placed yet, during a step, raises KeyError), else the list order."""
        t = self._tables()
        return t.order[n] if t.order is not None else t.positions[n]

    def _tables(self) -> _Tables:
        if self.tables is None:
            self.tables = _Tables(self)
        return self.tables

    # ---------------------------------------------------------------- questions
    @property
    def quiet(self) -> bool:
        """No node writes, changes state or draws random numbers: every epoch is 0."""
        return not self.effectful

    def classes(self, n: Node) -> frozenset:
        """The alias classes of ``n``'s value (ids of :class:`_Tables`)."""
        if self.quiet:
            return frozenset()
        t = self._tables()
        return frozenset(t.find(a) for a in _atoms(n))

    def written_classes(self, n: Node) -> frozenset:
        """The classes of ``n``'s value that some node writes."""
        if self.quiet:
            return frozenset()
        t = self._tables()
        return frozenset(c for c in (t.find(a) for a in _atoms(n)) if c in t.writes)

    def is_written(self, n: Node) -> bool:
        """Whether any node writes into ``n``'s storage (any alias of it), anywhere."""
        return not self.quiet and bool(self.written_classes(n))

    def writers(self, cls: Any) -> list[tuple[int, Node]]:
        """(position, node) of each write to class ``cls``, in program order."""
        if self.quiet:
            return []
        return self._tables().writes.get(cls, [])

    def barriers(self) -> list[tuple[int, Node]]:
        """(position, node) of each node that changes global state, in program order."""
        return [] if self.quiet else self._tables().barriers

    def region(self, n: Node, at: int | None = None) -> int:
        """How many state changes come before ``n`` (or before position ``at``)."""
        if self.quiet:
            return 0
        p = self.pos(n) if at is None else at
        return bisect.bisect_left(self._tables().barrier_pos, p)

    def epoch(self, cls: Any, at: int) -> int:
        """How many writes to class ``cls`` come before position ``at``."""
        if self.quiet:
            return 0
        return bisect.bisect_left(self._tables().write_pos.get(cls, ()), at)

    def reads(self, n: Node) -> dict[Any, Node]:
        """The written classes ``n`` reads (through its inputs), each with the first input in it."""
        out: dict[Any, Node] = {}
        if self.quiet:
            return out
        for i in n.all_input_nodes:
            for c in self.written_classes(i):
                out.setdefault(c, i)
        if effect(n).rng:
            out.setdefault(RNG, n)
        return out

    def signature(self, n: Node) -> tuple:
        """What a batch fusion's group key adds for ``n`` so that a group never spans a
        region boundary or mixes write epochs: ``()`` when the graph has no effects;
        else the region and, for each written class ``n`` reads, (its first writer, the
        epoch of ``n``'s read). A stable value: it names nodes, not table ids."""
        if self.quiet:
            return ()
        t = self._tables()
        p = self.pos(n)
        parts: list = []
        if t.barrier_pos:
            parts.append(("region", bisect.bisect_left(t.barrier_pos, p)))
        for c in sorted(self.reads(n), key=lambda c: t.write_pos[c][0]):
            parts.append((t.writes[c][0][1], bisect.bisect_left(t.write_pos[c], p)))
        return tuple(parts)


RNG = ("rng",)  # the class of the random generator's state: every random op reads and writes it


class _Tables:
    """One version of a graph's classes, writes and regions (rebuilt after a change)."""

    def __init__(self, ge: GraphEffects):
        g = ge.graph
        self.positions = ge.positions
        self.order: dict[Node, int] | None = None
        if self.positions is None or any(n not in self.positions for n in ge.effectful):
            self.order = {n: i for i, n in enumerate(g.nodes)}
        pos = self.order if self.order is not None else self.positions
        assert pos is not None
        self.parent: dict = {}
        for n, e in ge.odd.items():
            for i in e.aliases:
                for a in _atoms(i):
                    for b in _atoms(n):
                        self.union(a, b)
        for group in ge.input_groups:
            atoms = [a for p in group if not p._erased for a in _atoms(p)]
            for a in atoms[1:]:
                self.union(atoms[0], a)
        self.writes: dict[Any, list[tuple[int, Node]]] = {}
        self.barriers: list[tuple[int, Node]] = []
        for n, e in ge.effectful.items():
            p = pos[n]
            if e.state:
                self.barriers.append((p, n))
            if e.rng:
                self.writes.setdefault(RNG, []).append((p, n))
            for w in e.writes:
                atoms = _atoms(w)
                if not atoms:  # cannot tell what it writes: order everything around it
                    self.barriers.append((p, n))
                for c in {self.find(a) for a in atoms}:
                    self.writes.setdefault(c, []).append((p, n))
        for ws in self.writes.values():
            ws.sort(key=lambda x: x[0])
        self.barriers.sort(key=lambda x: x[0])
        self.write_pos = {c: [p for p, _ in ws] for c, ws in self.writes.items()}
        self.barrier_pos = [p for p, _ in self.barriers]

    def find(self, a: Any) -> Any:
        parent = self.parent
        root = a
        while root in parent:
            root = parent[root]
        while a in parent and parent[a] != root:  # path compression
            parent[a], a = root, parent[a]
        return root

    def union(self, a: Any, b: Any) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra


_ATOMS = "_optimus_atoms"  # the node attribute holding (example value, atoms)


def _atoms(n: Any) -> set:
    """The storage keys of a node's example value; the node itself when it has none.
    Memoised per node while its example value stays the same object (an ``unbind`` of 128
    pieces is read once, not at every query). The caller must not change the set."""
    if not isinstance(n, Node):
        return set()
    v = meta.value(n)
    hit = n.__dict__.get(_ATOMS)
    if hit is not None and hit[0] is v:
        return hit[1]
    ks = storages(v)
    got = ks if ks else {("node", n)}
    object.__setattr__(n, _ATOMS, (v, got))  # on the node, as the effect memo: a copied graph starts afresh
    return got


def _classify(n: Node) -> tuple[NodeEffect, bool]:
    """(effect, odd): ``odd`` when an alias edge of ``n`` is not shown by the example
    storages (so classes must join it explicitly). A target whose every call is pure and
    alias-free (:func:`optimus_lens.core.effects.is_plain`) costs one look-up."""
    if n.op not in ("call_function", "call_method") or is_plain(n):
        return PURE, False
    if n.target is operator.getitem and n.op == "call_function":  # an alias of what it indexes
        src = n.args[0] if n.args else None
        if not isinstance(src, Node):
            return PURE, False
        if _atoms(src) & _atoms(n):  # the storages show the edge: nothing to keep (a getitem
            return PURE, False  # never writes, changes state or draws random numbers)
        return effect(n), True
    e = effect(n)
    if not e.aliases:
        return e, False
    mine = _atoms(n)
    return e, e.identity is not None or any(not (_atoms(i) & mine) for i in e.aliases)


# ----------------------------------------------------------------------------- public


def analysis(graph: Graph) -> GraphEffects:
    """The current :class:`GraphEffects` of ``graph`` (created on first use)."""
    ge = kept(graph, _EFFECTS)
    if ge is None:
        ge = keep(graph, _EFFECTS, GraphEffects(graph))
    return ge.refresh()


def touch(graph: Graph, nodes: Iterable[Node]) -> None:
    """Tell the analysis of ``graph`` that ``nodes`` were created, erased or changed (the
    Rewriter calls this for every change it makes)."""
    ge = kept(graph, _EFFECTS)
    if ge is None:
        return
    if ge.pending is not None:
        ge.pending.update(nodes)
    ge.last_tables = ge.tables or ge.last_tables
    ge.tables = None


def touch_pieces(graph: Graph, pieces: Iterable[Node]) -> None:
    """Tell the analysis of ``graph`` that ``pieces`` were created: getitems of one node,
    each holding an element of that node's tuple value (:meth:`Rewriter.getitems`). Such a
    getitem is classified without being read again: it writes nothing and changes no state
    (a getitem never does), its alias edge is shown by the storages when its value has a
    storage key (the parent's atoms include it: :func:`_classify`'s getitem rule), and it
    reads no storage offset (:func:`optimus_lens.core.strides.reads_offset`). A piece
    without a storage key is made pending as :func:`touch` does."""
    ge = kept(graph, _EFFECTS)
    if ge is None:
        return
    unread = [n for n in pieces if storage_key(meta.value(n)) is None]
    if ge.pending is not None:
        ge.pending.update(unread)
        ge.seen_len += len(pieces) - len(unread)  # node count the analysis has accounted for
    ge.last_tables = ge.tables or ge.last_tables
    ge.tables = None


def known_effectful(graph: Graph, node: Node) -> bool | None:
    """Whether ``node`` writes, changes state or draws random numbers, as the analysis of
    ``graph`` classified it when last read; None where it has not classified the node as it
    is now (a node created or changed since, or no analysis yet): ask
    :func:`optimus_lens.core.effects.effect` then. A dict look-up where the analysis is current."""
    ge = kept(graph, _EFFECTS)
    return None if ge is None else ge.classified(node)


def classifier(graph: Graph) -> Callable[[Node], bool | None]:
    """:func:`known_effectful` for nodes of ``graph``, with the analysis looked up once."""
    ge = kept(graph, _EFFECTS)
    return ge.classified if ge is not None else lambda node: None


def forget(graph: Graph) -> None:
    """Drop the cached analysis of ``graph`` (the next query rescans it)."""
    ge = kept(graph, _EFFECTS)
    if ge is not None:
        ge.pending, ge.tables = None, None


def use_positions(graph: Graph, positions: Mapping[Node, int] | None) -> None:
    """Read program order from ``positions`` (the engine's ``GraphIndex.pos``, kept
    current step by step) instead of numbering the graph at each change."""
    ge = kept(graph, _EFFECTS) or analysis(graph)
    ge.positions = positions
    ge.tables = None


@contextmanager
def positions_during(graph: Graph, positions: Mapping[Node, int]) -> Iterator[GraphEffects]:
    """Read program order from ``positions`` (the numbering before a step: a
    :class:`~optimus_lens.core.stepcheck.StepCheck`'s) while the block runs, where no
    engine index is registered (:func:`use_positions`); so writes, regions and the step's
    nodes are numbered alike even though the step changed the list. Yields the analysis."""
    ge = analysis(graph)
    if ge.positions is not None:
        yield ge
        return
    ge.positions, ge.tables = positions, None
    try:
        yield ge
    finally:
        ge.positions, ge.tables = None, None


def note_inputs(graph: Graph, inputs: tuple) -> None:
    """Join the alias classes of placeholders whose real example ``inputs`` (in
    placeholder order) share a storage: graph inputs that are views of one buffer."""
    ge = analysis(graph)
    first: dict[Any, tuple[int, Node]] = {}  # storage -> (rank, placeholder) of the first input in it
    groups: dict[Any, list[Node]] = {}  # storage -> its placeholders, for a storage of two or more
    phs: list[Node] = []  # the first len(inputs) placeholders (the rest pair with no input)
    for n in graph.nodes if inputs else ():
        if n.op == "placeholder":
            phs.append(n)
            if len(phs) == len(inputs):
                break
    for rank, (p, x) in enumerate(zip(phs, inputs)):
        if isinstance(x, torch.Tensor) and x.layout == torch.strided:
            try:
                key = x.untyped_storage().data_ptr()
            except Exception:  # noqa: BLE001 - no storage
                continue
            if key:
                q = first.setdefault(key, (rank, p))[1]
                if q is not p:
                    groups.setdefault(key, [q]).append(p)
    ge.input_groups = [groups[k] for k in sorted(groups, key=lambda k: first[k][0])]  # in order of first input
    ge.tables = None


def is_written(node: Node) -> bool:
    """True when some node writes into ``node``'s storage (any value that may alias it:
    a view of it, the tensor it views, an overlapping graph input), anywhere in the graph."""
    if not isinstance(node, Node):
        return False
    return analysis(node.graph).is_written(node)


def offset_readers(graph: Graph) -> set[Node]:
    """The nodes of ``graph`` that read their input's storage offset
    (:func:`optimus_lens.core.strides.reads_offset`); where there are none, no use of any
    node reads one (:func:`optimus_lens.core.strides.offset_use` is None everywhere).
    The caller must not change the set."""
    return analysis(graph).offset_readers


def signature(node: Node) -> tuple:
    """:meth:`GraphEffects.signature` of ``node`` in its graph."""
    return analysis(node.graph).signature(node)


def region(node: Node) -> int:
    """The region ``node`` is in: how many state changes (grad mode, autocast) precede it."""
    return analysis(node.graph).region(node)


@contextmanager
def state_before(graph: Graph, node: Node) -> Iterator[None]:
    """The global state (grad mode, autocast, inference mode) that holds where ``node``
    stands in ``graph``: the state changes before it are replayed (their targets called
    in order, a context one of them enters passed on to the node that exits it) and
    undone afterwards (contexts left open exited in reverse order, grad mode restored).
    So a node a rewrite creates inside ``torch.autocast(...)`` gets the example value it
    computes there (bf16, not fp32). Does nothing in a graph without state changes (reads
    the graph's analysis, changed nodes only, so costs O(nodes changed) per call; ``node``
    itself, which has no example value yet, is read at the next query)."""
    ge = kept(graph, _EFFECTS)
    ge = analysis(graph) if ge is None else ge.refresh(later=node)
    t = None
    if any(e.state for e in ge.effectful.values()):
        t = ge.tables or ge.last_tables or ge._tables()
    if t is None or not t.barriers:
        yield
        return
    at = _placed_before(node, t)
    todo = [b for p, b in t.barriers if at is not None and p <= at and b is not node]
    grad = torch.is_grad_enabled()
    results: dict[Node, Any] = {}
    try:
        for b in todo:
            if not getattr(b.target, "__module__", "").startswith("torch") or b.op != "call_function":
                continue
            if any(n not in results for n in b.all_input_nodes):
                continue
            args = torch.fx.node.map_arg(b.args, results.__getitem__)
            kwargs = torch.fx.node.map_arg(b.kwargs, results.__getitem__)
            try:
                results[b] = b.target(*args, **kwargs)
            except Exception:  # noqa: BLE001 - a state change we cannot replay is left out
                continue
        yield
    finally:
        exited = {id(v) for b in todo for v in torch.fx.node.map_arg(b.args, lambda n: results.get(n)) if v is not None}
        for b in reversed(todo):
            ctx = results.get(b)
            if ctx is not None and hasattr(ctx, "__exit__") and id(ctx) not in exited:
                try:
                    ctx.__exit__(None, None, None)
                except Exception:  # noqa: BLE001 - best effort: the grad mode is restored below
                    pass
        torch._C._set_grad_enabled(grad)


def _placed_before(node: Node, t: _Tables) -> int | None:
    """The position of the nearest node at or before ``node`` that ``t`` knows."""
    pos = t.order if t.order is not None else t.positions
    if pos is None:
        return None
    m = node
    while m.op != "root":
        p = pos.get(m)
        if p is not None:
            return p
        m = m.prev
    return -1


def region_miss(nodes: Iterable[Node]) -> Miss | None:
    """A Miss when ``nodes`` (a match's site) lie in more than one region: a rewrite of
    them would move a computation across a ``no_grad``/``enable_grad``/``autocast``
    boundary."""
    nodes = [n for n in nodes if isinstance(n, Node) and n.op in ("call_function", "call_method")]
    if not nodes:
        return None
    ge = analysis(nodes[0].graph)
    if ge.quiet or not ge.barriers():
        return None
    seen: dict[int, Node] = {}
    for n in nodes:
        try:
            seen.setdefault(ge.region(n), n)
        except KeyError:  # not placed yet (asked during a step): no answer
            return None
    if len(seen) < 2:
        return None
    a, b = list(seen.values())[:2]
    return Miss(f"{a.name} and {b.name} lie in different grad-mode or autocast regions (a boundary lies between them)")


def storage_span(t: Any) -> tuple | None:
    """(storage key, first byte, one past the last byte) a tensor can address; None when
    its sizes are symbolic without hints or it has no storage. Disjoint slices of one
    storage do not overlap."""
    k = storage_key(t)
    if k is None:
        return None
    try:
        size = [int(s) for s in t.shape]
        stride = [int(s) for s in t.stride()]
        off = int(t.storage_offset())
    except Exception:  # noqa: BLE001 - unbacked sizes
        return None
    if any(s == 0 for s in size):
        return (k, 0, 0)
    lo = off + sum((n - 1) * s for n, s in zip(size, stride) if s < 0)
    hi = off + sum((n - 1) * s for n, s in zip(size, stride) if s > 0) + 1
    es = t.element_size()
    return (k, lo * es, hi * es)
