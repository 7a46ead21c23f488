"""Teaching models for the split/cat pattern passes: one tiny model per pattern, each
written the way upstream's tests (test/inductor/test_split_cat_fx_passes.py) build
their cases. Inputs are small float32 CPU tensors; nothing has parameters.
"""

from __future__ import annotations

import torch
from torch import nn

from ._registry import register
from ._util import seeded

BATCH = 8


# ----------------------------------------------------------- remove_split_with_size_one


class TeachSplitSizeOne(nn.Module):
    """A split into a single piece (``x.split(16, 1)`` on width 16) whose piece feeds a relu,
    next to a real two-piece split on another input.

    Inputs ``x (8, 16)``, ``y (8, 16)`` -> ``(relu(x) (8, 16), y0 + y1 (8, 8))``.
    """

    def forward(self, x: torch.Tensor, y: torch.Tensor):
        (only,) = x.split(16, 1)
        y0, y1 = torch.split(y, 8, dim=1)
        return torch.relu(only), y0 + y1


@register(
    name="teach_split_size_one",
    description="a split that yields one piece is its input; a real split next to it stays",
    teaches=("remove_split_with_size_one",),
    kind="teaching",
)
def build_teach_split_size_one():
    """Build :class:`TeachSplitSizeOne`; inputs ``x (8, 16)``, ``y (8, 16)`` -> ``((8, 16), (8, 8))``."""
    with seeded():
        x, y = torch.randn(BATCH, 16), torch.randn(BATCH, 16)
    return TeachSplitSizeOne().eval(), (x, y)


# ------------------------------------------------------------------------ merge_splits


class TeachMergeSplits(nn.Module):
    """``a = split(x, [8, 16, 8], 1)``, then ``a[1]`` split again on the same dim written as
    ``-1``: the two splits become one ``split(x, [8, 8, 8, 8], 1)``.

    Input ``x (8, 32)`` -> output ``(8, 32)`` (pieces scaled by 1..4 and re-concatenated).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a0, a1, a2 = torch.split(x, [8, 16, 8], dim=1)
        b0, b1 = a1.split(8, -1)
        return torch.cat([a0, b0 * 2, b1 * 3, a2 * 4], dim=1)


@register(
    name="teach_merge_splits",
    description="split of a split piece on the same dim (one of them written dim=-1) -> one split",
    teaches=("merge_splits",),
    kind="teaching",
)
def build_teach_merge_splits():
    """Build :class:`TeachMergeSplits`; input ``x (8, 32)`` -> output ``(8, 32)``."""
    with seeded():
        x = torch.randn(BATCH, 32)
    return TeachMergeSplits().eval(), (x,)


# ----------------------------------------------------------------- simplify_split_cat


class TeachSimplifySplitCat(nn.Module):
    """Upstream's ``SplitCatSimplifier`` example: ``s = split(x, 4, 1)`` into 8 pieces,
    ``y = cat([o, s1, s2, s3, o, s5, s6, s7, o], 1)``, and ``s0 * s4`` used elsewhere.
    The runs ``s1..s3`` and ``s5..s7`` each become one piece: ``split(x, [4, 12, 4, 12], 1)``.

    Inputs ``x (8, 32)``, ``o (8, 4)`` -> ``(y (8, 36), z (8, 4))``.
    """

    def forward(self, x: torch.Tensor, o: torch.Tensor):
        s = torch.split(x, 4, dim=1)
        y = torch.cat([o, s[1], s[2], s[3], o, s[5], s[6], s[7], o], dim=1)
        return y, s[0] * s[4]


@register(
    name="teach_simplify_split_cat",
    description="cat of runs of consecutive split pieces between other inputs -> coarser split",
    teaches=("simplify_split_cat",),
    kind="teaching",
)
def build_teach_simplify_split_cat():
    """Build :class:`TeachSimplifySplitCat`; inputs ``x (8, 32)``, ``o (8, 4)`` -> ``((8, 36), (8, 4))``."""
    with seeded():
        x, o = torch.randn(BATCH, 32), torch.randn(BATCH, 4)
    return TeachSimplifySplitCat().eval(), (x, o)


# ---------------------------------------------------------- merge_getitem_cat / mutate_cat


class TeachCatOfPieces(nn.Module):
    """A cat of consecutive pieces ``s1, s2, s3`` of ``split(x, 4, 1)`` (6 pieces), each
    used only by that cat: one wider piece (``merge_getitem_cat``) or a slice
    ``x[:, 4:16]`` (``mutate_cat``). ``s0`` and ``s5`` are used on their own.

    Input ``x (8, 24)`` -> ``(c (8, 12), s0 - s5 (8, 4))``.
    """

    def forward(self, x: torch.Tensor):
        s0, s1, s2, s3, s4, s5 = torch.split(x, 4, dim=1)
        return torch.cat([s1, s2, s3], dim=1), s0 - s5


@register(
    name="teach_cat_of_pieces",
    description="cat of consecutive split pieces -> one wider piece, or a slice of the input",
    teaches=("merge_getitem_cat", "mutate_cat"),
    kind="teaching",
)
def build_teach_cat_of_pieces():
    """Build :class:`TeachCatOfPieces`; input ``x (8, 24)`` -> ``((8, 12), (8, 4))``."""
    with seeded():
        x = torch.randn(BATCH, 24)
    return TeachCatOfPieces().eval(), (x,)


# ------------------------------------------------------------------ split_cat_to_slices

SLICE_PIECES = 16


class TeachSplitCatToSlices(nn.Module):
    """16 pieces of ``split(x, 4, 1)``: a cat takes pieces 0..11 in order (a run of 12,
    over the threshold of 10: one slice ``x[:, :48]``), then ``relu(s12)``, then pieces
    13..15 (a run of 3: left as it is).

    Input ``x (4, 64)`` -> output ``(4, 64)``.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.split(x, 4, dim=1)
        return torch.cat([*s[:12], torch.relu(s[12]), *s[13:]], dim=1)


