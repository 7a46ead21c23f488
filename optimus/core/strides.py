"""Memory layout is semantics: which uses of a value read its strides, and whether a
replacement keeps them.

Strides come from each node's FakeTensor ``example_value`` (``meta.tensor(n).stride()``).
A rewrite may give a value a different layout only where nothing depends on it:
:func:`broken_use` says whether a use of the replaced value would see the difference,
:meth:`optimus_lens.core.rewriter.Rewriter.replace_all_uses` then gives those uses a copy laid out
as before (``contiguous()``, as the outputs of ``cat``, ``stack``, ``linear`` and
``layer_norm`` are, or permute + contiguous + permute back for a dense transposed
layout) or raises :class:`LayoutError`, :func:`replace_miss` lets a pattern refuse in
``match`` with a Miss naming the user and the layout it needs, and the engine's
``LayoutCheck`` fails any step that still changed strides a use depends on.

The table of layout-sensitive uses (``SENSITIVE_METHODS`` / ``SENSITIVE_FUNCTIONS`` and
the rules in :func:`direct_reason` and :func:`broken_use`), with where each rule comes from:

* ``Tensor.view`` / ``view_as``: raise when the new shape is incompatible with the
  strides ("view size is not compatible with input tensor's size and stride"; docs of
  ``torch.Tensor.view``); so ``cat(...).view(-1)`` works and a transposed tensor's
  ``.view(-1)`` raises.
* ``as_strided`` (function and method): reinterprets the storage with explicit strides
  and the tensor's ``storage_offset``; a view of another tensor reads other elements,
  silently (docs of ``torch.as_strided``: "prefer other view functions").
* ``stride``, ``is_contiguous``, ``data_ptr``, ``storage_offset``, ``untyped_storage``,
  ``numpy``: return the layout itself, so the program's values may depend on it.
* in-place ops (``add_``, ``operator.iadd``, ``inplace=True``, ``out=``): write
  through the layout into whatever the value aliases (aliasing itself is refused by the
  patterns' ``mutation_miss``; the layout check covers the strides).
* the graph's output: the caller receives the tensor and may do any of the above; eager
  mode's outputs of ``cat``/``linear``/... are contiguous, and upstream's
  ``unbind_stack_to_slices`` and ``batch_linear_lhs`` turn them into views
  (docs/parity.md, "memory layout").
* every other use that is not a fresh-output op (``FRESH_FUNCTIONS`` / ``FRESH_METHODS``:
  ``contiguous``, ``linear``, ``matmul``, ``cat``, ``stack``, ``layer_norm``,
  reductions) passes a layout on: it is re-run on FakeTensors with the new value and its
  result's uses are checked the same way, up to ``PROPAGATE_DEPTH`` hops. So a pointwise
  op (TensorIterator keeps its input's stride order, dense) or a ``reshape`` (which copies
  what it cannot view) only counts when a different layout reaches a use in the table.
"""

from __future__ import annotations

import operator
from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx import Node

from optimus_lens.core import meta
from optimus_lens.core.effects import effect, returns_input, writes_inputs
from optimus_lens.core.miss import Miss

