"""The towers graph of ``benchmarks/search_scale.py`` as an ``nn.Module``, for the benchmarks
that need a real model (``post_grad_scale.py``: its ATen graphs for training;
``compile_e2e.py``: ``torch.compile`` end to end).

``Towers(T, L)``: the input ``x`` of shape ``(B, T*D)`` is split into T slices of D
features (``torch.split(x, D, dim=1)``), each goes through L layers of ``Linear(D, D)``
and ``ReLU``, then a ``LayerNorm(D)``, and the T tower outputs are concatenated on dim 1
into ``(B, T*D)``. Dynamo captures about ``T * (4L + 4)`` pre-grad nodes, the same graph
``search_scale.build_towers`` builds directly (module paths ``towers.{t}.fc{i}``,
``towers.{t}.act{i}``, ``towers.{t}.norm``).
"""

from __future__ import annotations

import torch
from torch import nn

TOWERS = 128  # T
WIDTH = 8  # D
BATCH = 4  # B


def shape_for(nodes: int, towers: int = TOWERS) -> tuple[int, int]:
    """(towers T, layers L) giving about ``nodes`` pre-grad FX nodes (as
    ``search_scale.shape_for``)."""
    return towers, max(1, round((nodes / towers - 4) / 4))


class Tower(nn.Module):
    """L x (Linear(D, D), ReLU), then LayerNorm(D): ``(B, D) -> (B, D)``."""

    def __init__(self, layers: int, width: int = WIDTH):
        super().__init__()
        self.layers = layers
        for i in range(layers):
            setattr(self, f"fc{i}", nn.Linear(width, width))
            setattr(self, f"act{i}", nn.ReLU())
        self.norm = nn.LayerNorm(width)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for i in range(self.layers):
            h = getattr(self, f"act{i}")(getattr(self, f"fc{i}")(h))
        return self.norm(h)


class Towers(nn.Module):
    """T towers over the D-wide slices of ``x`` ``(B, T*D)``; returns ``(B, T*D)``."""

    def __init__(self, towers: int, layers: int, width: int = WIDTH):
        super().__init__()
        self.width = width
        self.towers = nn.ModuleList(Tower(layers, width) for _ in range(towers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pieces = torch.split(x, self.width, dim=1)
        return torch.cat([t(p) for t, p in zip(self.towers, pieces)], dim=1)


def towers_model(nodes: int, towers: int = TOWERS, seed: int = 0) -> tuple[Towers, torch.Tensor]:
    """A seeded ``Towers`` model of about ``nodes`` pre-grad nodes and its input
    ``(BATCH, T*WIDTH)``."""
    t, layers = shape_for(nodes, towers)
    torch.manual_seed(seed)
    model = Towers(t, layers)
    return model, torch.randn(BATCH, t * WIDTH)