@register(
    name="teach_split_cat_to_slices",
    description="cat of 12 consecutive split pieces (>= threshold 10) -> one slice; a run of 3 stays",
    teaches=("split_cat_to_slices",),
    kind="teaching",
)
def build_teach_split_cat_to_slices():
    """Build :class:`TeachSplitCatToSlices`; input ``x (4, 64)`` -> output ``(4, 64)``."""
    with seeded():
        x = torch.randn(4, SLICE_PIECES * 4)
    return TeachSplitCatToSlices().eval(), (x,)


# ------------------------------------------------- split_stack_to_cats / unbind_stack_to_slices


class TeachSplitStack(nn.Module):
    """Stacks of pieces:

    * ``a = stack(split(x, 4, 1), dim=1)``: every piece of the split, on another dim:
      a view ``movedim(unflatten(x, 1, (12, 4)), 1, 1)``;
    * ``b = stack([*unbind(y, 0)[:11], w], dim=2)``: 11 consecutive unbind pieces (>= 10)
      and one other tensor: ``cat([movedim(y[:11], 0, 2), stack([w], 2)], 2)``.

    Both results are read by the next op (as inside a model): returned as they are, the
    view of ``x`` would be the graph's output, sharing the caller's input memory.

    Inputs ``x (8, 48)``, ``y (12, 8, 4)``, ``w (8, 4)`` -> ``(2 a (8, 12, 4), b (8, 4, 12))``.
    """

    def forward(self, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor):
        a = torch.stack(torch.split(x, 4, dim=1), dim=1)
        u = torch.unbind(y, 0)
        b = torch.stack([*u[:11], w], dim=2)
        return 2 * a, b + u[11].unsqueeze(-1)


@register(
    name="teach_split_stack",
    description="stack of every split piece -> a view; stack of 11 unbind pieces + 1 -> slice + cat",
    teaches=("split_stack_to_cats", "unbind_stack_to_slices"),
    kind="teaching",
)
def build_teach_split_stack():
    """Build :class:`TeachSplitStack`; inputs ``x (8, 48)``, ``y (12, 8, 4)``, ``w (8, 4)``
    -> ``((8, 12, 4), (8, 4, 12))``."""
    with seeded():
        x, y, w = torch.randn(BATCH, 48), torch.randn(12, BATCH, 4), torch.randn(BATCH, 4)
    return TeachSplitStack().eval(), (x, y, w)


# ------------------------------------------------------- move_reshape_out_of_split_stack


class TeachReshapeSplitStack(nn.Module):
    """``2 * stack([p.reshape(8, 2, 2) for p in split(x, 4, 1)], dim=1)``: 12 reshapes become
    one reshape of the whole input (read by the product, so no output shares ``x``'s memory).

    Input ``x (8, 48)`` -> output ``(8, 12, 2, 2)``.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * torch.stack([p.reshape(BATCH, 2, 2) for p in torch.split(x, 4, dim=1)], dim=1)


@register(
    name="teach_reshape_split_stack",
    description="stack of reshaped split pieces -> one reshape of the split input",
    teaches=("move_reshape_out_of_split_stack",),
    kind="teaching",
)
def build_teach_reshape_split_stack():
    """Build :class:`TeachReshapeSplitStack`; input ``x (8, 48)`` -> output ``(8, 12, 2, 2)``."""
    with seeded():
        x = torch.randn(BATCH, 48)
    return TeachReshapeSplitStack().eval(), (x,)


# ------------------------------------------------------------------ einsum_to_pointwise


class TeachEinsum(nn.Module):
    """``einsum("bcd,bcde->bce", x, w) + bias``: a batched vector-matrix product followed
    by an add, rewritten as ``(x.unsqueeze(-1) * w).sum(-2) + bias``.

    Inputs ``x (2, 3, 4)``, ``w (2, 3, 4, 5)``, ``bias (5,)`` -> output ``(2, 3, 5)``.
    """

    def forward(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bcd,bcde->bce", x, w) + bias


@register(
    name="teach_einsum",
    description="einsum('bcd,bcde->bce') feeding an add -> broadcast multiply + sum",
    teaches=("einsum_to_pointwise",),
    kind="teaching",
)
def build_teach_einsum():
    """Build :class:`TeachEinsum`; inputs ``x (2, 3, 4)``, ``w (2, 3, 4, 5)``, ``bias (5,)``
    -> output ``(2, 3, 5)``."""
    with seeded():
        x, w, b = torch.randn(2, 3, 4), torch.randn(2, 3, 4, 5), torch.randn(5)
    return TeachEinsum().eval(), (x, w, b)