SENSITIVE_METHODS = {
    "view": "view needs strides compatible with the new shape",
    "view_as": "view_as needs strides compatible with the new shape",
    "as_strided": "as_strided reads the storage with explicit strides",
    "stride": "stride() returns the strides",
    "is_contiguous": "is_contiguous() reads the strides",
    "data_ptr": "data_ptr() reads the storage address",
    "storage_offset": "storage_offset() reads the layout",
    "untyped_storage": "untyped_storage() exposes the storage",
    "numpy": "numpy() shares the storage and its strides",
}
SENSITIVE_FUNCTIONS = {
    torch.as_strided: "as_strided reads the storage with explicit strides",
    torch.Tensor.view: "view needs strides compatible with the new shape",
    torch.Tensor.as_strided: "as_strided reads the storage with explicit strides",
}
#: uses that read where a tensor starts in its storage, or the storage itself, with the reason
OFFSET_METHODS = {
    "storage_offset": "storage_offset() returns it",
    "data_ptr": "data_ptr() is the storage address plus the offset",
    "untyped_storage": "untyped_storage() exposes the whole storage",
    "set_": "set_ reads the storage",
}
OFFSET_DEPTH = 8
_TENSOR_AS_STRIDED = torch.Tensor.as_strided  # one object (a method descriptor), compared by identity
FRESH_FUNCTIONS = {
    torch._C._nn.linear,
    F.linear,
    torch.matmul,
    operator.matmul,
    torch.mm,
    torch.bmm,
    torch.addmm,
    torch.baddbmm,
    torch.cat,
    torch.concat,
    torch.concatenate,
    torch.stack,
    F.layer_norm,
    torch.layer_norm,
    torch.sum,
    torch.mean,
    torch.amax,
    torch.amin,
    torch.einsum,
    torch.functional.einsum,
    torch.Tensor.contiguous,
}
FRESH_METHODS = {
    "contiguous",
    "sum",
    "mean",
    "amax",
    "amin",
    "matmul",
    "mm",
    "bmm",
    "addmm",
    "size",
    "dim",
    "numel",
    "__matmul__",
}
PROPAGATE_DEPTH = 8


def direct_reason(user: Node, stands: tuple[Node, ...]) -> str | None:
    """Why ``user`` reads the layout of its input (any node of ``stands``, which stand
    for one value) itself: a row of the table, or None."""
    if user.op == "output":
        return "a graph output (the caller sees its strides)"
    if user.op == "call_method":
        r = SENSITIVE_METHODS.get(user.target)
        if r is not None and user.args and user.args[0] in stands:
            return r
    elif user.op == "call_function":
        r = SENSITIVE_FUNCTIONS.get(user.target)
        if r is not None and user.args and user.args[0] in stands:
            return r
    if writes_inputs(user):
        return "an in-place write through its strides"
    return None


def offset_reason(user: Node, stands: tuple[Node, ...]) -> str | None:
    """Why ``user`` reads the storage offset of its input (any node of ``stands``), or
    None: ``as_strided`` with an explicit ``storage_offset`` (it addresses the storage from
    its start, docs of ``torch.as_strided``), or a method of ``OFFSET_METHODS``."""
    if not user.args or user.args[0] not in stands:
        return None
    return reads_offset(user)


def reads_offset(user: Node) -> str | None:
    """Why ``user`` reads the storage offset of its first argument, whatever that is (see
    :func:`offset_reason`), or None. A property of the node alone, so a graph can keep the
    set of its nodes that read one (:func:`optimus_lens.core.aliasing.offset_readers`)."""
    target = user.target
    if user.op == "call_method":
        r = OFFSET_METHODS.get(target)
        if r is not None:
            return r
    if target is torch.as_strided or target is _TENSOR_AS_STRIDED or target == "as_strided":
        if len(user.args) > 3 or "storage_offset" in user.kwargs:
            return "as_strided with an explicit storage offset addresses the storage from its start"
    return None


def offset_use(node: Node, users: list[Node], depth: int = OFFSET_DEPTH) -> tuple[Node, str] | None:
    """The first of ``users`` (uses of ``node``) that reads ``node``'s storage offset,
    directly (:func:`offset_reason`) or through a value that aliases it (a view of it,
    :func:`optimus_lens.core.effects.effect`'s ``aliases``), ``depth`` hops deep; with the
    reason. None when no use reads it."""
    for u in users:
        r = offset_reason(u, (node,))
        if r is not None:
            return u, r
        if depth > 0 and u.op in ("call_function", "call_method") and node in effect(u).aliases:
            sub = offset_use(u, list(u.users), depth - 1)
            if sub is not None:
                return sub[0], f"through {u.name}: {sub[1]}"
    return None


def _fresh(user: Node) -> bool:
    if user.op == "call_function":
        return user.target in FRESH_FUNCTIONS
    if user.op == "call_method":
        return user.target in FRESH_METHODS
    return False


