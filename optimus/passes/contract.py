"""A broadcast product summed over a shared dim is a matrix product: ``mul_sum_to_matmul``.

Beyond upstream's catalogue (``docs/parity.md``). Upstream's ``einsum_to_pointwise``
(torch/_inductor/fx_passes/split_cat.py) goes the other way, for one einsum shape
whose user is an add, so Inductor can fuse the product into it; this pattern only takes
products with a free dim on each side, which no pointwise kernel computes without
materialising the whole broadcast product first.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import torch
from torch.fx import Node

from optimus_lens.core import meta
from optimus_lens.core.miss import Miss, need
from optimus_lens.core.pattern import AnchoredPattern, Match, register
from optimus_lens.core.rewriter import Rewriter
from optimus_lens.passes.common import REQUIRED, SUM, bind_args, is_call, mul_operands, mutation_miss

#: below this many elements in the broadcast product the two small kernels it replaces
#: cost less than einsum's own permutes and reshapes (measured on CPU eager, torch 2.13)
MIN_PRODUCT_ELEMENTS = 4096


def contraction(xs: tuple[int, ...], ys: tuple[int, ...], out: tuple[int, ...], summed: set[int]) -> Contraction | Miss:
    """How ``(x * y).sum(summed)`` is a matrix product, for x and y of shapes ``xs`` and
    ``ys`` broadcast to ``out``; or a Miss when it is not one: it needs a summed dim of
    size > 1 in both operands and a kept dim of size > 1 in each operand alone.

    Example: x (3, B, 8, 1), y (B, 8, E), summed {2} -> equation ``"abc,bcd->abd"``
    (each operand's size-1 dims squeezed out), batch ``b``, contracted ``c``, free ``a``
    and ``d``."""
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
    batch = [i for i in range(r) if i not in summed and sx[i] > 1 and sy[i] > 1]
    only = [i for i in summed if (sx[i] > 1) != (sy[i] > 1)]  # summed in one operand only
    return Contraction(
        "".join(letters[i] for i in range(r) if sx[i] > 1),
        "".join(letters[i] for i in range(r) if sy[i] > 1),
        "".join(letters[i] for i in range(r) if i not in summed and out[i] > 1),
        "".join(letters[i] for i in batch) if not only else None,
        "".join(letters[i] for i in both),
    )


@dataclass(frozen=True)
class Contraction:
    """``einsum(f"{x},{y}->{out}")`` over the squeezed operands. ``batch`` (None when some
    summed dim spans one operand only: only einsum says that) and ``contracted`` name the
    dims both operands span; the other letters of ``x`` / ``y`` are their free dims."""

    x: str
    y: str
    out: str
    batch: str | None
    contracted: str

    @property
    def equation(self) -> str:
        return f"{self.x},{self.y}->{self.out}"

    def plain(self) -> bool:
        """One free dim per operand, one contracted dim and at most one batch dim: a
        single ``mm`` / ``bmm`` of permuted operands."""
        free_x = [c for c in self.x if c not in self.contracted and c not in (self.batch or "")]
        free_y = [c for c in self.y if c not in self.contracted and c not in (self.batch or "")]
        return (
            self.batch is not None
            and len(self.batch) <= 1
            and len(self.contracted) == 1
            and (len(free_x) == len(free_y) == 1)
        )


def matmul_of(rw: Rewriter, c: Contraction, x: Node, y: Node) -> Node:
    """``torch.bmm`` (``torch.mm`` without a batch dim) of ``x`` and ``y`` permuted to
    ``(batch, m, k)`` and ``(batch, k, n)``, the result permuted to ``c.out``'s order when
    ``c.plain()``; else ``torch.einsum(c.equation, x, y)`` (which does the same with
    reshapes, in more Python). x, y: the squeezed operands, dims lettered as ``c.x``, ``c.y``."""
    if not c.plain():
        return rw.call(torch.einsum, c.equation, x, y)
    b, k = c.batch or "", c.contracted
    (m,) = [ch for ch in c.x if ch not in b + k]
    (n,) = [ch for ch in c.y if ch not in b + k]

    def arranged(v: Node, have: str, want: str) -> Node:
        order = [have.index(ch) for ch in want]
        return v if order == sorted(order) else rw.call(torch.permute, v, order)

    prod = rw.call(torch.bmm if b else torch.mm, arranged(x, c.x, b + m + k), arranged(y, c.y, b + k + n))
    return arranged(prod, b + m + n, c.out)


@register
class MulSumToMatmul(AnchoredPattern):
    """``(x * y).sum(dims)`` -> ``bmm`` / ``mm`` of the permuted operands, or ``einsum``
    for a contraction of more dims (:func:`matmul_of`), when the product is a matrix
    product (:func:`contraction`). The operands' size-1 dims are squeezed first, and a
    reshape restores the size-1 dims of the sum's shape.

    Shapes (MMoE's gate mixing after ``batch_mul``/``batch_sum``): gates (T, B, K, 1),
    experts (B, K, E), summed over K -> ``bmm`` of (B, T, K) and (B, K, E) -> (T, B, E)
    (a permuted view), instead of a (T, B, K, E) product and its sum. Upstream: no such
    rewrite (``docs/parity.md``)."""

    name = "mul_sum_to_matmul"
    upstream = "none (beyond upstream's catalogue; the inverse of einsum_to_pointwise for matrix products)"
    description = "Rewrite a broadcast product summed over a shared dim, a matrix product in disguise, into bmm."
    preconditions = (
        "torch.sum / Tensor.sum with constant dims and keepdim, no dtype=, of a mul of two tensor nodes",
        "the product is read only by the sum; float32 or float64 operands of one device",
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
        if xt.dtype != yt.dtype or xt.device != yt.device:
            return Miss("operands differ in dtype or device")
        if xt.dtype not in (torch.float32, torch.float64):
            return Miss(
                f"{xt.dtype} operands: the product rounds each term to {xt.dtype} before the sum and a matmul "
                "does not, so the results differ by more than verification's tolerance"
            )
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
        con = need(contraction(tuple(xt.shape), tuple(yt.shape), tuple(pt.shape), {d % r for d in dims}))
        miss = mutation_miss(prod) or mutation_miss(node)
        return miss or Match(node, [node, prod], {"x": x, "y": y, "contraction": con})

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        node, prod = m.nodes
        with rw.inserting_before(node):
            out = matmul_of(rw, m.info["contraction"], squeezed(rw, m.info["x"]), squeezed(rw, m.info["y"]))
            if tuple(meta.shape(out)) != tuple(meta.shape(node)):
                out = rw.call(torch.reshape, out, tuple(meta.shape(node)))
        rw.carry_meta(node, out)
        rw.replace_all_uses(node, out)
        rw.erase(node)
        rw.erase(prod)
        for v in dict.fromkeys((m.info["x"], m.info["y"])):  # an unsqueeze the product alone read
            if not v.users and v.op in ("call_function", "call_method") and is_call(v, *ADDS_ONES):
                rw.erase(v)


#: views that only add size-1 dims to their input (for a reshape: when the shapes say so)
ADDS_ONES = ({torch.unsqueeze, torch.reshape}, {"unsqueeze", "reshape", "view"})


def squeezed(rw: Rewriter, v: Node) -> Node:
    """``v`` without its size-1 dims: the input of ``v`` when ``v`` only added them (an
    ``unsqueeze``, or a reshape/view to the same sizes with ones between: the elements
    are in the same order), else ``squeeze(v, ones)`` (``v`` itself when it has none)."""
    shape = meta.shape(v)
    ones = tuple(i for i, s in enumerate(shape) if s == 1)
    if not ones:
        return v
    src = v.args[0] if is_call(v, *ADDS_ONES) and v.args and isinstance(v.args[0], Node) else None
    if src is not None and meta.tensor(src) is not None:
        if [s for s in meta.shape(src) if s != 1] == [s for s in shape if s != 1] and 1 not in meta.shape(src):
            return src
    return rw.call(torch.squeeze, v, ones)
