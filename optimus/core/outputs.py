"""Which graph outputs overlap the graph's inputs or each other, as eager mode lays them out.

A rewrite must not change it (:mod:`optimus_lens.core.stepcheck`): ``cat(split(x)) -> x``
as an output makes the output the input itself, a fusion can make two outputs slices of
one stacked tensor. Read from example values' storage spans
(:func:`optimus_lens.core.aliasing.storage_span`: storage, first byte, one past the last
byte), corrected for what example values do not show: a node whose eager result is its
input itself (eval-mode dropout; its example value is a fresh FakeTensor), and views whose
input a step replaced (their example values still lie in the old input's storage).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from operator import is_
from typing import Any, cast

import torch
from torch.fx import Node

from optimus_lens.core import aliasing, meta
from optimus_lens.core.effects import effect, returns_input
from optimus_lens.core.memo import keep, kept
from optimus_lens.core.miss import Miss


def eager_tensor(n: Any) -> torch.Tensor | None:
    """The example value eager mode would return for ``n``: the input's own, up the nodes
    that return their input itself (:func:`optimus_lens.core.effects.returns_input`)."""
    while isinstance(n, Node) and (r := returns_input(n)) is not None:
        n = r
    v = meta.value(n)
    return v if isinstance(v, torch.Tensor) else None


def output_overlaps(
    values: list[Any],
    graph,
    spans_in: list[Any] | InputSpans | None = None,
    moved: Mapping[Node, Mapping[Node, Node]] | None = None,
    subst: Mapping[Node, Node] | None = None,
) -> list[tuple[tuple[int, ...], tuple[int, ...]]] | None:
    """For each graph output value (a node or a constant): the placeholders (by index)
    and the other outputs whose memory it overlaps, from example values (storage spans);
    None when a span cannot be read (symbolic sizes without hints). ``spans_in``: the
    placeholders' spans when the caller has them, as :func:`input_spans` (read per storage
    an output lies in) or as the list :func:`placeholder_spans` gives. ``moved`` and
    ``subst`` describe a step whose views still carry the values of what they viewed
    before it (:func:`live_span`)."""
    inputs = spans_in if isinstance(spans_in, InputSpans) else None
    if spans_in is None:
        inputs = input_spans(graph)
    spans_out = [live_span(v, moved or {}, subst or {}) for v in values]
    if any(s is False for s in spans_out):
        return None
    if inputs is None:
        if any(s is False for s in cast(list, spans_in)):
            return None
        inputs = InputSpans.of_spans(cast(list, spans_in))
    elif inputs.unreadable:
        return None
    outs_of = _by_storage(spans_out)  # O(n) for distinct storages
    others_of: dict[int, list[int]] = {}
    for group in outs_of.values():
        if len(group) > 1:
            _overlapping(group, others_of)
    out = []
    for i, s in enumerate(spans_out):
        if s is None:
            out.append(((), ()))
            continue
        group = inputs.sharing(s[0])
        if group is None:  # an input of this storage has a span that cannot be read
            return None
        ins = tuple(j for j, t in group if _overlap(s, t))
        out.append((ins, tuple(sorted(others_of.get(i, ())))))
    return out


def _overlapping(group: list[tuple[int, Any]], into: dict[int, list[int]]) -> None:
    """Every pair of overlapping spans of one storage (``group``: (index, span)), added to
    ``into`` both ways: a sweep in order of first byte, O(k log k + pairs), where comparing
    every pair was quadratic in the outputs that share a storage (the 128 slices of one
    batched result, in a training forward graph that returns them all)."""
    live: list[tuple[int, int]] = []  # (one past the last byte, index) of the spans still open
    for j, t in sorted(group, key=lambda e: e[1][1]):
        lo, hi = t[1], t[2]
        if lo >= hi:  # an empty span overlaps nothing
            continue
        while live and live[0][0] <= lo:
            heapq.heappop(live)
        for _, k in live:  # each open span starts at or before lo and ends after it
            into.setdefault(j, []).append(k)
            into.setdefault(k, []).append(j)
        heapq.heappush(live, (hi, j))


def _by_storage(spans: list[Any]) -> dict[Any, list[tuple[int, Any]]]:
    """Spans grouped by storage key, each with its index, in index order."""
    got: dict[Any, list[tuple[int, Any]]] = {}
    for j, t in enumerate(spans):
        if t is not None:
            got.setdefault(t[0], []).append((j, t))
    return got


_SPANS = "_optimus_placeholder_spans"  # (placeholders, values, spans) kept on a graph (core.memo.keep)


def placeholder_spans(graph) -> list[Any]:
    """The storage span of every placeholder's tensor value, in placeholder order (see
    :func:`output_overlaps`). Kept per graph while its placeholders and their example
    values stay the same objects (a step rarely touches them; the towers graph at 21k
    nodes has ~10k)."""
    return _kept_per_inputs(graph, _SPANS, lambda values: [_placeholder_span(v) for v in values])


def _kept_per_inputs(graph, key: str, build: Callable[[list[Any]], Any]) -> Any:
    """``build(values)`` of the placeholders' example values, kept on ``graph`` under
    ``key`` while its placeholders and their example values stay the same objects. Both are
    compared by identity in C loops (``map(operator.is_, ...)``): a graph at 21k nodes has
    ~10k placeholders, and a step that touches the outputs asks again."""
    ps = _placeholders(graph)
    values = list(map(meta.value, ps))
    got = kept(graph, key)
    if got is not None and len(got[0]) == len(ps) and all(map(is_, got[0], ps)) and all(map(is_, got[1], values)):
        return got[2]
    made = build(values)
    keep(graph, key, (ps, values, made))
    return made


_INPUTS = "_optimus_input_spans"  # (placeholders, values, InputSpans) kept on a graph (core.memo.keep)


class InputSpans:
    """The placeholders' storage spans (:func:`placeholder_spans`) by storage, each
    storage's read when an output of it is asked about (:meth:`sharing`): most inputs (a
    model's parameters) share a storage with no output, so their spans are never needed.
    ``unreadable``: some input's span cannot be read (no storage; symbolic sizes without
    hints), so overlaps cannot be decided (:func:`output_overlaps` answers None)."""

    def __init__(self, values: list[Any]):
        self.unreadable = False
        self._inputs = values
        # storage key -> the index of its one placeholder, or the list of them (in order) where
        # several share it: an int per input, not a pair and a list (a model has ~10k inputs)
        self._values: dict[Any, int | list[int]] = {}
        self._spans: dict[Any, list[tuple[int, Any]] | None] = {}
        index = self._values
        for j, v in enumerate(values):
            if not isinstance(v, torch.Tensor):
                continue
            k = meta.storage_key(v)  # the key of its span (aliasing.storage_span)
            # only a static strided input's span is read when an output asks for its storage;
            # any other is read now, so an unreadable one is known before any output is asked about
            if k is None or not meta.static_strided(v) and _placeholder_span(v) is False:
                self.unreadable = True
                continue
            had = index.setdefault(k, j)
            if type(had) is list:
                had.append(j)
            elif had != j:
                index[k] = [had, j]

    @classmethod
    def of_spans(cls, spans: list[Any]) -> InputSpans:
        """The same, from spans already read (:func:`placeholder_spans`; none ``False``)."""
        got = cls([])
        for k, group in _by_storage(spans).items():
            got._spans[k] = group
        return got

    def sharing(self, key: Any) -> list[tuple[int, Any]] | None:
        """(placeholder index, span) of every input in storage ``key``, in placeholder
        order; None (and ``unreadable`` set) when one of their spans cannot be read."""
        got = self._spans.get(key, _UNSEEN)
        if got is _UNSEEN:
            js = self._values.get(key, ())
            got = [(j, _placeholder_span(self._inputs[j])) for j in ([js] if type(js) is int else js)]
            if any(t is False for _, t in got):
                self.unreadable, got = True, None
            self._spans[key] = got
        return cast(Any, got)


def input_spans(graph) -> InputSpans:
    """:class:`InputSpans` of ``graph``'s placeholders, kept per graph while its
    placeholders and their example values stay the same objects (see
    :func:`placeholder_spans`)."""
    return _kept_per_inputs(graph, _INPUTS, InputSpans)


def _placeholder_span(v: Any) -> Any:
    """:func:`_span` of a placeholder whose example value is ``v``: a placeholder returns
    no input and aliases none, so its span is its own value's."""
    if not isinstance(v, torch.Tensor):
        return None
    s = aliasing.storage_span(v)
    return False if s is None else s


