"""Teaching models for the identity cleanups (``remove_*``), ``merge_split_squeeze``,
``merge_unbind_stack`` and the four ``normalize_*`` rewrites: one tiny model each, in
which its pattern is the only thing to do. Inputs are small float32 CPU tensors;
nothing has parameters.
"""

from __future__ import annotations

import torch
from torch import nn

from ._registry import register
from ._util import seeded

BATCH = 8


def _inputs(*shapes: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    with seeded():
        return tuple(torch.randn(*s) for s in shapes)


# ------------------------------------------------------------------ remove_unbind_stack


class TeachRemoveUnbindStack(nn.Module):
    """``stack(unbind(x, 1), 1)`` is ``x``; a relu reads it. Input ``x (8, 4, 8)`` -> ``(8, 4, 8)``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.stack(torch.unbind(x, dim=1), dim=1))


@register(
    name="teach_remove_unbind_stack",
    kind="teaching",
    teaches=("remove_unbind_stack",),
    description="a stack of every unbind piece, in order, on the unbind's dim is the unbind's input",
)
def build_teach_remove_unbind_stack():
    """Build :class:`TeachRemoveUnbindStack`; input ``x (8, 4, 8)`` -> output ``(8, 4, 8)``."""
    return TeachRemoveUnbindStack().eval(), _inputs((BATCH, 4, 8))


# ------------------------------------------------------------------ remove_stack_unbind


class TeachRemoveStackUnbind(nn.Module):
    """Four tensors stacked on dim 1 and unbound again on dim 1: the pieces are the tensors.

    Inputs ``a, b, c, d (8, 16)`` -> ``(8, 16)`` (a weighted sum of the pieces)."""

    def forward(self, a, b, c, d):
        p0, p1, p2, p3 = torch.unbind(
            torch.stack([torch.tanh(a), torch.tanh(b), torch.tanh(c), torch.tanh(d)], dim=1), dim=1
        )
        return p0 + 2 * p1 + 3 * p2 + 4 * p3


@register(
    name="teach_remove_stack_unbind",
    kind="teaching",
    teaches=("remove_stack_unbind",),
    description="unbinding a stack on the stack's dim gives back the stacked tensors",
)
def build_teach_remove_stack_unbind():
    """Build :class:`TeachRemoveStackUnbind`; inputs ``4 x (8, 16)`` -> output ``(8, 16)``."""
    return TeachRemoveStackUnbind().eval(), _inputs(*[(BATCH, 16)] * 4)


# --------------------------------------------------------------------- remove_split_cat


class TeachRemoveSplitCat(nn.Module):
    """``cat(split(x, [4, 8, 4], 1), 1)`` is ``x``; a sigmoid reads it. Input ``x (8, 16)`` -> ``(8, 16)``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(torch.cat(torch.split(x, [4, 8, 4], dim=1), dim=1))


@register(
    name="teach_remove_split_cat",
    kind="teaching",
    teaches=("remove_split_cat",),
    description="a cat of every split piece, in order, on the split's dim is the split's input",
)
def build_teach_remove_split_cat():
    """Build :class:`TeachRemoveSplitCat`; input ``x (8, 16)`` -> output ``(8, 16)``."""
    return TeachRemoveSplitCat().eval(), _inputs((BATCH, 16))


# --------------------------------------------------------------------- remove_cat_split


class TeachRemoveCatSplit(nn.Module):
    """Three tensors concatenated on dim 1 and split back into their widths 4, 8, 4: the
    pieces are the tensors. Inputs ``a (8, 4)``, ``b (8, 8)``, ``c (8, 4)`` -> ``(8, 4)``."""

    def forward(self, a, b, c):
        p0, p1, p2 = torch.split(torch.cat([torch.relu(a), torch.relu(b), torch.relu(c)], dim=1), [4, 8, 4], dim=1)
        return p0 * p2 + p1[:, :4]


@register(
    name="teach_remove_cat_split",
    kind="teaching",
    teaches=("remove_cat_split",),
    description="splitting a cat back into its inputs' sizes on the cat's dim gives back the inputs",
)
def build_teach_remove_cat_split():
    """Build :class:`TeachRemoveCatSplit`; inputs ``(8, 4), (8, 8), (8, 4)`` -> output ``(8, 4)``."""
    return TeachRemoveCatSplit().eval(), _inputs((BATCH, 4), (BATCH, 8), (BATCH, 4))


# ------------------------------------------------------------------ merge_split_squeeze


class TeachMergeSplitSqueeze(nn.Module):
    """``split(x, 1, dim=1)`` into four size-1 pieces, each squeezed on dim 1: an unbind.

    Input ``x (8, 4, 16)`` -> ``(8, 16)`` (a weighted sum of the four rows)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p0, p1, p2, p3 = (p.squeeze(1) for p in torch.split(x, [1, 1, 1, 1], dim=1))
        return p0 + 2 * p1 + 3 * p2 + 4 * p3


@register(
    name="teach_merge_split_squeeze",
    kind="teaching",
    teaches=("merge_split_squeeze",),
    description="a split into size-1 pieces, each squeezed on the split dim, is an unbind",
)
def build_teach_merge_split_squeeze():
    """Build :class:`TeachMergeSplitSqueeze`; input ``x (8, 4, 16)`` -> output ``(8, 16)``."""
    return TeachMergeSplitSqueeze().eval(), _inputs((BATCH, 4, 16))


# ------------------------------------------------------------------- merge_unbind_stack


class TeachMergeUnbindStack(nn.Module):
    """Every piece of ``unbind(x, 1)``, in order, stacked on dim 2 (not the unbind's dim):
    a view of ``x`` (a movedim), not an identity. Input ``x (8, 4, 16)`` -> ``(8, 16, 4)``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.stack(torch.unbind(x, dim=1), dim=2))


@register(
    name="teach_merge_unbind_stack",
    kind="teaching",
    teaches=("merge_unbind_stack",),
    description="a stack of all the pieces of an unbind, in order, on another dim is a view of its input",
)
def build_teach_merge_unbind_stack():
    """Build :class:`TeachMergeUnbindStack`; input ``x (8, 4, 16)`` -> output ``(8, 16, 4)``."""
    return TeachMergeUnbindStack().eval(), _inputs((BATCH, 4, 16))


# -------------------------------------------------------------------------- normalize_*


class TeachNormalizeSplit(nn.Module):
    """``x.split(4, -1)`` (int size, negative dim, method form). Input ``x (8, 12)`` -> ``(8, 4)``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b, c = x.split(4, -1)
        return a * b + c


class TeachNormalizeUnbind(nn.Module):
    """``x.unbind(-2)`` (method form, negative dim). Input ``x (8, 3, 16)`` -> ``(8, 16)``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b, c = x.unbind(-2)
        return a * b + c


class TeachNormalizeCat(nn.Module):
    """``torch.concat((a, b), -1)`` (alias, tuple, negative dim). Inputs ``a, b (8, 8)`` -> ``(8, 16)``."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.concat((torch.tanh(a), torch.tanh(b)), -1))


class TeachNormalizeStack(nn.Module):
    """``torch.stack((a, b), -1)`` (tuple, negative dim). Inputs ``a, b (8, 8)`` -> ``(8, 8, 2)``."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.stack((torch.tanh(a), torch.tanh(b)), -1))


@register(
    name="teach_normalize_split",
    kind="teaching",
    teaches=("normalize_split",),
    description="x.split(4, -1) -> torch.split(x, [4, 4, 4], dim=1)",
)
def build_teach_normalize_split():
    """Build :class:`TeachNormalizeSplit`; input ``x (8, 12)`` -> output ``(8, 4)``."""
    return TeachNormalizeSplit().eval(), _inputs((BATCH, 12))


@register(
    name="teach_normalize_unbind",
    kind="teaching",
    teaches=("normalize_unbind",),
    description="x.unbind(-2) -> torch.unbind(x, dim=1)",
)
def build_teach_normalize_unbind():
    """Build :class:`TeachNormalizeUnbind`; input ``x (8, 3, 16)`` -> output ``(8, 16)``."""
    return TeachNormalizeUnbind().eval(), _inputs((BATCH, 3, 16))


@register(
    name="teach_normalize_cat",
    kind="teaching",
    teaches=("normalize_cat",),
    description="torch.concat((a, b), -1) -> torch.cat([a, b], dim=1)",
)
def build_teach_normalize_cat():
    """Build :class:`TeachNormalizeCat`; inputs ``a, b (8, 8)`` -> output ``(8, 16)``."""
    return TeachNormalizeCat().eval(), _inputs((BATCH, 8), (BATCH, 8))


@register(
    name="teach_normalize_stack",
    kind="teaching",
    teaches=("normalize_stack",),
    description="torch.stack((a, b), -1) -> torch.stack([a, b], dim=2)",
)
def build_teach_normalize_stack():
    """Build :class:`TeachNormalizeStack`; inputs ``a, b (8, 8)`` -> output ``(8, 8, 2)``."""
    return TeachNormalizeStack().eval(), _inputs((BATCH, 8), (BATCH, 8))
