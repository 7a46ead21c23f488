"""A broadcast product summed over a shared dim is a matrix product: ``mul_sum_to_einsum``.

Beyond upstream's catalogue (``docs/parity.md``). Upstream's ``einsum_to_pointwise``
(torch/_inductor/fx_passes/split_cat.py) goes the other way, for one einsum shape
whose user is an add, so Inductor can fuse the product into it; this pattern only takes
products with a free dim on each side, which no pointwise kernel computes without
materialising the whole broadcast product first.
"""

from __future__ import annotations

import string

import torch
from torch.fx import Node

from optimus_lens import meta
from optimus_lens.passes.batch import mutation_miss
from optimus_lens.passes.batch_extra import mul_operands
from optimus_lens.passes.common import REQUIRED, bind_args, call
from optimus_lens.pattern import AnchoredPattern, Match, Miss, need, register
from optimus_lens.rewriter import Rewriter

SUM = ({torch.sum}, {"sum"})

#: below this many elements in the broadcast product the two small kernels it replaces
#: cost less than einsum's own permutes and reshapes (measured on CPU eager, torch 2.13)
MIN_PRODUCT_ELEMENTS = 4096


def contraction(xs: tuple[int, ...], ys: tuple[int, ...], out: tuple[int, ...], summed: set[int]) -> str | Miss:
    """The einsum equation for ``(x * y).sum(summed)``, with x and y of shapes ``xs`` and
    ``ys`` broadcast to ``out``, each operand's size-1 dims squeezed out; or a Miss when
    the product is not a matrix product: it needs a summed dim of size > 1 in both
    operands and a kept dim of size > 1 in each operand alone.

    Example: x (3, B, 8, 1), y (B, 8, E), summed {2} -> ``"abc,bcd->abd"``."""
    r = len(out)
    sx, sy = (1,) * (r - len(xs)) + tuple(xs), (1,) * (r - len(ys)) + tuple(ys)
    letters = string.ascii_letters[:r]
    both = [i for i in summed if sx[i] > 1 and sy[i] > 1]
    x_free = [i for i in range(r) if i not in summed and sx[i] > 1 and sy[i] == 1]
    y_free = [i for i in range(r) if i not in summed and sy[i] > 1 and sx[i] == 1]
    if not (both and x_free and y_free):
        return Miss(
            "not a matrix product: needs a summed dim both operands span and a kept dim each spans alone "
            f"(shapes {tuple(xs)} and {tuple(ys)}, summed dims {sorted(summed)})"
        )
    sub_x = "".join(letters[i] for i in range(r) if sx[i] > 1)
    sub_y = "".join(letters[i] for i in range(r) if sy[i] > 1)
    sub_o = "".join(letters[i] for i in range(r) if i not in summed and out[i] > 1)
    return f"{sub_x},{sub_y}->{sub_o}"


@register
class MulSumToEinsum(AnchoredPattern):
    """``(x * y).sum(dims)`` -> ``einsum(eq, x', y')`` when the product is a (batched)
    matrix product (:func:`contraction`); ``x'``/``y'`` are the operands with their
    size-1 dims squeezed, and a reshape restores size-1 and kept dims of the sum's shape.

    Shapes (MMoE's gate mixing after ``batch_mul``/``batch_sum``): gates (T, B, K, 1),
    experts (B, K, E), summed over K -> (T, B, E), one ``bmm`` instead of a (T, B, K, E)
    product and its sum. Upstream: no such rewrite (``docs/parity.md``)."""

    name = "mul_sum_to_einsum"
    upstream = "none (beyond upstream's catalogue; the inverse of einsum_to_pointwise for matrix products)"
    description = "Rewrite a broadcast product summed over a shared dim, a matrix product in disguise, into einsum."
    preconditions = (
        "torch.sum / Tensor.sum with constant dims and keepdim, no dtype=, of a mul of two tensor nodes",
        "the product is read only by the sum; float operands of one dtype and device",
        "a summed dim of size > 1 in both operands, and a kept dim of size > 1 in each operand alone",
        f"the broadcast product has at least {MIN_PRODUCT_ELEMENTS} elements",
        "no in-place write to the product, the sum or the operands",
    )
    anchors = frozenset(SUM[0]) | frozenset(SUM[1])

    def find(self, node: Node):
        a = need(bind_args(node, (("input", REQUIRED), ("dim", None), ("keepdim", False), ("dtype", None))))
        prod, dim = a["input"], a["dim"]
        if a["dtype"] is not None or not isinstance(a["keepdim"], bool):
            return Miss("dtype= is given or keepdim is not a constant")
        if not isinstance(prod, Node):
            return Miss("the summed value is not a node")
        x, y = need(mul_operands(prod))
        if len(prod.users) != 1:
            return Miss(f"the product {prod.name} has other users")
        xt, yt, pt = meta.tensor(x), meta.tensor(y), meta.tensor(prod)
        if xt.dtype != yt.dtype or not xt.dtype.is_floating_point or xt.device != yt.device:
            return Miss("operands differ in dtype or device, or are not floating point")
        if not all(type(d) is int for d in (*xt.shape, *yt.shape)):
            return Miss("symbolic sizes")
        r = pt.dim()
        dims = range(r) if dim is None else (dim,) if isinstance(dim, int) else dim
        if not isinstance(dims, (range, tuple, list)) or not all(isinstance(d, int) and -r <= d < r for d in dims):
            return Miss("dims are not constant ints in range")
        if pt.numel() < MIN_PRODUCT_ELEMENTS:
            return Miss(
                f"the product has {pt.numel()} elements (< {MIN_PRODUCT_ELEMENTS}): two small kernels are cheaper"
            )
        eq = need(contraction(tuple(xt.shape), tuple(yt.shape), tuple(pt.shape), {d % r for d in dims}))
        miss = mutation_miss(prod) or mutation_miss(node)
        return miss or Match(node, [node, prod], {"x": x, "y": y, "eq": eq})

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        def squeezed(v: Node) -> Node:
            ones = tuple(i for i, s in enumerate(meta.shape(v)) if s == 1)
            return call(rw, torch.squeeze, v, ones) if ones else v

        node, prod = m.nodes
        with rw.inserting_before(node):
            out = call(rw, torch.einsum, m.info["eq"], squeezed(m.info["x"]), squeezed(m.info["y"]))
            if tuple(meta.shape(out)) != tuple(meta.shape(node)):
                out = call(rw, torch.reshape, out, tuple(meta.shape(node)))
        rw.carry_meta(node, out)
        rw.replace_all_uses(node, out)
        rw.erase(node)
        rw.erase(prod)
