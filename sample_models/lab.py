"""Models for the Pattern Lab: graphs where a user-written pattern has something to find."""

from __future__ import annotations

import torch
from torch import nn

from ._registry import register
from ._util import seeded


class SwishMLP(nn.Module):
    """Four ``Linear(32, 32)`` layers with the Swish activation written out by hand,
    ``h * torch.sigmoid(h)``, as models ported from papers often do; the last one is
    written ``torch.sigmoid(h) * h`` (operands swapped: a near miss for a pattern that
    expects ``x * sigmoid(x)``). Input ``(8, 32)`` -> output ``(8, 32)``."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(32, 32) for _ in range(4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for layer in self.layers[:-1]:
            h = layer(h)
            h = h * torch.sigmoid(h)
        h = self.layers[-1](h)
        return torch.sigmoid(h) * h


@register(
    name="swish_mlp",
    description="4 Linear layers with hand-written Swish (h * sigmoid(h)); the last spelt sigmoid(h) * h",
    teaches=(),
    kind="demo",
)
def build_swish_mlp():
    """Build :class:`SwishMLP`; input ``(8, 32)`` -> output ``(8, 32)``."""
    with seeded():
        model = SwishMLP().eval()
        x = torch.randn(8, 32)
    return model, (x,)
