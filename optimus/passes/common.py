"""Small helpers shared by the shipped patterns: argument access, op families, node builders,
and the refusals every fusion applies (in-place writes, layouts a fused result cannot give back)."""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx import Node

from optimus_lens.core import meta
from optimus_lens.core.aliasing import GraphEffects, analysis, is_written
from optimus_lens.core.effects import NodeEffect, effect, writes_inputs
from optimus_lens.core.miss import Miss
from optimus_lens.core.rewriter import Rewriter
from optimus_lens.core.strides import fresh_output_miss, offset_use


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


def dim_of(d: Any, ndim: int) -> int | None:
    """A dim argument normalised to ``0 <= d < ndim``; None if it is not a static int in range."""
    if not isinstance(d, int) or isinstance(d, bool):
        return None
    if d < 0:
        d += ndim
    return d if 0 <= d < ndim else None


def replace_with_getitems(rw: Rewriter, nodes: list[Node], tuple_node: Node) -> list[Node]:
    """``nodes[i]`` is replaced by ``tuple_node[i]`` for every i (uses rewired, the old node
    erased). The getitem keeps the old node's ``stack_trace`` and ``nn_module_stack``. A
    use that depends on the old node's strides gets the getitem's ``contiguous()`` when
    the strides differ (:meth:`optimus_lens.core.rewriter.Rewriter.replace_all_uses`)."""
    out = rw.getitems(tuple_node, len(nodes))
    rw.replace_each(nodes, out)
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


# ------------------------------------------------- canonical arguments

REQUIRED = object()  # marks a parameter without a default in a ``bind_args`` spec


def bind_args(node: Node, params: tuple[tuple[str, Any], ...]) -> dict | Miss:
    """The node's positional and keyword arguments mapped onto ``params``, a tuple of
    ``(name, default)`` in signature order (``REQUIRED`` for no default), with every
    default filled in: ``clamp(x, -1, 1)`` and ``clamp(x, min=-1, max=1)`` both give
    ``{"input": x, "min": -1, "max": 1}``. For a call_method node ``self`` is the first
    parameter. Returns a Miss naming the problem for too many positional arguments, an
    unknown keyword (e.g. ``out=``), an argument given twice, or a missing required one."""
    args, kwargs = node.args, node.kwargs
    if len(args) > len(params):
        return Miss(f"{len(args)} positional arguments; expected at most {len(params)}")
    out = {name: v for (name, _), v in zip(params, args)}
    if kwargs:
        names = [p for p, _ in params]
        for k, v in kwargs.items():
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
    if kwargs:  # keywords came in their own order
        return {n: out[n] for n, _ in params}
    return out  # the positional ones first, then the defaults: already in signature order


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


# ------------------------------------------------- what no fusion may touch


def fusion_key(node: Node, key: tuple) -> tuple | Miss:
    """A batch fusion's group ``key`` for member ``node``, or why it must not be a member
    (:func:`fusion_miss`). Where the graph has writes, state changes (``no_grad``,
    ``autocast`` blocks) or random ops, the member's place among them is added
    (:func:`optimus_lens.core.aliasing.signature`: its region and the write epoch of each
    written alias class it reads), so a group never spans a region boundary or mixes
    reads from both sides of a write; in a graph without effects the key is ``key``.
    The graph's analysis is read once for all of these (nothing changes the graph
    between them)."""
    ge = analysis(node.graph)
    miss = _fusion_miss(node, ge)
    if miss:
        return miss
    sig = ge.signature(node)
    return (*key, ("effects", sig)) if sig else key


def fusion_miss(node: Node) -> Miss | None:
    """Why ``node`` must not be fused: an in-place write (:func:`mutation_miss`), a layout
    its uses depend on that a fused result cannot give back
    (:func:`optimus_lens.core.strides.fresh_output_miss`), a use that reads its storage
    offset (a fused member is a slice at another offset:
    :func:`optimus_lens.core.strides.offset_use`), or a graph output that aliases an input
    (a fused result is fresh)."""
    return _fusion_miss(node, analysis(node.graph))


def _fusion_miss(node: Node, ge: GraphEffects) -> Miss | None:
    """:func:`fusion_miss` with the graph's current analysis ``ge``. The node's effect is read
    once, and not at all where the analysis has classified the node as it is now and found
    no effect (:func:`optimus_lens.core.aliasing.known_effectful` is False: a node that
    writes is effectful, so it writes nothing) and no graph output uses it (the effect's
    aliases matter only then): the same answers as reading it, without building it for
    each of a pass's thousands of candidates."""
    e = None if ge.classified(node) is False else effect(node)
    return (
        _member_miss(node, e, ge) or fresh_output_miss(node) or _offset_miss(node, ge) or _aliased_output_miss(node, e)
    )


def member_miss(node: Node) -> Miss | None:
    """Why ``node`` must not be a batch fusion member because of an in-place write: it
    writes into an input itself (an in-place op, ``inplace=True``, ``out=``, a custom op's
    ``mutates_args``: :func:`optimus_lens.core.effects.writes_inputs`), or its output (or a
    value sharing its storage) is written in place (:func:`optimus_lens.core.aliasing.is_written`).
    A write to one of its inputs elsewhere is not a reason: the group key keeps members on
    one side of it (:func:`fusion_key`)."""
    return _member_miss(node, effect(node), analysis(node.graph))


def _member_miss(node: Node, e: NodeEffect | None, ge: GraphEffects) -> Miss | None:
    if e is not None and e.writes:  # None: known to have no effect
        return Miss(f"the op writes in place into {', '.join(w.name for w in e.writes)}")
    if ge.is_written(node):
        return Miss("its output (or a tensor sharing its storage) is written in place")
    return None


def _offset_miss(node: Node, ge: GraphEffects) -> Miss | None:
    if not ge.offset_readers:  # no node of the graph reads a storage offset
        return None
    use = offset_use(node, list(node.users))
    if use is None:
        return None
    return Miss(f"{use[0].name} reads its storage offset ({use[1]}); a fused member is a slice at another offset")


def _aliased_output_miss(node: Node, e: NodeEffect | None) -> Miss | None:
    if any(u.op == "output" for u in node.users) and (e or effect(node)).aliases:
        return Miss("a graph output that aliases its input (a fused result would be a fresh tensor)")
    return None


def mutation_miss(node: Node) -> Miss | None:
    """Why a rewrite must leave ``node`` alone because of an in-place write, or None: the
    node writes in place itself, its output or a value sharing its storage is written in
    place, or one of its inputs (or a tensor sharing its storage) is
    (:func:`optimus_lens.core.effects.writes_inputs`, :func:`optimus_lens.core.aliasing.is_written`):
    a rewrite reads the inputs at another point of the program."""
    if writes_inputs(node):
        return Miss("the op writes in place (inplace=True, out= or a declared mutation)")
    if is_written(node):
        return Miss("a user mutates the output (or a view of it) in place")
    for i in node.all_input_nodes:
        if is_written(i):
            return Miss(f"input {i.name} (or a tensor sharing its storage) is mutated in place")
    return None