def value(node: Any) -> Any:
    """The node's example value as eager mode lays it out. That is ``meta.value`` except
    for a node that eager mode answers with its input itself
    (:func:`optimus_lens.core.effects.returns_input`: eval-mode ``F.dropout``), whose
    FakeTensor may be a fresh contiguous tensor: then it is the input's value."""
    seen = 0
    while isinstance(node, Node) and seen < 64 and (src := returns_input(node)) is not None:
        node, seen = src, seen + 1
    return meta.value(node)


def eager_strides(graph) -> int:
    """Make the example values carry eager mode's strides where FakeTensors do not: a
    node that eager mode answers with its input itself
    (:func:`optimus_lens.core.effects.returns_input`, e.g. eval-mode ``F.dropout``: a split
    piece keeps its gaps) gets its input's value, whatever its FakeTensor; every node
    downstream whose strides follow is re-run on FakeTensors. One pass in list order,
    O(nodes) plus the re-runs. Returns the number of nodes updated."""
    dirty: set[Node] = set()
    for n in graph.nodes:
        if n.op != "call_function" and n.op != "call_method":
            continue
        src = returns_input(n)
        if src is not None:
            new = meta.value(src)
        elif dirty and any(i in dirty for i in n._input_nodes) and not _fresh(n):
            try:
                new = _simulate(n, (), None)
            except Exception:  # noqa: BLE001 - leave the value as captured
                continue
        else:
            continue
        old = meta.value(n)
        if new is None or old is None or new is old:
            continue
        olds = old if isinstance(old, (list, tuple)) else (old,)
        news = new if isinstance(new, (list, tuple)) else (new,)
        if len(olds) == len(news) and all(
            same_static_strides(a, b) or not isinstance(a, torch.Tensor) for a, b in zip(olds, news)
        ):
            continue
        n.meta[meta.value_key(n)] = new
        dirty.add(n)
    return len(dirty)


def _tensor(node: Any) -> torch.Tensor | None:
    v = value(node)
    return v if isinstance(v, torch.Tensor) else None


def _lay(t: Any) -> tuple | None:
    """A tensor's strides as a comparable tuple: dims of size 1 (whose stride no op
    addresses memory through) as None, symbolic strides by their value for the example
    (the size hints; the second-shape check of verification covers other shapes)."""
    if not isinstance(t, torch.Tensor):
        return None
    try:
        sizes, strides = t.shape, t.stride()
    except Exception:  # noqa: BLE001 - sparse / nested tensors have no strides
        return None
    return tuple(None if _int(n) == 1 else _int(s) for n, s in zip(sizes, strides))


def _int(x: Any) -> Any:
    if type(x) is int:
        return x
    hint = getattr(getattr(x, "node", None), "hint", None)
    return int(hint) if hint is not None else str(x)


def layout(node: Any) -> tuple | None:
    """The node's strides (:func:`_lay` of its ``example_value``), or None without a tensor value."""
    return _lay(_tensor(node))


def _simulate(user: Node, stands: tuple[Node, ...], new_value: torch.Tensor | None) -> Any:
    """``user``'s example value had its input (any of ``stands``) been ``new_value``: its target
    run on FakeTensors. Raises what the op raises (a ``.view`` the new strides forbid)."""
    from torch.fx.node import map_arg

    missing = []

    def get(n: Node):
        if n in stands:
            return new_value
        v = value(n)
        if v is None:
            missing.append(n)
        return v

    args, kwargs = map_arg(user.args, get), map_arg(user.kwargs, get)
    if missing:
        return None
    if user.op == "call_method":
        fn = getattr(type(args[0]), user.target)
    else:
        fn = user.target
    mode = getattr(new_value, "fake_mode", None) or meta._fake_mode_of(torch.utils._pytree.tree_iter((args, kwargs)))
    if mode is not None:
        with mode:
            return fn(*args, **kwargs)
    return fn(*args, **kwargs)


