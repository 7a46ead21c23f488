"""einsum-to-pointwise (upstream: torch/_inductor/fx_passes/split_cat.py,
``einsum_to_pointwise_pass``, ``replace_einsum_to_pointwise``)."""

from __future__ import annotations

import operator

import torch
from torch.fx import Node

from optimus_lens.core import meta
from optimus_lens.core.miss import Miss
from optimus_lens.core.pattern import AnchoredPattern, Match, register
from optimus_lens.core.rewriter import Rewriter
from optimus_lens.passes.common import arg, is_call


def einsum_letters(eq: str) -> tuple[str, str, str] | None:
    """``(s1, s2, s3)`` for an equation shaped like ``"bcd,bcde->bce"`` (upstream's
    ``match_einsum_strings``) whose four letters are distinct; else None.

    Upstream does not ask for distinct letters and accepts e.g. ``"bcc,bccd->bcd"``, where
    einsum takes a diagonal and the pointwise form computes something else."""
    parts = eq.replace(" ", "").replace("->", ",").split(",")
    if len(parts) != 3:
        return None
    s1, s2, s3 = parts
    if (len(s1), len(s2), len(s3)) != (3, 4, 3) or len(set(s2)) != 4:
        return None
    if s1 == s2[:3] and s3 == s2[:2] + s2[3]:
        return s1, s2, s3
    return None


@register
class EinsumToPointwise(AnchoredPattern):
    """``torch.einsum("bcd,bcde->bce", x, w)`` -> ``(x.unsqueeze(-1) * w).sum(-2)``.

    Shapes: x (B, C, D), w (B, C, D, E) -> (B, C, E). Like upstream, only when some user
    is an ``add`` (so Inductor can fuse the multiply, the sum and the add)."""

    name = "einsum_to_pointwise"
    upstream = "einsum_to_pointwise_pass (replace_einsum_to_pointwise)"
    description = "Rewrite einsum('bcd,bcde->bce', x, w) into a broadcast multiply and a sum."
    preconditions = (
        "torch.einsum with exactly two operands and an equation 'bcd,bcde->bce' (4 distinct letters)",
        "operand shapes agree exactly on b, c, d and share a dtype",
        "some user is an add (operator.add, torch.add or Tensor.add)",
    )
    anchors = frozenset({torch.functional.einsum})

    def find(self, node: Node):
        eq = arg(node, 0, "equation")
        ops = list(node.args[1:])
        if len(ops) == 1 and isinstance(ops[0], (list, tuple)):
            ops = list(ops[0])
        if not isinstance(eq, str) or einsum_letters(eq) is None:
            return Miss(f"equation {eq!r} is not of the form 'bcd,bcde->bce' with 4 distinct letters")
        if len(ops) != 2:
            return Miss("einsum does not have exactly two operands")
        x, w = (meta.tensor(o) for o in ops)
        if x is None or w is None:
            return Miss("operands have no example values")
        if x.dim() != 3 or w.dim() != 4 or tuple(x.shape) != tuple(w.shape[:3]) or x.dtype != w.dtype:
            return Miss(f"operand shapes {tuple(x.shape)} and {tuple(w.shape)} (or dtypes) do not line up")
        if not any(is_call(u, {operator.add, torch.add}, {"add"}) for u in node.users):
            return Miss("no user is an add")
        return Match(node, [node], {"x": ops[0], "w": ops[1]})

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        with rw.inserting_before(m.anchor):
            prod = rw.call(torch.mul, rw.call(torch.unsqueeze, m.info["x"], -1), m.info["w"])
            total = rw.call(torch.sum, prod, -2)
        rw.carry_meta(m.anchor, total)
        rw.replace_all_uses(m.anchor, total)
        rw.erase(m.anchor)
