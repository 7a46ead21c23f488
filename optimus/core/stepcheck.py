"""Every step keeps what eager mode computes: one check, run on every replacement.

A rewrite may be refused for reasons a pattern's own conditions do not see; this module
is the one place that decides them, for every pattern (shipped, from a pattern file, or
upstream's rule re-run by a repro):

* **dtype**: a replacement must have the dtype of the value it replaces (``stack`` and
  ``cat`` of mixed dtypes promote, so their identities would hand back unpromoted members;
  a 0-dim fp32 operand does not promote a bf16 tensor, but stacked into a 1-D tensor it
  does);
* **storage offset**, where a use reads it (``as_strided`` with an explicit offset,
  ``storage_offset()``, ``data_ptr()``, views of them:
  :func:`optimus_lens.core.strides.offset_use`): a fused member is a slice of a stacked
  tensor, at another offset;
* **graph outputs**: which outputs overlap an input or another output (their example
  values' storage spans) must not change (``cat(split(x)) -> x`` as an output makes the
  output the input itself; two outputs that become one tensor);
* **effects** (:mod:`optimus_lens.core.aliasing`): no read of an alias class moves across
  a write to it, no node moves across a region boundary (grad mode, autocast), no node
  with effects is created, erased or moved. Positions after the step are the ones
  :meth:`optimus_lens.core.index.GraphIndex.repair` will give (simulated here, exactly,
  before the step commits).

:func:`replacement_miss` answers for one replacement by an existing value (a pattern's
``match`` asks it: the Miss shows in ``optimus why``); :class:`StepCheck` is the engine's
listener that checks a whole step and raises :class:`UnsafeRewrite` (the step is rolled
back and recorded with the reason).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import torch
from torch.fx import Node

from optimus_lens.core import aliasing, meta
from optimus_lens.core.effects import alias_root, effect
from optimus_lens.core.listener import swapped_input
from optimus_lens.core.miss import Miss
from optimus_lens.core.outputs import eager_tensor, output_chain, output_of, outputs_miss
from optimus_lens.core.rewriter import Listener, Rewriter
from optimus_lens.core.strides import offset_use


class UnsafeRewrite(RuntimeError):
    """A step would compute something other than the original program: another dtype,
    another storage offset where a use reads it, other overlaps among graph outputs and
    inputs, or a read moved across a write or a region boundary. The message says which."""


# ----------------------------------------------------------------------------- values


def dtype_miss(old: Node, new: Any) -> Miss | None:
    """A Miss when ``new`` would replace ``old`` with another dtype."""
    return _dtype_miss(old, new, eager_tensor(old), eager_tensor(new))


def offset_miss(old: Node, new: Any, users: list[Node] | None = None) -> Miss | None:
    """A Miss when ``new`` starts at another storage offset than ``old`` and a use of
    ``old`` (``users``, default all) reads the offset, directly or through a view."""
    return _offset_miss(old, new, eager_tensor(old), eager_tensor(new), users)


def move_miss(old: Node, new: Any, users: list[Node] | None = None) -> Miss | None:
    """:func:`dtype_miss` or :func:`offset_miss`, reading each value once."""
    a, b = eager_tensor(old), eager_tensor(new)
    return _dtype_miss(old, new, a, b) or _offset_miss(old, new, a, b, users)


def _dtype_miss(old: Node, new: Any, a: torch.Tensor | None, b: torch.Tensor | None) -> Miss | None:
    if a is None or b is None or a.dtype == b.dtype:
        return None
    return Miss(f"{_name(new)} is {_dt(b)} where {old.name} is {_dt(a)} (a replacement must keep the dtype)")


def _offset_miss(
    old: Node, new: Any, a: torch.Tensor | None, b: torch.Tensor | None, users: list[Node] | None
) -> Miss | None:
    if a is None or b is None:
        return None
    try:
        same = int(a.storage_offset()) == int(b.storage_offset())
    except Exception:  # noqa: BLE001 - a symbolic offset: cannot prove them equal
        same = False
    if same or not aliasing.offset_readers(old.graph):  # no node of the graph reads an offset
        return None
    use = offset_use(old, list(old.users) if users is None else users)
    if use is None:
        return None
    return Miss(
        f"{use[0].name} reads the storage offset of {old.name} ({use[1]}); {_name(new)} starts at offset "
        f"{_off(b)} where {old.name} starts at {_off(a)}"
    )


def _dtyped(n: Node) -> torch.Tensor | None:
    """A tensor with the dtype of :func:`optimus_lens.core.outputs.eager_tensor` of ``n``: its own
    example value where it has one (eager mode returns an input itself only from an op whose
    result has that input's dtype: eval-mode dropout, ``contiguous``, ``to`` its own dtype), else
    the eager one, read up the nodes that return their input."""
    v = meta.value(n)
    return v if isinstance(v, torch.Tensor) else eager_tensor(n)


def _off(t: torch.Tensor) -> str:
    try:
        return str(int(t.storage_offset()))
    except Exception:  # noqa: BLE001
        return str(t.storage_offset())


def _dt(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


def _name(n: Any) -> str:
    return n.name if isinstance(n, Node) else repr(n)


def trial_miss(rewrite: Any, match: Any, graph: Any) -> Miss | None:
    """Why the rewrite ``rewrite(rw, match)`` must be refused, found by making it: it runs on
    a trial Rewriter with a :class:`StepCheck` (and the layout guard's copies), then is
    rolled back, FX's name counters included, so the real step names its nodes the same.
    For a pattern's ``match`` where the site feeds a graph output: whether a split/cat
    rewrite turns a fresh output into a view of an input depends on strides the rewrite
    computes (a slice with other strides gets a contiguous copy). None when the rewrite is
    safe or raises (the engine reports that)."""
    ns = graph._graph_namespace
    used, counts = set(ns._used_names), dict(ns._base_count)
    ge = aliasing.analysis(graph)
    pos = ge.positions if ge.positions is not None else {n: i for i, n in enumerate(graph.nodes)}
    safe = StepCheck(pos)
    rw = Rewriter(graph, [safe])
    miss = None
    try:
        rewrite(rw, match)
        safe.verify(graph, rw.original_args)
    except UnsafeRewrite as e:
        miss = Miss(str(e))
    except Exception:  # noqa: BLE001 - a rewrite that fails is the engine's to report
        miss = None
    finally:
        rw.rollback()
        ns._used_names, ns._base_count = used, counts
    return miss


# ----------------------------------------------------------------------------- one replacement


def replacement_miss(old: Node, new: Any) -> Miss | None:
    """Why replacing every use of ``old`` by the existing value ``new`` would change what
    the program computes, or None (for a pattern's ``match``: the same rules as
    :class:`StepCheck`). Checks the dtype, the storage offset where a use reads it, the
    graph outputs' overlaps, and that no write to ``old``'s or ``new``'s alias class lies
    between ``old`` and a use of it."""
    if not isinstance(new, Node):
        return None
    miss = move_miss(old, new)
    if miss:
        return miss
    out = next((u for u in old.users if u.op == "output"), None)
    if out is not None:
        after = torch.fx.node.map_arg(out.args, lambda n: new if n is old else n)
        miss = outputs_miss(old.graph, out.args, after)
        if miss:
            return miss
    elif old in output_chain(old.graph):  # an output is a view of old
        out = output_of(old.graph)
        miss = outputs_miss(old.graph, out.args, out.args, subst={old: new}) if out is not None else None
        if miss:
            return miss
    ge = aliasing.analysis(old.graph)
    if ge.quiet:
        return None
    classes = ge.written_classes(new) | ge.written_classes(old)
    start = ge.pos(old)
    for u in old.users:
        if u.op == "output":
            continue
        for c in classes:
            if ge.epoch(c, start) != ge.epoch(c, ge.pos(u)):
                w = ge.writers(c)[ge.epoch(c, start)][1]
                return Miss(f"{w.name} writes {_name(new)}'s storage between {old.name} and its use {u.name}")
    return snapshot_miss(ge, old, old.all_input_nodes, new, start, ge.pos(new))


def _derived_from(n: Node, src: Node, limit: int = 256) -> bool:
    """Whether ``src`` is ``n`` or an ancestor of it (a bounded walk up the inputs)."""
    seen, todo = {n}, [n]
    while todo and len(seen) < limit:
        m = todo.pop()
        if m is src:
            return True
        for i in m.all_input_nodes:
            if i not in seen:
                seen.add(i)
                todo.append(i)
    return len(seen) >= limit  # too far to tell: assume it is (the other checks then apply)


def snapshot_miss(
    ge: aliasing.GraphEffects, old: Node, old_inputs: list[Node], new: Node, at_old: Any, at_new: Any
) -> Miss | None:
    """A Miss when ``new``, an existing value computed independently of ``old`` (not an
    ancestor of it), would replace ``old`` although a write to storage that either
    computation reads lies between them: the two read it in different states (``b =
    x.clone()`` after ``x.add_(1)`` is not ``a = x.clone()`` before it). ``at_old`` and
    ``at_new`` are their positions in program order; ``old_inputs`` are ``old``'s inputs
    (recorded before an erase). A ``new`` that is a graph input or an alias of one reads
    memory at its use, not at its definition: the writes between ``old`` and its uses
    decide (:func:`replacement_miss`, :class:`StepCheck`)."""
    if ge.quiet:
        return None
    root = alias_root(new)
    if root.op in ("placeholder", "get_attr"):
        return None
    classes = {c for i in old_inputs for c in ge.written_classes(i)}
    classes |= {c for i in root.all_input_nodes for c in ge.written_classes(i)}
    lo, hi = sorted((at_new, at_old))
    for c in classes:
        between = [w for p, w in ge.writers(c) if lo < p < hi]
        if between and not _derived_from(old, new):
            return Miss(
                f"{between[0].name} writes storage that {old.name} and {new.name} read, between them "
                f"(they read it in different states)"
            )
    return None


def identity_miss(replace: Any, root: Node, bindings: dict, pieces: bool) -> Miss | None:
    """For a rule whose replacement is existing values (an identity: ``replace`` builds no
    node), the first replacement :func:`replacement_miss` refuses: another dtype (a
    promoting stack/cat), another storage offset where a use reads it, a graph output that
    would overlap an input or another output, a write between the value and a use.
    ``replace(rw, **bindings)`` is the rule's replacement, called here with a stand-in
    Rewriter; a rule that builds nodes is checked when it does (:class:`StepCheck`).
    ``pieces``: one value per ``getitem`` user of ``root`` (a tuple-valued root)."""
    try:
        new = replace(_NO_REWRITER, **bindings)
    except Exception:  # noqa: BLE001 - it builds nodes, or the rewrite itself will report it
        return None
    if pieces:
        if not isinstance(new, (list, tuple)):
            return None
        n = len(new)
        pairs = [(g, new[g.args[1]]) for g in root.users if type(g.args[1]) is int and -n <= g.args[1] < n]
    else:
        pairs = [(root, new)]
    for old, value in pairs:
        miss = replacement_miss(old, value)
        if miss:
            return miss
    return None


class _NoRewriter:
    """Stands for the Rewriter when a rule's replacement is computed at match time: any use
    of it means the replacement builds nodes (then it is not an identity)."""

    def __getattr__(self, name: str) -> Any:
        raise LookupError(f"the replacement builds nodes ({name})")


_NO_REWRITER: Any = _NoRewriter()


# ----------------------------------------------------------------------------- the step


class StepCheck(Listener):
    """The engine's check of one step (a Rewriter listener: see
    :class:`optimus_lens.core.rewriter.Listener`): collects the step's changes, then
    :meth:`verify` raises :class:`UnsafeRewrite` naming the first rule it breaks (see the
    module docstring). ``positions`` is the engine's index (``GraphIndex.pos``) before
    the step commits: every node that existed before the step, erased ones included."""

    def __init__(self, positions: Mapping[Node, int]):
        self.positions = positions
        self.created: list[Node] = []
        self.erased: list[Node] = []
        self.rewired: list[Node] = []
        self.moves: list[tuple[Node, Node, list[Node]]] = []
        self.erased_args: dict[Node, tuple] = {}  # an erased node's (args, kwargs), which FX clears
        self.erased_effectful: list[Node] = []
        self.output_node: Node | None = None

    # ---------------------------------------------------------------- listener
    def notify_inserted(self, node: Node) -> None:
        self.created.append(node)

    def notify_inserted_each(self, nodes: list[Node]) -> None:
        self.created.extend(nodes)

    def notify_erased(self, node: Node) -> None:
        self.notify_erased_each([node])

    def notify_erased_each(self, nodes: list[Node]) -> None:
        self.erased.extend(nodes)
        if not nodes:
            return
        kept = self.erased_args
        known = aliasing.classifier(nodes[0].graph)
        for node in nodes:
            kept[node] = (node._args, node._kwargs)  # FX's own objects: it replaces them on erase
            effectful = known(node)  # read now: an erased node has no arguments left
            if effectful or effectful is None and effect(node).effectful:
                self.erased_effectful.append(node)

    def _inputs_of(self, n: Node) -> list[Node]:
        """``n``'s input nodes; an erased node's as they were when the step erased it."""
        if not n._erased:
            return n.all_input_nodes
        args = self.erased_args.get(n)
        if args is None:
            return []
        found: list[Node] = []
        torch.fx.node.map_arg(args, found.append)
        return list(dict.fromkeys(found))

    def notify_replaced(self, old: Node, new: Node, users: list[Node]) -> None:
        self.notify_replaced_each([(old, new, users)])

    def notify_replaced_each(self, moves: list[tuple[Node, Node, list[Node]]]) -> None:
        self.moves.extend(moves)
        rewired = self.rewired
        for _, _, users in moves:
            rewired.extend(users)
        if self.output_node is None:
            self.output_node = next((u for _, _, users in moves for u in users if u.op == "output"), None)

    def notify_modified(self, node: Node, old_inputs: list[Node]) -> None:
        self.rewired.append(node)
        if node.op == "output":
            self.output_node = node
        swap = swapped_input(node, old_inputs)
        if swap is not None:
            self.moves.append((*swap, [node]))

    def rolled_back(self) -> None:
        self.__init__(self.positions)  # type: ignore[misc]

    # ---------------------------------------------------------------- the check
    def verify(self, graph, original: Any = None) -> None:
        """Raise :class:`UnsafeRewrite` if the step breaks a rule of the module docstring.
        ``original(node)`` gives a node's arguments before the step (the Rewriter's
        :meth:`~optimus_lens.core.rewriter.Rewriter.original_args`), for the graph outputs."""
        readers = aliasing.offset_readers(graph) if self.moves else None  # none: no offset is read
        for old, new, users in self.moves:
            if new._erased:
                continue
            live = [u for u in users if not u._erased and new in u._input_nodes]  # a dict: O(1)
            if not live:
                continue
            if readers:
                a, b = eager_tensor(old), eager_tensor(new)
                miss = _dtype_miss(old, new, a, b) or _offset_miss(old, new, a, b, live)
            else:  # the dtype alone: a node that returns its input itself has that input's dtype
                miss = _dtype_miss(old, new, _dtyped(old), _dtyped(new))
            if miss:
                raise UnsafeRewrite(str(miss))
        out = self.output_node or output_of(graph)
        before = original(out) if out is not None and original is not None else None
        if out is not None and before is None and self.rewired:
            chain = output_chain(graph)
            if any(n in chain for n in self.rewired):  # a view an output is now views something else
                before = out.args
        if out is not None and before is not None:
            miss = outputs_miss(graph, before, out.args, self._moved())
            if miss:
                raise UnsafeRewrite(str(miss))
        with aliasing.positions_during(graph, self.positions) as ge:  # one numbering: before the step
            if ge.quiet and not self.erased_effectful:
                return
            self._effects(ge)

    def _moved(self) -> dict[Node, dict[Node, Node]]:
        """For each node whose inputs the step changed: new input -> old input."""
        moved: dict[Node, dict[Node, Node]] = {}
        for old, new, users in self.moves:
            for u in users:
                moved.setdefault(u, {}).setdefault(new, old)
        return moved

    def _effects(self, ge: aliasing.GraphEffects) -> None:
        pos = self.positions
        created = [n for n in dict.fromkeys(self.created) if not n._erased]
        erased = [n for n in dict.fromkeys(self.erased) if n in pos]  # created-then-erased nodes have no place
        for n in created:
            if effect(n).effectful:
                raise UnsafeRewrite(f"the step creates {n.name}, which {_what(n)}")
        for n in self.erased_effectful:
            if n in pos:
                raise UnsafeRewrite(f"the step erases {n.name}, which writes, draws random numbers or changes state")
        place = final_places(pos, created, [r for r in self.rewired if not r._erased])
        if ge.quiet:
            return

        def at(n: Node) -> Fraction | int:
            got = place.get(n)
            return pos[n] if got is None else got

        def reads(e: Node) -> set:
            return {c for i in self._inputs_of(e) for c in ge.written_classes(i)}

        regions = {ge.region(e, at=pos[e]) for e in erased}
        if len(regions) > 1:
            raise UnsafeRewrite("the nodes the step replaces lie in different grad-mode or autocast regions")
        for n in created:
            if regions and ge.region(n, at=at(n)) not in regions:
                raise UnsafeRewrite(
                    f"{n.name} would run in another grad-mode or autocast region than the nodes it replaces"
                )
            for c, via in ge.reads(n).items():
                readers = [e for e in erased if c in reads(e)] or erased
                want = {ge.epoch(c, pos[e]) for e in readers}
                if want and (len(want) > 1 or ge.epoch(c, at(n)) not in want):
                    ws = ", ".join(w.name for _, w in ge.writers(c)[:3])
                    raise UnsafeRewrite(
                        f"{n.name} reads {via.name} on the other side of a write to its storage ({ws}) "
                        f"from the nodes it replaces"
                    )
        for v, p in place.items():
            if v in pos and not v._erased:
                if effect(v).effectful:
                    raise UnsafeRewrite(f"the step would move {v.name}, which {_what(v)}")
                if ge.region(v, at=pos[v]) != ge.region(v, at=p):
                    raise UnsafeRewrite(f"the step would move {v.name} across a grad-mode or autocast boundary")
                for c, via in ge.reads(v).items():
                    if ge.epoch(c, pos[v]) != ge.epoch(c, p):
                        raise UnsafeRewrite(f"the step would move {v.name} across a write to {via.name}'s storage")
        for old, new, users in self.moves:
            if new._erased or not (old in place or old in pos) or not (new in place or new in pos):
                continue
            start = at(old)
            if ge.region(old, at=start) != ge.region(new, at=at(new)):
                raise UnsafeRewrite(
                    f"{new.name} comes from another grad-mode or autocast region than {old.name}, which it would replace"
                )
            if new not in place and old in pos:  # an existing value: computed in the same state?
                ins = self._inputs_of(old)
                miss = snapshot_miss(ge, old, ins, new, pos[old], pos[new])
                if miss:
                    raise UnsafeRewrite(str(miss))
            fresh = self._fresh(new)  # a new allocation of this step: the old one's writers may write it
            movers = set(users) if fresh else set()
            classes = ge.written_classes(new) | ge.written_classes(old)
            for u in users:
                if u._erased or new not in u._input_nodes:
                    continue
                if new in effect(u).writes and not fresh:
                    raise UnsafeRewrite(f"{u.name} writes in place into {old.name}, which {new.name} would replace")
                if u.op == "output":
                    continue
                for c in classes:
                    between = [w for p, w in ge.writers(c) if start < p < at(u) and w not in movers]
                    if between:
                        raise UnsafeRewrite(
                            f"{between[0].name} writes {new.name}'s storage between {old.name} and its use {u.name}"
                        )

    def _fresh(self, n: Node) -> bool:
        """Whether ``n`` is storage this step allocated: a node it created whose alias
        chain (views, getitems) stays among the nodes it created."""
        created = set(self.created)
        seen = 0
        while n in created and seen < 64:
            al = effect(n).aliases
            if not al:
                return True
            n, seen = al[0], seen + 1
        return False


def _what(n: Node) -> str:
    e = effect(n)
    if e.writes:
        return f"writes {', '.join(w.name for w in e.writes)} in place"
    if e.rng:
        return "draws random numbers"
    return "changes global state (grad mode, autocast) or has unknown effects"


def final_places(pos: Mapping[Node, int], created: list[Node], rewired: list[Node]) -> dict[Node, Fraction]:
    """Where the step's created nodes, and every node that
    :meth:`optimus_lens.core.index.GraphIndex.repair` will move, end up: a position
    comparable with ``pos`` (the index before the step), strictly between the positions
    of their final neighbours. The same moves as repair, simulated on a copy of the list
    links: a node that precedes its latest input moves right after it, then its users are
    re-checked, first in first out. That is repair in a graph with effects, the only one
    where places are checked; in one without, the engine moves a block instead
    (``GraphIndex.repair(block=True)``), and no proof reads a place."""
    place: dict[Node, Fraction] = {}
    nxt: dict[Node, Node] = {}
    prv: dict[Node, Node] = {}

    def after(n: Node) -> Node:
        return nxt.get(n, n.next)

    def before(n: Node) -> Node:
        return prv.get(n, n.prev)

    def p(n: Node) -> Fraction | int | None:
        got = place.get(n)
        return got if got is not None else pos.get(n)

    for n in created:  # runs of new nodes between placed neighbours, evenly spaced
        if n in place:
            continue
        first = n
        while first.prev.op != "root" and first.prev not in pos and first.prev not in place:
            first = first.prev
        run, m = [], first
        while m.op != "root" and m not in pos and m not in place:
            run.append(m)
            m = m.next
        lo = Fraction(0) if first.prev.op == "root" else Fraction(p(first.prev))  # type: ignore[arg-type]
        hi = lo + len(run) + 1 if m.op == "root" else Fraction(p(m))  # type: ignore[arg-type]
        for k, r in enumerate(run, 1):
            place[r] = lo + (hi - lo) * k / (len(run) + 1)
    work = deque([*created, *rewired])
    while work:
        v = work.popleft()
        if v._erased or v.op == "root":
            continue
        inputs = v.all_input_nodes
        if not inputs:
            continue
        known = [(p(i), i) for i in inputs if p(i) is not None]
        pv = p(v)
        if not known or pv is None:
            continue
        top, latest = max(known, key=lambda x: x[0])
        if top < pv:
            continue
        a, b = before(v), after(v)  # unlink v, link it right after latest
        nxt[a], prv[b] = b, a
        succ = after(latest)
        nxt[latest], prv[v], nxt[v], prv[succ] = v, latest, succ, v
        ps = p(succ) if succ.op != "root" else None
        place[v] = Fraction(top) + 1 if ps is None else (Fraction(top) + Fraction(ps)) / 2
        work.extend(v.users)
    return place
