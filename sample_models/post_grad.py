"""Sample models for the post-grad (ATen) passes: each holds one shape that PyTorch's own
post-grad Optimus passes get wrong, so ``optimus observe MODEL --stage post-grad`` shows a
failing verified step and ``optimus run MODEL --stage post-grad`` shows ours keeping the
outputs. Float32 parameters and outputs, like every sample; the bf16 half of
``post_grad_mixed_dtype_mm`` is computed in bf16 inside ``forward``.

* ``post_grad_sub_alpha``: ten ``torch.sub(x_i, y_i, alpha=2)`` of one shape
  (``batch_aten_sub``: upstream fuses them into one ``sub`` without ``alpha``);
* ``post_grad_uneven_split``: ``torch.split(x, 4, dim=1)`` of 18 columns (4, 4, 4, 4, 2)
  (``normalization_aten_pass``: upstream writes ``split_with_sizes(x, [4, 4, 4, 4, 4])``,
  which raises);
* ``post_grad_mixed_dtype_mm``: five fp32 and five bf16 matrix products of one shape
  (``batch_linear_post_grad``: upstream's key has no dtype, so one ``bmm`` runs all ten in
  fp32 and the bf16 ones come out in another dtype, with other values).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ._registry import register
from ._util import seeded


class SubAlpha(nn.Module):
    """Ten independent ``torch.sub(x_i, y_i, alpha=2)`` of ``(8, 16)`` slices, stacked.

    Input ``x``, ``y`` ``(10, 8, 16)`` -> output ``(10, 8, 16)``."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.stack([torch.tanh(torch.sub(x[i] * 1.5, y[i] * 0.5, alpha=2)) for i in range(x.shape[0])])


@register(
    name="post_grad_sub_alpha",
    description="ten sub(x_i, y_i, alpha=2) of one shape: upstream's batch_aten_sub drops alpha",
    teaches=("batch_aten_sub",),
    kind="demo",
)
def build_post_grad_sub_alpha():
    """Build :class:`SubAlpha`; inputs ``x``, ``y`` ``(10, 8, 16)`` float32 -> ``(10, 8, 16)``."""
    with seeded():
        x, y = torch.randn(10, 8, 16), torch.randn(10, 8, 16)
    return SubAlpha().eval(), (x, y)


class UnevenSplit(nn.Module):
    """``torch.split(x, 4, dim=1)`` of 18 columns (pieces of 4, 4, 4, 4 and 2), each piece
    through its own ``Linear(k, 8)``, concatenated.

    Input ``x`` ``(6, 18)`` -> output ``(6, 40)``."""

    def __init__(self) -> None:
        super().__init__()
        self.heads = nn.ModuleList(nn.Linear(k, 8) for k in (4, 4, 4, 4, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([h(p) for h, p in zip(self.heads, torch.split(x, 4, dim=1))], dim=1)


@register(
    name="post_grad_uneven_split",
    description="split(x, 4) of 18 columns: upstream's normalization_aten_pass writes five sections of 4",
    teaches=("normalization_aten_pass",),
    kind="demo",
)
def build_post_grad_uneven_split():
    """Build :class:`UnevenSplit`; input ``x`` ``(6, 18)`` float32 -> ``(6, 40)``."""
    with seeded():
        model = UnevenSplit().eval()
        x = torch.randn(6, 18)
    return model, (x,)


class MixedDtypeLinears(nn.Module):
    """Ten ``Linear(16, 16)`` on the ten ``(8, 16)`` slices of ``x``: the first five in
    fp32, the last five in bf16 (weights, bias and input cast inside ``forward``), every
    result cast back to fp32 and summed.

    Input ``x`` ``(10, 8, 16)`` -> output ``(8, 16)``."""

    def __init__(self) -> None:
        super().__init__()
        self.linears = nn.ModuleList(nn.Linear(16, 16) for _ in range(10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = []
        for i, lin in enumerate(self.linears):
            if i < 5:
                out.append(torch.relu(lin(x[i])))
            else:
                w, b = lin.weight.to(torch.bfloat16), lin.bias.to(torch.bfloat16)
                out.append(torch.relu(nn.functional.linear(x[i].to(torch.bfloat16), w, b)).float())
        return torch.stack(out).sum(0)


@register(
    name="post_grad_mixed_dtype_mm",
    description="five fp32 and five bf16 linears of one shape: upstream's batch_linear_post_grad fuses them together",
    teaches=("batch_linear_post_grad",),
    kind="demo",
)
def build_post_grad_mixed_dtype_mm():
    """Build :class:`MixedDtypeLinears`; input ``x`` ``(10, 8, 16)`` float32 -> ``(8, 16)``."""
    with seeded():
        model = MixedDtypeLinears().eval()
        x = torch.randn(10, 8, 16)
    return model, (x,)
