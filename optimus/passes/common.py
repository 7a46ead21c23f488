"""Small helpers shared by the shipped patterns: argument access, op families, node builders."""
from __future__ import annotations

import operator
from typing import Any, Iterable

import torch
import torch.nn.functional as F
from torch.fx import Graph, Node

from optimus import meta
from optimus.pattern import Miss


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


MUTATING_OPERATORS = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
                      operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor,
                      operator.ilshift, operator.irshift, operator.setitem}


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


def call(graph: Graph, fn: Any, *args: Any, **kwargs: Any) -> Node:
    """Create ``call_function(fn, args, kwargs)`` at the graph's insert point and compute
    its ``example_value``."""
    n = graph.call_function(fn, tuple(args), kwargs)
    meta.infer(n)
    return n


def replace_with_getitems(graph: Graph, nodes: list[Node], tuple_node: Node) -> list[Node]:
    """``nodes[i]`` is replaced by ``tuple_node[i]`` for every i (uses rewired, the old node
    erased). The getitem keeps the old node's ``stack_trace`` and ``nn_module_stack``."""
    out = [call(graph, operator.getitem, tuple_node, i) for i in range(len(nodes))]
    for g, n in zip(out, nodes):
        for k in ("stack_trace", "nn_module_stack"):
            if k in n.meta:
                g.meta[k] = n.meta[k]
        n.replace_all_uses_with(g)
    for n in nodes:
        graph.erase_node(n)
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
STACK = ({torch.stack}, set())
CAT = ({torch.cat, torch.concat, torch.concatenate}, set())
UNBIND = ({torch.unbind}, {"unbind"})
SPLIT = ({torch.split, torch.functional.split, torch.Tensor.split}, {"split"})
