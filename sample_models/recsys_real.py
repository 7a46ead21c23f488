"""Recommendation models as users run them: MMoE, a six-tower retrieval model, DeepFM.

Each is small enough to capture in a second on CPU and keeps the structure that decides
which Optimus fusions apply: MMoE's experts and gates all read one input (one wide
matmul, ``batch_linear_lhs``); the towers meet far below their last linear (a search
bounded at 5 producer hops misses them); DeepFM has one small linear per sparse field
(``batch_linear`` over 26 members).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._registry import register
from ._util import seeded


class MMoE(nn.Module):
    """Multi-gate mixture of experts (Ma et al., KDD 2018).

    ``x (B, D)``; 8 experts ``Linear(D, H) -> ReLU -> Linear(H, E)``; 3 gates
    ``softmax(Linear(D, 8))``; task t mixes the experts with its gate
    (``(B, 8, 1) * (B, 8, E)`` summed over experts) and runs its own tower
    ``Linear(E, 16) -> ReLU -> Linear(16, 1) -> sigmoid``. Returns ``(B, 3)``.
    """

    def __init__(self, d: int = 64, hidden: int = 64, expert_out: int = 32, experts: int = 8, tasks: int = 3):
        super().__init__()
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(d, hidden), nn.ReLU(), nn.Linear(hidden, expert_out)) for _ in range(experts))
        self.gates = nn.ModuleList(nn.Linear(d, experts) for _ in range(tasks))
        self.towers = nn.ModuleList(
            nn.Sequential(nn.Linear(expert_out, 16), nn.ReLU(), nn.Linear(16, 1)) for _ in range(tasks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = torch.stack([expert(x) for expert in self.experts], dim=1)          # (B, 8, E)
        outs = []
        for gate, tower in zip(self.gates, self.towers):
            g = torch.softmax(gate(x), dim=-1).unsqueeze(-1)                     # (B, 8, 1)
            outs.append(torch.sigmoid(tower((g * e).sum(dim=1))))                # (B, 1)
        return torch.cat(outs, dim=1)


class TwinTowers(nn.Module):
    """Six retrieval towers, each ``(Linear(D, D) -> LayerNorm(D) -> ReLU) x 3`` on its
    own ``(B, D)`` input; the outputs are L2-normalised and tower 0 is dotted with each
    of the others. Inputs: six ``(B, D)``; returns ``(5, B)`` (the stacked dots)."""

    def __init__(self, d: int = 64, towers: int = 6, layers: int = 3):
        super().__init__()
        self.towers = nn.ModuleList(
            nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(d, d), nn.LayerNorm(d), nn.ReLU())])
            for _ in range(towers))

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        outs = [F.normalize(tower(x), dim=-1) for tower, x in zip(self.towers, xs)]
        return torch.stack([(outs[0] * o).sum(dim=-1) for o in outs[1:]])


class DeepFM(nn.Module):
    """DeepFM (Guo et al., IJCAI 2017) over 26 sparse fields.

    ``ids (B, 26)`` int64 in ``[0, 1000)``; field f: ``Embedding(1000, 16)`` then its own
    ``Linear(16, 16)``. FM part: ``0.5 * ((sum v)^2 - sum v^2)`` summed over the 16 dims;
    deep part: the 26 field vectors concatenated, ``Linear(416, 64) -> ReLU -> Linear(64, 1)``.
    Returns ``sigmoid(fm + deep)``, ``(B, 1)``."""

    def __init__(self, fields: int = 26, vocab: int = 1000, dim: int = 16):
        super().__init__()
        self.emb = nn.ModuleList(nn.Embedding(vocab, dim) for _ in range(fields))
        self.proj = nn.ModuleList(nn.Linear(dim, dim) for _ in range(fields))
        self.deep = nn.Sequential(nn.Linear(fields * dim, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        vs = [proj(emb(ids[:, f])) for f, (emb, proj) in enumerate(zip(self.emb, self.proj))]
        v = torch.stack(vs, dim=1)                                               # (B, 26, 16)
        fm = 0.5 * (v.sum(dim=1) ** 2 - (v * v).sum(dim=1)).sum(dim=1, keepdim=True)
        return torch.sigmoid(fm + self.deep(torch.cat(vs, dim=1)))


@register(name="mmoe", kind="realistic", teaches=("batch_linear_lhs", "batch_linear"),
          description="MMoE: 8 experts (Linear-ReLU-Linear) and 3 gates on one input; one wide matmul over x")
def build_mmoe():
    """:class:`MMoE` with D = hidden = 64, expert output 32; input ``x (256, 64)``."""
    with seeded():
        return MMoE().eval(), (torch.randn(256, 64),)


@register(name="twin_towers", kind="realistic", teaches=("batch_linear", "batch_layernorm", "batch_relu"),
          description="Six (Linear-LayerNorm-ReLU) x 3 towers meeting far below their last linear")
def build_twin_towers():
    """:class:`TwinTowers` with D = 64; six inputs ``(64, 64)``."""
    with seeded():
        return TwinTowers().eval(), tuple(torch.randn(64, 64) for _ in range(6))


@register(name="deepfm", kind="realistic", teaches=("batch_linear",),
          description="DeepFM: 26 sparse fields, each Embedding(1000, 16) then its own Linear(16, 16)")
def build_deepfm():
    """:class:`DeepFM`; input ``ids (128, 26)`` int64."""
    with seeded():
        return DeepFM().eval(), (torch.randint(0, 1000, (128, 26)),)