def _static_contiguous(t: torch.Tensor) -> bool:
    """Contiguous, decided on plain-int sizes and strides only (False when any is symbolic).
    A non-empty strided (not nested) tensor with static sizes and strides asks ATen's own
    flag, which is this rule (size-1 dims skipped); any other is read dim by dim (ATen
    calls every empty tensor contiguous). The first three: :func:`optimus_lens.core.meta.static_strided`."""
    if meta.static_strided(t) and t.numel() > 0:
        return t.is_contiguous()
    return _contiguous_per_dim(t)


def _contiguous_per_dim(t: torch.Tensor) -> bool:
    """:func:`_static_contiguous`'s rule, read dim by dim from the last."""
    expected = 1
    for n, st in zip(reversed(t.shape), reversed(t.stride())):
        if type(n) is not int or type(st) is not int:
            return False
        if n != 1 and st != expected:
            return False
        expected *= n
    return True


def same_static_strides(a: Any, b: Any) -> bool:
    """Equal strides, all plain ints (no symbolic comparison, which would add a guard); two
    FakeTensors with static layouts compare their kept records' strides."""
    ra = meta.layout_record(a)
    if ra is not None:
        rb = meta.layout_record(b)
        if rb is not None:
            return ra is rb or ra[1] == rb[1]
    if not (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.layout == torch.strided
        and b.layout == torch.strided
    ):
        return False
    sa, sb = a.stride(), b.stride()
    if not (a._has_symbolic_sizes_strides or b._has_symbolic_sizes_strides):  # plain ints
        return sa == sb
    return len(sa) == len(sb) and all(type(x) is int and type(y) is int and x == y for x, y in zip(sa, sb))


def _broken(
    stands: tuple[Node, ...], old_v: Any, new_v: Any, users: list[Node], depth: int, updates: list[tuple[Node, Any]]
) -> tuple[Node, str] | None:
    """The first use (with its reason) that sees ``new_v``'s layout where it saw
    ``old_v``'s; else None, with ``updates`` extended by the ``(node, value)`` of every
    node whose example value changes strides on the way (so metadata stays true)."""
    if same_static_strides(old_v, new_v):
        return None  # the common case, decided without converting sizes
    if _lay(old_v) is None or _lay(new_v) is None or _lay(old_v) == _lay(new_v):
        return None
    for u in users:
        r = direct_reason(u, stands)
        if r is not None:
            return u, r
        if u.op not in ("call_function", "call_method") or _fresh(u):
            continue
        try:
            u_new = _simulate(u, stands, new_v)
        except Exception as e:  # noqa: BLE001 - the op rejects the new layout
            return u, f"{u.name} raises on the new layout ({type(e).__name__})"
        u_old = value(u)
        if u_new is None or u_old is None:
            continue
        if depth <= 0:
            return u, f"the new layout reaches {u.name}, further than {PROPAGATE_DEPTH} ops"
        if isinstance(u_old, (list, tuple)) and isinstance(u_new, (list, tuple)):
            for g in u.users:
                i = g.args[1] if g.op == "call_function" and g.target is operator.getitem else None
                if type(i) is int and -len(u_old) <= i < len(u_old):
                    sub = _broken((g,), u_old[i], u_new[i], list(g.users), depth - 1, updates)
                    if sub is not None:
                        return u, f"{u.name} -> {g.name} -> {sub[0].name}: {sub[1]}"
                    if not same_static_strides(u_old[i], u_new[i]):
                        updates.append((g, u_new[i]))
            updates.append((u, u_new))
            continue
        sub = _broken((u,), u_old, u_new, list(u.users), depth - 1, updates)
        if sub is not None:
            return u, f"{u.name} -> {sub[0].name}: {sub[1]}" if sub[0] is not u else sub[1]
        if not same_static_strides(u_old, u_new):
            updates.append((u, u_new))
    return None


