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
            nn.Sequential(nn.Linear(d, hidden), nn.ReLU(), nn.Linear(hidden, expert_out)) for _ in range(experts)
        )
        self.gates = nn.ModuleList(nn.Linear(d, experts) for _ in range(tasks))
        self.towers = nn.ModuleList(
            nn.Sequential(nn.Linear(expert_out, 16), nn.ReLU(), nn.Linear(16, 1)) for _ in range(tasks)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = torch.stack([expert(x) for expert in self.experts], dim=1)  # (B, 8, E)
        outs = []
        for gate, tower in zip(self.gates, self.towers):
            g = torch.softmax(gate(x), dim=-1).unsqueeze(-1)  # (B, 8, 1)
            outs.append(torch.sigmoid(tower((g * e).sum(dim=1))))  # (B, 1)
        return torch.cat(outs, dim=1)

    def optimus_reference(self) -> nn.Module:
        """A hand-fused module with this model's current weights (:class:`FusedMMoE`)."""
        return FusedMMoE(self)


def _packed(ts: list[torch.Tensor]) -> torch.Tensor:
    """``torch.stack(ts)`` as a contiguous copy (a buffer, not a view of the parameters)."""
    return torch.stack([t.detach() for t in ts]).contiguous()


class FusedMMoE(nn.Module):
    """:class:`MMoE` fused by hand, weights packed once at construction: the speed bound
    ``optimus bench`` compares our passes against (stage ``reference``).

    ``x (B, D)`` -> one ``linear(x, cat(W1_e, Wg_t))`` ``(B, 8H + 3*8)`` -> experts:
    ``view(B, 8, H).transpose(0, 1)`` -> relu -> ``baddbmm`` ``(8, B, E)``; gates:
    ``view(B, 3, 8)`` softmax; mixing ``bmm(gates, experts)`` ``(B, 3, E)``; the three
    task towers as two ``baddbmm`` over ``(3, B, .)``; sigmoid -> ``(B, 3)``."""

    def __init__(self, src: MMoE):
        super().__init__()
        ex, gates, towers = list(src.experts), list(src.gates), list(src.towers)
        self.n, self.h, self.t = len(ex), ex[0][0].out_features, len(gates)
        with torch.no_grad():
            self.register_buffer("w_in", torch.cat([e[0].weight for e in ex] + [g.weight for g in gates]).clone())
            self.register_buffer("b_in", torch.cat([e[0].bias for e in ex] + [g.bias for g in gates]).clone())
            self.register_buffer("w_ex", _packed([e[2].weight.t() for e in ex]))
            self.register_buffer("b_ex", _packed([e[2].bias.unsqueeze(0) for e in ex]))
            self.register_buffer("w_t1", _packed([t[0].weight.t() for t in towers]))
            self.register_buffer("b_t1", _packed([t[0].bias.unsqueeze(0) for t in towers]))
            self.register_buffer("w_t2", _packed([t[2].weight.t() for t in towers]))
            self.register_buffer("b_t2", _packed([t[2].bias.unsqueeze(0) for t in towers]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, nh = x.shape[0], self.n * self.h
        y = F.linear(x, self.w_in, self.b_in)
        h = torch.relu(y[:, :nh].reshape(b, self.n, self.h).transpose(0, 1))
        e = torch.baddbmm(self.b_ex, h, self.w_ex).transpose(0, 1)  # (B, 8, E)
        g = torch.softmax(y[:, nh:].reshape(b, self.t, self.n), dim=-1)  # (B, 3, 8)
        mixed = torch.bmm(g, e).transpose(0, 1)  # (3, B, E)
        z = torch.baddbmm(self.b_t2, torch.relu(torch.baddbmm(self.b_t1, mixed, self.w_t1)), self.w_t2)
        return torch.sigmoid(z.squeeze(-1).t().contiguous())  # (B, 3)


class TwinTowers(nn.Module):
    """Six retrieval towers, each ``(Linear(D, D) -> LayerNorm(D) -> ReLU) x 3`` on its
    own ``(B, D)`` input; the outputs are L2-normalised and tower 0 is dotted with each
    of the others. Inputs: six ``(B, D)``; returns ``(5, B)`` (the stacked dots)."""

    def __init__(self, d: int = 64, towers: int = 6, layers: int = 3):
        super().__init__()
        self.towers = nn.ModuleList(
            nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(d, d), nn.LayerNorm(d), nn.ReLU())])
            for _ in range(towers)
        )

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        outs = [F.normalize(tower(x), dim=-1) for tower, x in zip(self.towers, xs)]
        return torch.stack([(outs[0] * o).sum(dim=-1) for o in outs[1:]])

    def optimus_reference(self) -> nn.Module:
        """A hand-fused module with this model's current weights (:class:`FusedTwinTowers`)."""
        return FusedTwinTowers(self)


