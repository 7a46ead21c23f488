"""Small helpers shared by the shipped patterns: argument access, op families, node builders."""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx import Node

from optimus_lens.core import meta
from optimus_lens.core.pattern import Miss, unchanged_memo
from optimus_lens.core.rewriter import Rewriter


def arg(node: Node, index: int, name: str, default: Any = None) -> Any:
    """Argument ``index`` of ``node`` whether passed positionally or as keyword ``name``."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def is_call(node: Any, functions: Iterable[Any] = (), methods: Iterable[str] = ()) -> bool:
    """True for a call_function node whose target is in ``functions`` or a call_method
    node whose method name is in ``methods``."""
    if not isinstance(node, Node):
        return False
    if node.op == "call_function":
        return node.target in functions
    if node.op == "call_method":
        return node.target in methods
    return False


def is_getitem(node: Any) -> bool:
    return isinstance(node, Node) and node.op == "call_function" and node.target is operator.getitem


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


def is_mutating(node: Node) -> bool:
    """True when ``node`` writes into one of its inputs: an in-place method or function
    (name ends in ``_``, e.g. ``add_``, ``relu_``), ``operator.i*``/``setitem``, or an
    ``inplace=True`` / ``out=`` keyword."""
    if node.kwargs.get("inplace") is True or "out" in node.kwargs:
        return True
    if node.op == "call_method":
        return node.target.endswith("_") and not node.target.endswith("__")
    if node.op == "call_function":
        if node.target in MUTATING_OPERATORS:
            return True
        name = getattr(node.target, "__name__", "")
        return name.endswith("_") and not name.endswith("__")
    return False


def has_mutating_user(node: Node) -> bool:
    return any(is_mutating(u) for u in node.users)


def dim_of(d: Any, ndim: int) -> int | None:
    """A dim argument normalised to ``0 <= d < ndim``; None if it is not a static int in range."""
    if not isinstance(d, int) or isinstance(d, bool):
        return None
    if d < 0:
        d += ndim
    return d if 0 <= d < ndim else None


def call(rw: Rewriter, fn: Any, *args: Any, **kwargs: Any) -> Node:
    """Create ``call_function(fn, args, kwargs)`` through the Rewriter at the insert point,
    with its ``example_value`` (:meth:`optimus_lens.core.rewriter.Rewriter.call`)."""
    return rw.call(fn, *args, **kwargs)


def replace_with_getitems(rw: Rewriter, nodes: list[Node], tuple_node: Node) -> list[Node]:
    """``nodes[i]`` is replaced by ``tuple_node[i]`` for every i (uses rewired, the old node
    erased). The getitem keeps the old node's ``stack_trace`` and ``nn_module_stack``. A
    use that depends on the old node's strides gets the getitem's ``contiguous()`` when
    the strides differ (:meth:`optimus_lens.core.rewriter.Rewriter.replace_all_uses`)."""
    out = [call(rw, operator.getitem, tuple_node, i) for i in range(len(nodes))]
    for g, n in zip(out, nodes):
        rw.carry_meta(n, g)
        rw.replace_all_uses(n, g)
    for n in nodes:
        rw.erase(n)
    return out


def tensor_key(node: Any) -> tuple | None:
    """(shape, dtype, device) of a tensor-valued node or constant; None for None."""
    if node is None:
        return None
    if isinstance(node, Node):
        return meta.signature(node)
    return ("const", repr(node))


RELU = ({torch.relu, F.relu}, {"relu"})
TANH = ({torch.tanh, F.tanh}, {"tanh"})
SIGMOID = ({torch.sigmoid, F.sigmoid}, {"sigmoid"})
LINEAR = ({torch._C._nn.linear, F.linear}, set())
LAYER_NORM = ({F.layer_norm, torch.layer_norm}, set())
MUL = ({torch.mul, operator.mul}, {"mul", "__mul__"})
SUM = ({torch.sum}, {"sum"})
STACK = ({torch.stack}, set())
CAT = ({torch.cat, torch.concat, torch.concatenate}, set())
UNBIND = ({torch.unbind}, {"unbind"})
SPLIT = ({torch.split, torch.functional.split, torch.Tensor.split}, {"split"})


# ------------------------------------------------- canonical arguments, in-place writes and aliasing

REQUIRED = object()  # marks a parameter without a default in a ``bind_args`` spec


def bind_args(node: Node, params: tuple[tuple[str, Any], ...]) -> dict | Miss:
    """The node's positional and keyword arguments mapped onto ``params``, a tuple of
    ``(name, default)`` in signature order (``REQUIRED`` for no default), with every
    default filled in: ``clamp(x, -1, 1)`` and ``clamp(x, min=-1, max=1)`` both give
    ``{"input": x, "min": -1, "max": 1}``. For a call_method node ``self`` is the first
    parameter. Returns a Miss naming the problem for too many positional arguments, an
    unknown keyword (e.g. ``out=``), an argument given twice, or a missing required one."""
    names = [p for p, _ in params]
    if len(node.args) > len(params):
        return Miss(f"{len(node.args)} positional arguments; expected at most {len(params)}")
    out = dict(zip(names, node.args))
    for k, v in node.kwargs.items():
        if k not in names:
            return Miss(f"unexpected argument {k}=")
        if k in out:
            return Miss(f"argument {k} given twice")
        out[k] = v
    for name, default in params:
        if name not in out:
            if default is REQUIRED:
                return Miss(f"missing argument {name}")
            out[name] = default
    return {n: out[n] for n in names}


_INPLACE_INDEX: dict[Any, int | None] = {}


def _inplace_index(fn: Any) -> int | None:
    """Position of an ``inplace`` parameter in ``fn``'s Python signature (F.relu: 1,
    F.dropout: 3), or None when it has none or no inspectable signature."""
    if fn not in _INPLACE_INDEX:
        import inspect

        try:
            ps = list(inspect.signature(fn).parameters)
            _INPLACE_INDEX[fn] = ps.index("inplace") if "inplace" in ps else None
        except (TypeError, ValueError):
            _INPLACE_INDEX[fn] = None
    return _INPLACE_INDEX[fn]


def writes_inputs(node: Node) -> bool:
    """``is_mutating`` plus ``inplace`` passed positionally (``F.relu(x, True)``,
    ``F.dropout(x, 0.1, False, True)``), which ``is_mutating`` does not see."""
    if is_mutating(node):
        return True
    if node.op == "call_function":
        i = _inplace_index(node.target)
        return i is not None and len(node.args) > i and node.args[i] is True
    return False


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


def is_pure_view(node: Node) -> bool:
    """True when ``node`` always returns a view of its first input (``PURE_VIEW_FUNCTIONS``,
    ``PURE_VIEW_METHODS``): it allocates no storage of its own."""
    return is_call(node, PURE_VIEW_FUNCTIONS, PURE_VIEW_METHODS)


def is_view(node: Node) -> bool:
    """True when ``node`` may return a view of (alias) its first input: reshape/transpose/
    getitem/split/detach/contiguous/``to``, eval-mode dropout and friends (``VIEW_FUNCTIONS``,
    ``VIEW_METHODS``)."""
    return is_call(node, VIEW_FUNCTIONS, VIEW_METHODS)


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
    alias root and their users); memoised per alias root inside :func:`optimus_lens.core.pattern.graph_unchanged`
    (keying every node of a graph whose T tower inputs are views of one tensor then walks
    that tensor's T views once, not T times)."""
    root = alias_root(node)
    memo = unchanged_memo("is_written")
    if memo is not None:
        hit = memo.get(root)
        if hit is None:
            hit = memo[root] = _view_closure_written(root)
        return hit
    return _view_closure_written(root)


def _view_closure_written(root: Node) -> bool:
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


def mul_operands(node: Node) -> tuple[Node, Node] | Miss:
    """The two tensor operands of a ``torch.mul`` / ``*`` / ``Tensor.mul`` node, or a Miss
    (a Python number operand, ``out=``, no example values)."""
    if not is_call(node, *MUL):
        return Miss("not a mul node")
    a = bind_args(node, (("input", REQUIRED), ("other", REQUIRED)))
    if isinstance(a, Miss):
        return a
    x, y = a["input"], a["other"]
    if not (isinstance(x, Node) and isinstance(y, Node)):
        return Miss("an operand is a Python number, not a tensor node")
    if meta.tensor(x) is None or meta.tensor(y) is None or meta.tensor(node) is None:
        return Miss("an operand or the output has no example value")
    return x, y
