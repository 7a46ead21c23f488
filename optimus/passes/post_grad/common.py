"""What the post-grad (ATen) patterns share: the ATen ops they read and build, argument
access by schema, and the stack / piece builders upstream's post-grad fusions use.

The graphs are AOTAutograd's (:mod:`optimus_lens.frontend.aten_capture`): targets are
``OpOverload``\\ s (``aten.mm.default``), values are in ``meta["val"]``, and a view is a
view by the op's schema (:mod:`optimus_lens.core.effects`). New nodes get their ``val`` from
:func:`optimus_lens.core.meta.infer` through the Rewriter, like pre-grad ones.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch.fx import Node

from optimus_lens.core import meta
from optimus_lens.core.miss import Miss
from optimus_lens.core.rewriter import Rewriter

aten = torch.ops.aten

MM = aten.mm.default
ADDMM = aten.addmm.default
BMM = aten.bmm.default
CAT = aten.cat.default
UNSQUEEZE = aten.unsqueeze.default
SELECT = aten.select.int
SLICE = aten.slice.Tensor
SPLIT = aten.split.Tensor
SPLIT_WITH_SIZES = aten.split_with_sizes.default
RESHAPE = aten.reshape.default
VIEW = aten.view.default
PERMUTE = aten.permute.default
MUL = aten.mul.Tensor
SUM = aten.sum.dim_IntList
ADD = aten.add.Tensor

#: the packets some upstream post-grad rewrites create nodes with (``aten.select``, not
#: ``aten.select.int``); the patterns accept either
SELECTS = frozenset({SELECT, aten.select})
UNSQUEEZES = frozenset({UNSQUEEZE, aten.unsqueeze})
CATS = frozenset({CAT, aten.cat})


def schema_args(node: Node) -> dict[str, Any] | Miss:
    """The node's arguments by name, as its ``OpOverload`` schema binds them, defaults
    filled in (``aten.addmm(b, x, w)`` -> ``{"self": b, "mat1": x, "mat2": w, "beta": 1,
    "alpha": 1}``); a Miss for a node whose target has no schema or whose arguments do
    not bind."""
    target = node.target
    schema = getattr(target, "_schema", None)
    if schema is None:
        return Miss(f"{node.name} is not an ATen op call")
    out: dict[str, Any] = {}
    params = schema.arguments
    if len(node.args) > len(params):
        return Miss(f"{node.name} has {len(node.args)} positional arguments; its schema has {len(params)}")
    for p, a in zip(params, node.args):
        out[p.name] = a
    for k, v in node.kwargs.items():
        if k in out:
            return Miss(f"argument {k} of {node.name} is given twice")
        if not any(p.name == k for p in params):
            return Miss(f"{node.name} has no argument {k}")
        out[k] = v
    for p in params:
        if p.name not in out:
            if not p.has_default_value():
                return Miss(f"{node.name} lacks argument {p.name}")
            out[p.name] = p.default_value
    return out


def is_aten(node: Any, targets: Any) -> bool:
    """True for a call_function node whose target is ``targets`` (one op) or in it (a set)."""
    if not isinstance(node, Node) or node.op != "call_function":
        return False
    if isinstance(targets, (set, frozenset)):
        return node.target in targets
    return node.target is targets


def static_shape(node: Any) -> tuple[int, ...] | Miss:
    """The node's shape as plain ints, or a Miss (no value, or symbolic sizes)."""
    t = meta.tensor(node)
    if t is None:
        return Miss(f"{getattr(node, 'name', node)} has no tensor value (meta['val'])")
    if not all(type(d) is int for d in t.shape):
        return Miss(f"{node.name} has symbolic sizes (dynamic shapes)")
    return tuple(t.shape)


def norm_dim(d: Any, ndim: int) -> int | None:
    """``d`` as ``0 <= d < ndim``; None when it is not a static int in range."""
    if type(d) is not int:
        return None
    d = d + ndim if d < 0 else d
    return d if 0 <= d < ndim else None


def stack0(rw: Rewriter, values: list[Node]) -> Node:
    """``cat([unsqueeze(v, 0) for v in values], dim=0)`` (in normal form): the stack upstream's post-grad
    fusions build (``decompose_stack`` in group_batch_fusion.py) and
    ``merge_unbind_stack_aten`` cancels against a batch of ``select``\\ s."""
    return rw.call(CAT, [rw.call(UNSQUEEZE, v, 0) for v in values], dim=0)


def in_piece_order(nodes: list[Node], first: list) -> list[Node]:
    """``nodes`` reordered so that member ``i`` reads piece ``i`` when every member's
    operand in ``first`` (parallel to ``nodes``) is ``select(P, 0, i)`` of one ``P``, each
    ``i`` once: then the stack of those operands is ``P`` in order, which
    ``merge_unbind_stack_aten`` removes (one fused op feeding the next). Otherwise
    ``nodes`` as they are."""
    idx = []
    parent = None
    for v in first:
        if not is_aten(v, SELECTS) or len(v.args) < 3 or v.args[1] != 0 or type(v.args[2]) is not int:
            return nodes
        if parent is None:
            parent = v.args[0]
        elif v.args[0] is not parent:
            return nodes
        idx.append(v.args[2])
    if len(set(idx)) != len(idx):
        return nodes
    return [n for _, n in sorted(zip(idx, nodes), key=lambda t: t[0])]


def hand_out(rw: Rewriter, nodes: list[Node], fused: Node, finish=None) -> None:
    """Member ``i`` of ``nodes`` becomes ``select(fused, 0, i)`` (``finish(i, piece)`` may
    build on the piece, e.g. add a bias): uses rewired, metas carried (source, module,
    ``seq_nr``, ``from_node``), the member erased."""
    for i, n in enumerate(nodes):
        with rw.inserting_before(fused.next):
            piece = rw.call(SELECT, fused, 0, i)
        if finish is not None:
            with rw.inserting_before(piece.next):
                piece = finish(i, piece)
        rw.carry_meta(n, piece)
        rw.replace_all_uses(n, piece)
        rw.erase(n)


def getitem_of(node: Any, parents: Any) -> tuple[Node, int] | None:
    """(the split node, index) when ``node`` is ``getitem(split, i)`` of a node whose
    target is in ``parents``; else None."""
    if (
        isinstance(node, Node)
        and node.op == "call_function"
        and node.target is operator.getitem
        and isinstance(node.args[0], Node)
        and is_aten(node.args[0], parents)
        and type(node.args[1]) is int
    ):
        return node.args[0], node.args[1]
    return None


def dtype_text(node: Node) -> str:
    t = meta.tensor(node)
    return str(t.dtype).replace("torch.", "") if t is not None else "?"
