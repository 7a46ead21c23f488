"""Batch fusions beyond upstream's catalogue (``docs/parity.md`` lists them).

Upstream's pre-grad catalogue (torch/_inductor/fx_passes/group_batch_fusion.py) has no
fusion for these ops; they follow the same horizontal scheme as the unary fusions of
:mod:`optimus_lens.passes.batch` (stack the members' inputs, run the op once, hand each member
its slice) and run after them in the default pipeline (``EXTRA_BATCH_PASSES``).
``upstream_pipeline`` never runs them.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.fx import Node

from optimus_lens.core import meta
from optimus_lens.core.miss import Miss
from optimus_lens.core.pattern import BatchPattern, SearchOptions, register
from optimus_lens.core.rewriter import Rewriter
from optimus_lens.passes.batch import BatchUnary
from optimus_lens.passes.common import (
    MUL,
    REQUIRED,
    SUM,
    bind_args,
    fusion_key,
    is_call,
    mul_operands,
    replace_with_getitems,
    tensor_key,
)

#: the default pipeline runs these after ``BATCH_PASSES``, one pass each, in this order
EXTRA_BATCH_PASSES = ["batch_normalize", "batch_softmax", "batch_mul", "batch_sum"]

#: groups of two or more, each fused only where the profit estimate expects a gain
#: (``profitable_only``, :func:`optimus_lens.passes.profit.group_estimate`): these ops are cheap
#: per element, so one launch saved pays for stacking small inputs (mmoe's three gates:
#: softmax over (256, 8)) but not large ones (two (B, H, T, D) rotary products sharing
#: their cos table would copy both into a stack to save one launch)
SMALL_GROUPS = SearchOptions(min_fuse_set_size=2, profitable_only=True)


def shift_dims(dim: Any, ndim: int) -> Any:
    """A member's reduction/normalisation dim(s) as dims of the stack ``(n, ...)``: a dim
    counted from the front moves one place (``d -> d + 1``), one counted from the back
    stays; ``None`` (every dim of a member of rank ``ndim``) becomes ``(1, .., ndim)``."""
    if dim is None:
        return tuple(range(1, ndim + 1))
    if isinstance(dim, (tuple, list)):
        return tuple(shift_dims(d, ndim) for d in dim)
    return dim + 1 if dim >= 0 else dim


class BatchWithDim(BatchUnary):
    """A :class:`BatchUnary` whose op takes a dim argument (``dim_param``), shifted past
    the stack dim in the fused call (:func:`shift_dims`); the other arguments that are
    not None are passed as keywords."""

    dim_param = "dim"

    def fuse(self, rw: Rewriter, nodes: list[Node]) -> None:
        a = self.bound(nodes[0])
        assert not isinstance(a, Miss)
        ndim = len(meta.shape(a["input"]))
        kwargs = {k: a[k] for k, _ in self.params if a[k] is not None and k != self.dim_param}
        kwargs[self.dim_param] = shift_dims(a[self.dim_param], ndim)
        with rw.inserting_before(nodes[0]):
            x = rw.call(torch.stack, [self.bound(n)["input"] for n in nodes])
            y = rw.call(self.canonical, x, **kwargs)
            replace_with_getitems(rw, nodes, rw.call(torch.unbind, y))


@register
class BatchNormalize(BatchWithDim):
    """``F.normalize(x_i, p, dim, eps)`` -> ``unbind(F.normalize(stack(x_i), p, dim', eps))``
    with ``dim' = dim + 1`` for a dim counted from the front (a negative dim is unchanged).

    Shapes: x_i (...) -> X (n, ...); each member's output a contiguous slice of the result.
    Retrieval towers L2-normalise each tower's embedding (``F.normalize(tower(x), dim=-1)``,
    a norm, a clamp and a division: three kernels per member) before their dot products.
    Upstream: no such fusion (a place where ours accepts more, ``docs/parity.md``).
    """

    name, op = "batch_normalize", "normalize"
    functions, methods = frozenset({F.normalize}), frozenset()
    params = (("p", 2.0), ("dim", 1), ("eps", 1e-12), ("out", None))
    canonical = staticmethod(F.normalize)
    upstream = "none (beyond upstream's catalogue; same scheme as BatchPointwiseOpsPreGradFusion)"
    description = "Fuse independent same-shape F.normalize calls into one normalize over a stacked input."
    preconditions = (
        "F.normalize with constant p, dim and eps; no out=",
        "same input shape, dtype and device, p, dim and eps in the group; no in-place write to output "
        "or input; members independent",
    )

    def refuse(self, args: dict) -> Miss | None:
        if args["out"] is not None:
            return Miss("out= is given")
        if not isinstance(args["dim"], int):
            return Miss("dim is not a constant int")
        return None


@register
class BatchSoftmax(BatchWithDim):
    """``softmax(x_i, dim)`` -> ``unbind(softmax(stack(x_i), dim'))`` (``dim'`` as in
    :func:`shift_dims`). Shapes: x_i (...) -> X (n, ...).

    Mixture-of-experts gates (MMoE: ``softmax(gate_t(x), dim=-1)`` per task) are small
    softmaxes over rows of the expert count: one kernel per gate, whatever its size.
    Upstream: no such fusion (``docs/parity.md``)."""

    name, op = "batch_softmax", "softmax"
    functions, methods = frozenset({torch.softmax, F.softmax}), frozenset({"softmax"})
    params = (("dim", None), ("dtype", None))
    canonical = staticmethod(torch.softmax)
    options = SMALL_GROUPS
    upstream = "none (beyond upstream's catalogue; same scheme as BatchPointwiseOpsPreGradFusion)"
    description = "Fuse independent same-shape softmax calls over the same dim into one softmax over a stacked input."
    preconditions = (
        "torch.softmax, F.softmax or Tensor.softmax with a constant int dim; no dtype=",
        "same input shape, dtype and device and dim in the group; no in-place write to output or input; "
        "members independent; groups of 2 or more that the profit estimate expects to gain (a pair only when its stack "
        "is free: the pieces of one unbind, in order)",
    )

    def bound(self, node: Node) -> dict | Miss:
        if node.op == "call_function" and node.target is F.softmax:
            a = bind_args(node, (("input", REQUIRED), ("dim", None), ("_stacklevel", 3), ("dtype", None)))
            if not isinstance(a, Miss):
                a.pop("_stacklevel")
            return a
        return super().bound(node)

    def refuse(self, args: dict) -> Miss | None:
        if not isinstance(args["dim"], int):
            return Miss("dim is not a constant int (an implicit dim is deprecated)")
        if args["dtype"] is not None:
            return Miss("dtype= is given")
        return None


@register
class BatchSum(BatchWithDim):
    """``sum(x_i, dim, keepdim)`` -> ``unbind(sum(stack(x_i), dim', keepdim))`` (``dim'``
    as in :func:`shift_dims`; a full sum becomes a sum over every dim but the stack's).
    Shapes: x_i (...) -> X (n, ...) -> (n, reduced ...).

    The per-pair dot products of retrieval towers (``(u * v_i).sum(-1)``) and MMoE's
    gate-weighted expert sums reduce n equal-shaped products one kernel each.
    Upstream: no such fusion (``docs/parity.md``)."""

    name, op = "batch_sum", "sum"
    functions, methods = frozenset(SUM[0]), frozenset(SUM[1])
    params = (("dim", None), ("keepdim", False), ("dtype", None))
    canonical = staticmethod(torch.sum)
    options = SMALL_GROUPS
    upstream = "none (beyond upstream's catalogue; same scheme as BatchPointwiseOpsPreGradFusion)"
    description = "Fuse independent same-shape sums over the same dims into one sum over a stacked input."
    preconditions = (
        "torch.sum or Tensor.sum with constant dims (an int, a tuple of ints, or none: every dim) and keepdim; "
        "no dtype= or out=",
        "same input shape, dtype and device, dims and keepdim in the group; no in-place write to output or input; "
        "members independent; groups of 2 or more that the profit estimate expects to gain (a pair only when its stack "
        "is free: the pieces of one unbind, in order)",
    )

    def refuse(self, args: dict) -> Miss | None:
        if args["dtype"] is not None:
            return Miss("dtype= is given")
        if args["dim"] == ():
            return Miss("dim is an empty tuple")
        if not isinstance(args["keepdim"], bool):
            return Miss("keepdim is not a constant bool")
        return None


def promotion_miss(node: Node, shared: Node, varying: Node) -> Miss | None:
    """A Miss when the fused product ``mul(stack(v_i), shared)`` would have another dtype
    than the member ``mul(v_i, shared)``: type promotion lets a 0-dim operand promote only
    across categories (a 0-dim fp32 does not promote a bf16 tensor), but stacked into a
    1-D tensor it is a dimensioned operand and does (torch type promotion docs, "Type
    promotion" in torch.Tensor: dimensioned > zero-dim > Python number)."""
    v, s, out = meta.tensor(varying), meta.tensor(shared), meta.tensor(node)
    if v is None or s is None or out is None or v.dim() > 0:
        return None
    stacked = torch.empty((1,), dtype=v.dtype)
    other = torch.empty((1,) * s.dim(), dtype=s.dtype)
    fused = torch.result_type(stacked, other)
    if fused == out.dtype:
        return None
    return Miss(
        f"{varying.name} is a 0-dim {str(v.dtype).replace('torch.', '')} operand: stacked into a 1-D tensor it "
        f"promotes the product to {str(fused).replace('torch.', '')}, where each member is "
        f"{str(out.dtype).replace('torch.', '')}"
    )


def _mul_users(node: Node) -> int:
    return sum(1 for u in node.users if is_call(u, *MUL))


@register
class BatchMul(BatchPattern):
    """``mul(s, v_i)`` with one shared operand ``s`` -> ``unbind(mul(stack(v_i), s))``:
    the shared operand broadcasts against the stack instead of being copied n times.

    Shapes: v_i (...v), s (...s) -> stack (n, [1..], ...v) (padded with size-1 dims up to
    the rank of s), result (n, broadcast(v, s)). The shared operand is the one that more
    ``mul`` nodes read (the first operand on a tie); a product whose operands are each
    read by no other ``mul`` has no key. mul commutes, so ``s * v_i`` and ``v_i * s``
    group together. Tower 0 dotted with each other tower, and MMoE's gates weighting one
    expert tensor, are this shape. Upstream: only the post-grad ``batch_mul`` (aten.mul,
    both operands stacked); no pre-grad fusion (``docs/parity.md``)."""

    name = "batch_mul"
    options = SMALL_GROUPS
    anchors = frozenset(MUL[0]) | frozenset(MUL[1])
    upstream = "none pre-grad (post-grad BatchMulPostGradFusion stacks both operands)"
    description = "Fuse independent products that share one operand into one product of a stack with it."
    preconditions = (
        "torch.mul, * or Tensor.mul of two tensor nodes; no out=",
        "one operand is the same node in every member (the one more mul nodes read); the other operands "
        "have one shape, dtype and device",
        "no in-place write to output or input; members independent; groups of 2 or more that the profit estimate "
        "expects to gain (a pair only when its stack is free: the pieces of one unbind, in order)",
    )

    def split(self, node: Node) -> tuple[Node, Node] | Miss:
        """(shared, varying) operands of ``node``, or a Miss."""
        ops = mul_operands(node)
        if isinstance(ops, Miss):
            return ops
        x, y = ops
        nx, ny = _mul_users(x), _mul_users(y)
        if max(nx, ny) < 2:
            return Miss("no other mul reads either operand")
        return (x, y) if nx >= ny else (y, x)

    def key(self, node: Node):
        ops = self.split(node)
        if isinstance(ops, Miss):
            return ops
        shared, varying = ops
        miss = promotion_miss(node, shared, varying)
        if miss:
            return miss
        return fusion_key(node, ("batch_mul", shared.name, tensor_key(varying), meta.signature(node)))

    def fuse(self, rw: Rewriter, nodes: list[Node]) -> None:
        shared, _ = self.split(nodes[0])  # type: ignore[misc]
        varying = [self.split(n)[1] for n in nodes]  # type: ignore[index]
        vshape, srank = meta.shape(varying[0]), len(meta.shape(shared))
        with rw.inserting_before(nodes[0]):
            v = rw.call(torch.stack, varying)
            if len(vshape) < srank:
                v = rw.call(torch.reshape, v, (len(nodes), *[1] * (srank - len(vshape)), *vshape))
            replace_with_getitems(rw, nodes, rw.call(torch.unbind, rw.call(torch.mul, v, shared)))
