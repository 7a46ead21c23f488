"""Op effects: which FX nodes write into their inputs, which return a view of (alias) their
first input, and whether anything writes into a value's storage.

The one place that answers these questions for the whole package: the layout rules
(:mod:`optimus_lens.core.strides`), the match language's refusal of in-place sites
(:mod:`optimus_lens.core.lang`), verification (:mod:`optimus_lens.core.verify`), the
catalogue's fusions and the memory estimate all ask here. Each public function takes a
node and returns the answer; today the answers come from the tables below (operator
names and spellings), so a table can later give way to the op's schema without its
callers changing. ATen ops (``OpOverload`` targets, the post-grad graphs) are answered from
their schemas (:func:`aten_effect`).
"""

from __future__ import annotations

import inspect
import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx import Node

from optimus_lens.core.memo import unchanged_memo

MUTATING_OPERATORS = {
    operator.iadd,
    operator.isub,
    operator.imul,
    operator.itruediv,
    operator.ifloordiv,
    operator.imod,
    operator.ipow,
    operator.iand,
    operator.ior,
    operator.ixor,
    operator.ilshift,
    operator.irshift,
    operator.setitem,
}

# ops that always return a view of their first input: they allocate nothing
# (optimus_lens.perf.memory's liveness estimate) and a write into one is seen in the other
PURE_VIEW_FUNCTIONS = {
    operator.getitem,
    torch.reshape,
    torch.transpose,
    torch.permute,
    torch.unsqueeze,
    torch.squeeze,
    torch.narrow,
    torch.select,
    torch.flatten,
    torch.unflatten,
    torch.unbind,
    torch.split,
    torch.functional.split,
    torch.chunk,
    torch.detach,
    torch.movedim,
    torch.t,
    torch.diagonal,
    torch.as_strided,
    torch.swapaxes,
    torch.swapdims,
    torch.tensor_split,
    torch.real,
    torch.Tensor.view,
}
PURE_VIEW_METHODS = {
    "view",
    "view_as",
    "reshape",
    "reshape_as",
    "transpose",
    "permute",
    "t",
    "unsqueeze",
    "squeeze",
    "expand",
    "expand_as",
    "narrow",
    "select",
    "flatten",
    "unflatten",
    "unbind",
    "split",
    "chunk",
    "detach",
    "movedim",
    "diagonal",
    "as_strided",
    "unfold",
    "swapaxes",
    "swapdims",
    "tensor_split",
    "__getitem__",
}
# ops whose output may share storage with their first input: the pure views, plus ops that
# return their input itself when there is nothing to do (``contiguous`` on a contiguous
# tensor, ``to``/``float`` to its own dtype, eval-mode dropout)
VIEW_FUNCTIONS = PURE_VIEW_FUNCTIONS | {F.dropout}
VIEW_METHODS = PURE_VIEW_METHODS | {"contiguous", "to", "type", "type_as", "float", "double", "half", "bfloat16"}


_ATEN_EFFECT: dict[Any, tuple[bool, bool, bool]] = {}


def aten_effect(target: Any) -> tuple[bool, bool, bool] | None:
    """For an ATen ``OpOverload``: (writes an argument, returns an alias of its first
    argument, always a view), read from its schema (an argument annotated ``Tensor(a!)``
    is written; a return annotated ``Tensor(a)`` like the first argument aliases it, so
    does a list returned from a ``Tensor(a -> *)`` first argument (split, unbind), and
    it always does unless the op is ``CompositeImplicitAutograd``, as ``reshape`` and
    ``contiguous`` are, which copy when they cannot view). None for any other target."""
    if not isinstance(target, torch._ops.OpOverload):
        return None
    hit = _ATEN_EFFECT.get(target)
    if hit is None:
        schema = target._schema
        writes = schema.is_mutable
        first = schema.arguments[0].alias_info if schema.arguments else None
        ret = schema.returns[0].alias_info if schema.returns else None
        # ``Tensor(a -> *)``: the argument's storage goes into the returned list (split, unbind)
        aliases = (
            first is not None
            and not first.is_write
            and (
                (ret is not None and not ret.is_write and bool(set(first.before_set) & set(ret.before_set)))
                or "*" in first.after_set
            )
        )
        composite = torch._C._dispatch_has_kernel_for_dispatch_key(target.name(), "CompositeImplicitAutograd")
        hit = _ATEN_EFFECT[target] = (writes, aliases, aliases and not composite)
    return hit


def _calls(node: Any, functions: set, methods: set) -> bool:
    """True for a call_function node whose target is in ``functions`` or a call_method
    node whose method name is in ``methods``."""
    if not isinstance(node, Node):
        return False
    if node.op == "call_function":
        return node.target in functions
    if node.op == "call_method":
        return node.target in methods
    return False