def _placeholders(graph) -> list[Node]:
    """The graph's placeholders in graph order: the run of them the node list starts with
    (where FX and Dynamo put them), read without walking the rest of the graph when FX's
    lookup table counts no other; else every node's op."""
    lead: list[Node] = []
    for n in graph.nodes:
        if n.op != "placeholder":
            break
        lead.append(n)
    try:
        total = len(graph.find_nodes(op="placeholder", sort=False))
    except Exception:  # noqa: BLE001 - a graph without FX's lookup table
        total = -1
    if total == len(lead):
        return lead
    return [n for n in graph.nodes if n.op == "placeholder"]


def _span(n: Any, depth: int = 0) -> Any:
    """The storage span of a node's tensor value as eager mode would lay it out; None for
    a non-tensor; False when unreadable.

    A node whose eager result is its input itself (:func:`returns_input`: eval-mode
    dropout) may carry a fresh example value (Dynamo's and ``meta.infer``'s are): the span
    of it, and of every view taken of it, is moved into the storage of the input it
    returns (``flatten(movedim(dropout(x)))`` overlaps ``x``)."""
    memo = _SPAN_MEMO[-1] if _SPAN_MEMO else None
    if memo is not None and isinstance(n, Node):
        got = memo.get(n, _UNSEEN)
        if got is _UNSEEN:
            got = memo[n] = _read_span(n, depth)
        return got
    return _read_span(n, depth)


