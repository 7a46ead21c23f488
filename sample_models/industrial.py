"""A paper-scale sample: ``industrial_recsys``, a DLRM-style model with 128 dense towers
and 128 sparse features — the width at which Optimus' horizontal fusions pay off, and
the size (5,000+ FX nodes) at which a viewer has to fold repetition to stay readable."""

from __future__ import annotations

import torch
from torch import nn

from ._registry import register
from ._util import seeded

INDUSTRIAL_BATCH = 8
INDUSTRIAL_TOWERS = 128
INDUSTRIAL_TOWER_IN = 8
INDUSTRIAL_HIDDEN = 16
INDUSTRIAL_LAYERS = 7
INDUSTRIAL_SPARSE = 128
INDUSTRIAL_VOCAB = 50
INDUSTRIAL_EMB = 8


class DeepTower(nn.Module):
    """One dense tower: ``layers`` x (Linear -> ReLU), then LayerNorm.

    Input ``(B, d_in)`` -> output ``(B, hidden)``."""

    def __init__(self, d_in: int, hidden: int, layers: int):
        super().__init__()
        dims = [d_in] + [hidden] * layers
        self.fcs = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:]))
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for fc in self.fcs:
            x = torch.relu(fc(x))
        return self.norm(x)


class SparseFeature(nn.Module):
    """One sparse feature: embedding lookup of ``(B, bag)`` ids, mean over the bag,
    ``sigmoid(Linear(emb))``. ``(B, bag)`` -> ``(B, hidden)``."""

    def __init__(self, vocab: int, emb: int, hidden: int):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.proj = nn.Linear(emb, hidden)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.proj(self.emb(ids).mean(dim=1)))


class IndustrialRecsys(nn.Module):
    """DLRM-style recommendation model at the width of the Optimus paper's models.

    Inputs: dense features ``(B, 128*8)`` split into 128 slices, each through its own
    7-layer :class:`DeepTower` (``(B, 8) -> (B, 16)``); sparse ids ``(B, 128, 4)`` unbound
    into 128 features, each through its own :class:`SparseFeature`. The 256 outputs are
    concatenated to ``(B, 4096)`` and a top MLP Linear(4096, 64) -> ReLU -> Linear(64, 1)
    -> sigmoid gives ``(B, 1)``. Every layer of the 128 towers is one 128-way
    ``batch_linear`` / ``batch_relu`` group.
    """

    def __init__(
        self, towers: int = INDUSTRIAL_TOWERS, sparse: int = INDUSTRIAL_SPARSE, layers: int = INDUSTRIAL_LAYERS
    ):
        super().__init__()
        self.d_in = INDUSTRIAL_TOWER_IN
        self.towers = nn.ModuleList(DeepTower(INDUSTRIAL_TOWER_IN, INDUSTRIAL_HIDDEN, layers) for _ in range(towers))
        self.sparse = nn.ModuleList(
            SparseFeature(INDUSTRIAL_VOCAB, INDUSTRIAL_EMB, INDUSTRIAL_HIDDEN) for _ in range(sparse)
        )
        self.top = nn.Sequential(nn.Linear((towers + sparse) * INDUSTRIAL_HIDDEN, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        pieces = torch.split(dense, self.d_in, dim=1)
        outs = [t(p) for t, p in zip(self.towers, pieces)]
        outs += [f(i) for f, i in zip(self.sparse, torch.unbind(ids, dim=1))]
        return torch.sigmoid(self.top(torch.cat(outs, dim=1)))


@register(
    name="industrial_recsys",
    description="Paper scale: DLRM-style, 128 dense towers (7 x Linear-ReLU, LayerNorm) and 128 sparse "
    "features, cat, top MLP — 5,000+ FX nodes, 128-way fusions (run with verify off for speed)",
    teaches=("batch_linear", "batch_relu", "batch_layernorm", "batch_sigmoid", "normalization"),
    kind="demo",
)
def build_industrial_recsys():
    """Build :class:`IndustrialRecsys`; example inputs ``dense`` ``(8, 1024)`` float32 and
    ``ids`` ``(8, 128, 4)`` int64 -> output ``(8, 1)``."""
    with seeded():
        model = IndustrialRecsys().eval()
        dense = torch.randn(INDUSTRIAL_BATCH, INDUSTRIAL_TOWERS * INDUSTRIAL_TOWER_IN)
        ids = torch.randint(0, INDUSTRIAL_VOCAB, (INDUSTRIAL_BATCH, INDUSTRIAL_SPARSE, 4))
    return model, (dense, ids)