def is_mutating(node: Node) -> bool:
    """True when ``node`` writes into one of its inputs: an in-place method or function
    (name ends in ``_``, e.g. ``add_``, ``relu_``), ``operator.i*``/``setitem``, or an
    ``inplace=True`` / ``out=`` keyword. An ``inplace`` passed by position is not seen
    (:func:`writes_inputs` sees it)."""
    if node.kwargs.get("inplace") is True or "out" in node.kwargs:
        return True
    aten = aten_effect(node.target) if node.op == "call_function" else None
    if aten is not None:
        return aten[0]
    if node.op == "call_method":
        return node.target.endswith("_") and not node.target.endswith("__")
    if node.op == "call_function":
        if node.target in MUTATING_OPERATORS:
            return True
        name = getattr(node.target, "__name__", "")
        return name.endswith("_") and not name.endswith("__")
    return False


_INPLACE_INDEX: dict[Any, int | None] = {}


def _inplace_index(fn: Any) -> int | None:
    """Position of an ``inplace`` parameter in ``fn``'s Python signature (F.relu: 1,
    F.dropout: 3), or None when it has none or no inspectable signature."""
    if fn not in _INPLACE_INDEX:
        try:
            ps = list(inspect.signature(fn).parameters)
            _INPLACE_INDEX[fn] = ps.index("inplace") if "inplace" in ps else None
        except (TypeError, ValueError):
            _INPLACE_INDEX[fn] = None
    return _INPLACE_INDEX[fn]


def writes_inputs(node: Node) -> bool:
    """True when ``node`` writes into one of its inputs: :func:`is_mutating`, plus
    ``inplace`` passed by position (``F.relu(x, True)``, ``F.dropout(x, 0.1, False, True)``)."""
    if is_mutating(node):
        return True
    if node.op == "call_function":
        i = _inplace_index(node.target)
        return i is not None and len(node.args) > i and node.args[i] is True
    return False


def is_pure_view(node: Node) -> bool:
    """True when ``node`` always returns a view of its first input (``PURE_VIEW_FUNCTIONS``,
    ``PURE_VIEW_METHODS``; an ATen op by its schema, :func:`aten_effect`): it allocates no
    storage of its own."""
    aten = aten_effect(node.target) if isinstance(node, Node) and node.op == "call_function" else None
    if aten is not None:
        return aten[2]
    return _calls(node, PURE_VIEW_FUNCTIONS, PURE_VIEW_METHODS)


def is_view(node: Node) -> bool:
    """True when ``node`` may return a view of (alias) its first input: reshape/transpose/
    getitem/split/detach/contiguous/``to``, eval-mode dropout and friends (``VIEW_FUNCTIONS``,
    ``VIEW_METHODS``; an ATen op by its schema, :func:`aten_effect`)."""
    aten = aten_effect(node.target) if isinstance(node, Node) and node.op == "call_function" else None
    if aten is not None:
        return aten[1]
    return _calls(node, VIEW_FUNCTIONS, VIEW_METHODS)


def alias_root(node: Node) -> Node:
    """Follow view ops up from ``node`` to the node that owns its storage (the first input
    of a chain of views)."""
    while is_view(node) and node.args and isinstance(node.args[0], Node):
        node = node.args[0]
    return node


def is_written(node: Node) -> bool:
    """True when some node writes in place into ``node``'s storage: into the node's alias
    root or any view reached from it through view ops (``y.view(...).add_(1)``, ``x.relu_()``
    on a split piece of ``x``'s base, ``F.relu(v, True)``). Conservative: a writer that
    merely reads the tensor as a non-destination argument also counts. O(views of the
    alias root and their users); memoised per alias root inside
    :func:`optimus_lens.core.memo.graph_unchanged` (keying every node of a graph whose T
    tower inputs are views of one tensor then walks that tensor's T views once, not T times)."""
    root = alias_root(node)
    memo = unchanged_memo("is_written")
    if memo is not None:
        hit = memo.get(root)
        if hit is None:
            hit = memo[root] = _view_closure_written(root)
        return hit
    return _view_closure_written(root)


def _view_closure_written(root: Node) -> bool:
    """Whether a user of ``root`` or of a view reached from it through view ops writes in place."""
    seen = set()
    work = [root]
    while work:
        n = work.pop()
        if n in seen:
            continue
        seen.add(n)
        for u in n.users:
            if writes_inputs(u):
                return True
            if is_view(u) and u.args and u.args[0] is n:
                work.append(u)
    return False