def broken_use(
    old: Node, new: Node, users: list[Node], depth: int = PROPAGATE_DEPTH, updates: list | None = None
) -> tuple[Node, str] | None:
    """The first of ``users`` (uses of ``old``, moved or about to move to ``new``) that
    would see a different layout, with the reason; or None.

    A use in the table (:func:`direct_reason`) sees it whenever the strides differ. Any
    other use (not a fresh-output op) is re-run on FakeTensors with ``new``'s value, and
    its own uses checked the same way with its old and new results, ``depth`` hops deep
    (a change that reaches further counts as seen): a pointwise op keeps its input's
    stride order but not its gaps, a ``reshape`` copies what it cannot view, so only a
    layout that reaches a use in the table counts. The reason names the path, e.g.
    ``"add_1 -> view_2: view needs ..."``. ``updates``, if given, receives the
    ``(node, new example value)`` of every downstream node whose strides change, for the
    caller to store when it makes the replacement."""
    return _broken((old, new), _tensor(old), _tensor(new), users, depth, [] if updates is None else updates)


def is_dense(node: Any) -> bool:
    """Whether the node's value covers its storage span without gaps or overlaps (its
    strides are a permutation of a contiguous tensor's), so a copy can give them back."""
    t = _tensor(node)
    if t is None:
        return False
    try:
        from torch._prims_common import is_non_overlapping_and_dense_or_false

        return bool(is_non_overlapping_and_dense_or_false(t))
    except Exception:  # noqa: BLE001 - undecidable symbolic strides
        return False


def stride_order(node: Any) -> list[int] | None:
    """The permutation that sorts the node's dims by decreasing stride (ties: dim order),
    or None without a tensor value."""
    lay = layout(node)
    t = _tensor(node)
    if lay is None or t is None:
        return None
    st = [_int(s) for s in t.stride()]
    if not all(type(s) is int for s in st):
        return None
    return sorted(range(len(st)), key=lambda d: (-st[d], d))


def layout_text(node: Any) -> str:
    t = _tensor(node)
    if t is None:
        return "no example value"
    return f"strides {tuple(s if type(s) is int else str(s) for s in t.stride())}"


class LayoutError(RuntimeError):
    """A replacement would change the strides of a value that a use depends on, and the
    rewrite cannot keep them. The message names the user, why it needs the layout, and
    both layouts."""


def replace_miss(old: Node, new: Node) -> Miss | None:
    """For a pattern's ``match``: a :class:`optimus_lens.core.miss.Miss` when replacing ``old`` by
    the existing value ``new`` would change strides that a use of ``old`` depends on and
    no ``contiguous()`` can restore them (``old`` is not contiguous); else None."""
    if is_dense(old):
        return None
    bad = broken_use(old, new, list(old.users))
    return Miss(mismatch_message(old, new, *bad)) if bad else None


def fresh_output_miss(node: Node) -> Miss | None:
    """For a fusion, which hands each member a piece of one fresh result instead of its
    own output: a :class:`optimus_lens.core.miss.Miss` when the member's value is not dense (an
    alias with gaps, e.g. ``detach`` of a split piece), so no copy can give its layout
    back, and a use sees that layout (:func:`broken_use` against a contiguous value);
    else None."""
    t = _tensor(node)
    if t is None or t.layout != torch.strided or _static_contiguous(t) or is_dense(node):
        return None
    with getattr(t, "fake_mode", None) or nullcontext():
        fresh = torch.empty_like(t, memory_format=torch.contiguous_format)
    bad = _broken((node,), t, fresh, list(node.users), PROPAGATE_DEPTH, [])
    if bad is None:
        return None
    return Miss(
        f"{bad[0].name} needs the layout of {node.name} ({layout_text(node)}; {bad[1]}), "
        f"which a fused result cannot give back"
    )


def mismatch_message(old: Node, new: Node, user: Node, reason: str) -> str:
    return (
        f"{user.name} needs the layout of {old.name} ({layout_text(old)}; {reason}), "
        f"but the replacement {new.name} has {layout_text(new)}"
    )