class FusedTwinTowers(nn.Module):
    """:class:`TwinTowers` fused by hand, weights packed once at construction (stage
    ``reference`` of ``optimus bench``): ``stack(xs)`` ``(6, B, D)``, per layer
    ``baddbmm`` -> ``layer_norm`` -> ``* gamma + beta`` (``(6, 1, D)``) -> relu, then one
    ``normalize`` and one product-sum of tower 0 with the others -> ``(5, B)``. With
    ``fuse_tail=False`` the tail stays per tower as in :class:`TwinTowers` (unbind, six
    normalize, five products and sums, stack): the bound for fusions of the towers alone,
    as no Optimus pass fuses normalize, mul or sum."""

    def __init__(self, src: TwinTowers, fuse_tail: bool = True):
        super().__init__()
        self.fuse_tail = fuse_tail
        seqs = list(src.towers)
        self.layers = len(seqs[0]) // 3
        self.eps = seqs[0][1].eps
        with torch.no_grad():
            for i in range(self.layers):
                lin, norm = 3 * i, 3 * i + 1
                self.register_buffer(f"w{i}", _packed([s[lin].weight.t() for s in seqs]))
                self.register_buffer(f"b{i}", _packed([s[lin].bias.unsqueeze(0) for s in seqs]))
                self.register_buffer(f"g{i}", _packed([s[norm].weight.unsqueeze(0) for s in seqs]))
                self.register_buffer(f"beta{i}", _packed([s[norm].bias.unsqueeze(0) for s in seqs]))

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        h = torch.stack(xs)
        for i in range(self.layers):
            h = torch.baddbmm(getattr(self, f"b{i}"), h, getattr(self, f"w{i}"))
            h = F.layer_norm(h, h.shape[-1:], eps=self.eps) * getattr(self, f"g{i}") + getattr(self, f"beta{i}")
            h = torch.relu(h)
        if not self.fuse_tail:
            outs = [F.normalize(o, dim=-1) for o in h.unbind()]
            return torch.stack([(outs[0] * o).sum(dim=-1) for o in outs[1:]])
        h = F.normalize(h, dim=-1)
        return (h[:1] * h[1:]).sum(dim=-1)


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
        v = torch.stack(vs, dim=1)  # (B, 26, 16)
        fm = 0.5 * (v.sum(dim=1) ** 2 - (v * v).sum(dim=1)).sum(dim=1, keepdim=True)
        return torch.sigmoid(fm + self.deep(torch.cat(vs, dim=1)))


@register(
    name="mmoe",
    kind="realistic",
    teaches=("batch_linear_lhs", "batch_linear"),
    description="MMoE: 8 experts (Linear-ReLU-Linear) and 3 gates on one input; one wide matmul over x",
)
def build_mmoe():
    """:class:`MMoE` with D = hidden = 64, expert output 32; input ``x (256, 64)``."""
    with seeded():
        return MMoE().eval(), (torch.randn(256, 64),)


@register(
    name="twin_towers",
    kind="realistic",
    teaches=("batch_linear", "batch_layernorm", "batch_relu"),
    description="Six (Linear-LayerNorm-ReLU) x 3 towers meeting far below their last linear",
)
def build_twin_towers():
    """:class:`TwinTowers` with D = 64; six inputs ``(64, 64)``."""
    with seeded():
        return TwinTowers().eval(), tuple(torch.randn(64, 64) for _ in range(6))


@register(
    name="deepfm",
    kind="realistic",
    teaches=("batch_linear",),
    description="DeepFM: 26 sparse fields, each Embedding(1000, 16) then its own Linear(16, 16)",
)
def build_deepfm():
    """:class:`DeepFM`; input ``ids (128, 26)`` int64."""
    with seeded():
        return DeepFM().eval(), (torch.randint(0, 1000, (128, 26)),)