_SPAN_MEMO: list[dict] = []  # while one check runs (the graph cannot change): node -> its span
_UNSEEN = object()


def _read_span(n: Any, depth: int) -> Any:
    t = eager_tensor(n) if isinstance(n, Node) else None
    if t is None:
        return None
    s = aliasing.storage_span(t)
    if s is None:
        return False
    owner = n
    seen = {n}
    while (src := returns_input(owner)) is None:  # up the views that share this storage
        up = [a for a in effect(owner).aliases if a not in seen and _key(a) == s[0]]
        if not up:
            return s
        owner = up[0]
        seen.add(owner)
    if owner is n or depth > 64:  # eager_tensor already read the input's own value
        return s
    base, mine = _span(src, depth + 1), aliasing.storage_span(meta.value(owner))
    if not base or mine is None:
        return base if base is not None else s
    shift = base[1] - mine[1]  # the owner's value is its input's: same layout, other storage
    return (base[0], s[1] + shift, s[2] + shift)


def live_span(n: Any, moved: Mapping[Node, Mapping[Node, Node]], subst: Mapping[Node, Node], depth: int = 0) -> Any:
    """:func:`_span` of ``n`` as it is after a step that changed what a view reads, whose
    example value was computed from the input it had before (``reshape(y)`` with ``y``
    replaced by ``flatten(movedim(stacked))``: its value still lies in ``y``'s storage).
    ``moved``: for each node whose inputs the step changed, new input -> old input;
    ``subst``: for a replacement not made yet, old -> new. Up the alias edges to the input
    whose storage the value shares: when that input now lies elsewhere, the span moves with
    it (the view keeps its place relative to what it views: the layout checks prove the
    replacement's strides and offset equal where a view reads them)."""
    s = _span(n)
    if not s or depth > 64 or not isinstance(n, Node) or not (moved or subst):
        return s
    was = moved.get(n, {})
    for a in effect(n).aliases:
        r = _span(was.get(a, a))  # what the value was computed from
        if not r or r[0] != s[0]:
            continue
        now = live_span(subst.get(a, a), moved, subst, depth + 1)
        if now is False:
            return False
        if not now or now == r:
            return s
        shift = now[1] - r[1]
        return (now[0], s[1] + shift, s[2] + shift)
    return s


def output_of(graph) -> Node | None:
    """The graph's output node, or None."""
    return next(iter(graph.find_nodes(op="output")), None)


def output_chain(graph, limit: int = 4096) -> set[Node]:
    """The graph outputs' values and every node whose storage one of them may share: up
    the alias edges (views, ``getitem`` of a split) and the inputs a node returns as
    themselves. A rewrite that changes any of them can change which outputs overlap."""
    out = output_of(graph)
    if out is None:
        return set()
    seen: set[Node] = set()
    todo = [a for a in _flat_outputs(out.args) if isinstance(a, Node)]
    while todo and len(seen) < limit:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        e = effect(m)
        todo.extend(e.aliases)
        if e.identity is not None:
            todo.append(e.identity)
    return seen


def _key(n: Node) -> Any:
    v = meta.value(n)
    return aliasing.storage_key(v) if isinstance(v, torch.Tensor) else None


def _overlap(a: Any, b: Any) -> bool:
    return a is not None and b is not None and a[0] == b[0] and a[1] < b[2] and b[1] < a[2]


def _flat_outputs(args: Any) -> list[Any]:
    out: list[Any] = []
    torch.fx.node.map_aggregate(args, out.append)
    return [v for v in out if not isinstance(v, (tuple, list, dict))]


def outputs_miss(
    graph,
    before: Any,
    after: Any,
    moved: Mapping[Node, Mapping[Node, Node]] | None = None,
    subst: Mapping[Node, Node] | None = None,
) -> Miss | None:
    """A Miss when the graph outputs ``after`` (the output node's arguments) overlap the
    inputs or each other differently from ``before``; ``moved`` / ``subst``: the step's
    changes to the views the outputs are (:func:`live_span`)."""
    b, a = _flat_outputs(before), _flat_outputs(after)
    if len(a) != len(b):
        return None
    spans_in = input_spans(graph)  # once for both (a graph at 21k nodes has ~10k placeholders)
    _SPAN_MEMO.append({})  # both sides read the same graph: each node's span once
    try:
        ob, oa = output_overlaps(b, graph, spans_in), output_overlaps(a, graph, spans_in, moved, subst)
    finally:
        _SPAN_MEMO.pop()
    if ob is None or oa is None or ob == oa:
        return None
    i = next(k for k in range(len(oa)) if oa[k] != ob[k])
    return Miss(
        f"graph output {i} would overlap {_overlap_text(oa[i])} where it overlapped {_overlap_text(ob[i])} "
        f"(the caller could see a write to one in the other)"
    )


def _overlap_text(sig: tuple) -> str:
    ins, outs = sig
    parts = [f"input {j}" for j in ins] + [f"output {j}" for j in outs]
    return ", ".join(parts) if parts else "nothing"
