"""Demo models: the default DLRM-style ``recsys_towers`` and a hand-written
``transformer_block``."""

from __future__ import annotations

import math

import torch
from torch import nn

from ._registry import register
from ._util import seeded

# ---------------------------------------------------------------- recsys_towers

RECSYS_BATCH = 32
RECSYS_TOWERS = 8
RECSYS_TOWER_IN = 16
RECSYS_TOWER_HIDDEN = 32


class Tower(nn.Module):
    """One dense-feature tower: Linear(16,32) -> ReLU -> Linear(32,32) -> ReLU -> LayerNorm(32).

    Input ``(B, 16)`` -> output ``(B, 32)``.
    """

    def __init__(self, d_in: int = RECSYS_TOWER_IN, d_hidden: int = RECSYS_TOWER_HIDDEN):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.act1 = nn.ReLU()
        self.fc2 = nn.Linear(d_hidden, d_hidden)
        self.act2 = nn.ReLU()
        self.norm = nn.LayerNorm(d_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act2(self.fc2(self.act1(self.fc1(x)))))


class RecsysTowers(nn.Module):
    """DLRM-style model with 8 independent, identically shaped towers.

    Input ``x``: dense features ``(B, 8*16)``. It is split with ``torch.split``
    into 8 slices of width 16, each slice goes through its own :class:`Tower`
    (``(B,16) -> (B,32)``), the 8 tower outputs are concatenated with
    ``torch.cat(dim=1)`` to ``(B, 256)``, and a top MLP
    Linear(256,64) -> ReLU -> Linear(64,1) followed by ``torch.sigmoid`` gives
    the output ``(B, 1)``.

    The towers do not depend on one another and have the same shapes, so their
    8 x 2 Linears, 8 x 2 ReLUs and 8 LayerNorms can each be fused horizontally.
    """

    def __init__(
        self,
        num_towers: int = RECSYS_TOWERS,
        d_in: int = RECSYS_TOWER_IN,
        d_hidden: int = RECSYS_TOWER_HIDDEN,
    ):
        super().__init__()
        self.d_in = d_in
        self.towers = nn.ModuleList([Tower(d_in, d_hidden) for _ in range(num_towers)])
        self.top = nn.Sequential(
            nn.Linear(num_towers * d_hidden, 64),
            nn.ReLU(),
            nn.Linear(64, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pieces = torch.split(x, self.d_in, dim=1)
        outs = [tower(piece) for tower, piece in zip(self.towers, pieces)]
        h = torch.cat(outs, dim=1)
        return torch.sigmoid(self.top(h))


@register(
    name="recsys_towers",
    description="DLRM-style: split dense features into 8 same-shaped towers "
    "(Linear-ReLU-Linear-ReLU-LayerNorm), cat, top MLP, sigmoid",
    teaches=("batch_linear", "batch_relu", "batch_layernorm", "normalization"),
    kind="demo",
)
def build_recsys_towers():
    """Build :class:`RecsysTowers`; example input ``x`` ``(32, 128)`` float32 -> output ``(32, 1)``."""
    with seeded():
        model = RecsysTowers().eval()
        x = torch.randn(RECSYS_BATCH, RECSYS_TOWERS * RECSYS_TOWER_IN)
    return model, (x,)


# ------------------------------------------------------------ transformer_block


class TransformerBlock(nn.Module):
    """A small pre-LN transformer encoder block, written by hand.

    Input ``(B, T, 64)`` -> output ``(B, T, 64)``::

        h = LayerNorm(x)
        q, k, v = Linear_q(h), Linear_k(h), Linear_v(h)    # three Linear(64,64) on the SAME input
        attention with 4 heads (reshape/transpose/matmul/softmax/matmul)
        x = x + Linear_o(attn)                              # output projection + residual
        x = x + Linear(128,64)(GELU(Linear(64,128)(LayerNorm(x))))

    The q/k/v Linears sharing one input exercise ``batch_linear_lhs``.
    """

    def __init__(self, d_model: int = 64, n_heads: int = 4, d_ff: int = 128):
        super().__init__()
        assert d_model % n_heads == 0
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, d_ff)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(d_ff, d_model)

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        # (B, T, C) -> (B, H, T, D)
        b, s, _ = t.shape
        return t.reshape(b, s, self.n_heads, self.d_head).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, c = x.shape
        h = self.ln1(x)
        q = self._heads(self.q(h))
        k = self._heads(self.k(h))
        v = self._heads(self.v(h))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.d_head)
        attn = torch.softmax(scores, dim=-1)
        y = torch.matmul(attn, v)  # (B, H, T, D)
        y = y.transpose(1, 2).reshape(b, s, c)
        x = x + self.out(y)
        x = x + self.fc2(self.act(self.fc1(self.ln2(x))))
        return x


@register(
    name="transformer_block",
    description="Hand-written pre-LN transformer block: q/k/v are three Linears "
    "on the same input, 4-head attention, GELU MLP",
    teaches=("batch_linear_lhs",),
    kind="demo",
)
def build_transformer_block():
    """Build :class:`TransformerBlock`; example input ``x`` ``(4, 16, 64)`` float32 -> output ``(4, 16, 64)``."""
    with seeded():
        model = TransformerBlock().eval()
        x = torch.randn(4, 16, 64)
    return model, (x,)
