"""Performance models: the paper-shaped towers workload and its hand-fused reference.

``recsys_towers32`` is the workload of the benchmark tables (benchmarks/RESULTS.md): a
(16, 2048) input split into 32 pieces of 64, each through its own
Linear(64, 64) -> ReLU -> Linear(64, 64) -> ReLU -> LayerNorm(64), concatenated, then
Linear(2048, 1). The model's :meth:`Towers.optimus_reference` builds a hand-fused
module computing the same function from the same weights, stacked once: the bound
``optimus bench`` compares our passes against (stage ``reference``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._registry import register
from ._util import seeded

TOWERS32_BATCH = 16
TOWERS32_TOWERS = 32
TOWERS32_WIDTH = 64


class Tower64(nn.Module):
    """Linear(d, d) -> ReLU -> Linear(d, d) -> ReLU -> LayerNorm(d). Input ``(B, d)`` -> ``(B, d)``."""

    def __init__(self, d: int):
        super().__init__()
        self.fc1, self.fc2, self.norm = nn.Linear(d, d), nn.Linear(d, d), nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class Towers(nn.Module):
    """``n`` independent towers over the ``n`` width-``d`` pieces of the input, then one
    Linear(n * d, 1).

    Input ``x`` ``(B, n * d)`` -> ``torch.split(x, d, dim=1)`` -> tower i on piece i
    ``(B, d)`` -> ``torch.cat(dim=1)`` ``(B, n * d)`` -> Linear -> output ``(B, 1)``.
    """

    def __init__(self, n: int = TOWERS32_TOWERS, d: int = TOWERS32_WIDTH):
        super().__init__()
        self.d = d
        self.towers = nn.ModuleList([Tower64(d) for _ in range(n)])
        self.head = nn.Linear(n * d, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pieces = torch.split(x, self.d, dim=1)
        return self.head(torch.cat([t(p) for t, p in zip(self.towers, pieces)], dim=1))

    def optimus_reference(self) -> nn.Module:
        """A hand-fused module with this model's current weights (see :class:`FusedTowers`)."""
        return FusedTowers(self)


class FusedTowers(nn.Module):
    """:class:`Towers` fused by hand: every tower's weights stacked once, at construction.

    ``x (B, n*d)`` -> ``view(B, n, d).transpose(0, 1)`` ``(n, B, d)`` ->
    ``baddbmm(b1, X, W1)`` -> relu -> ``baddbmm(b2, ., W2)`` -> relu -> ``layer_norm`` over d
    (no affine) ``* gamma + beta`` with gamma, beta ``(n, 1, d)`` -> ``transpose(0, 1)
    .reshape(B, n*d)`` -> the head Linear. W1, W2 are ``(n, d, d)`` (already transposed,
    contiguous), b1, b2 ``(n, 1, d)``. The stacks are buffers: a copy of the weights made
    when the module is built, not views of the source model's parameters.
    """

    def __init__(self, src: Towers):
        super().__init__()
        ts = list(src.towers)
        self.n, self.d, self.eps = len(ts), src.d, ts[0].norm.eps
        with torch.no_grad():

            def stack(get):
                return torch.stack([get(t) for t in ts]).contiguous()

            self.register_buffer("w1", stack(lambda t: t.fc1.weight.t()))
            self.register_buffer("b1", stack(lambda t: t.fc1.bias.unsqueeze(0)))
            self.register_buffer("w2", stack(lambda t: t.fc2.weight.t()))
            self.register_buffer("b2", stack(lambda t: t.fc2.bias.unsqueeze(0)))
            self.register_buffer("gamma", stack(lambda t: t.norm.weight.unsqueeze(0)))
            self.register_buffer("beta", stack(lambda t: t.norm.bias.unsqueeze(0)))
            self.register_buffer("head_w", src.head.weight.detach().clone())
            self.register_buffer("head_b", src.head.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        h = x.view(b, self.n, self.d).transpose(0, 1)
        h = torch.relu(torch.baddbmm(self.b1, h, self.w1))
        h = torch.relu(torch.baddbmm(self.b2, h, self.w2))
        h = F.layer_norm(h, (self.d,), eps=self.eps) * self.gamma + self.beta
        return F.linear(h.transpose(0, 1).reshape(b, self.n * self.d), self.head_w, self.head_b)


@register(
    name="recsys_towers32",
    description="Paper-shaped towers: (16, 2048) split into 32 pieces, 32 x (Linear(64,64)-ReLU-Linear-ReLU-"
    "LayerNorm), cat, Linear(2048,1); has a hand-fused reference",
    teaches=("batch_linear", "batch_relu", "batch_layernorm", "prepack_weights"),
    kind="demo",
)
def build_recsys_towers32():
    """Build :class:`Towers` (32 towers of width 64); example input ``x`` ``(16, 2048)`` float32 -> ``(16, 1)``."""
    with seeded():
        model = Towers().eval()
        x = torch.randn(TOWERS32_BATCH, TOWERS32_TOWERS * TOWERS32_WIDTH)
    return model, (x,)


INDUSTRIAL_BATCH, INDUSTRIAL_TOWERS, INDUSTRIAL_WIDTH = 2048, 128, 256


def industrial_towers():
    """:class:`Towers` at industrial scale, for GPUs (not registered as a sample: about 67 MB
    of weights and a (2048, 32768) input): 128 towers of width 256, batch 2048. Use it as
    the model spec ``sample_models.perf:industrial_towers``. Returns ``(model in eval mode, (x,))``."""
    with seeded():
        model = Towers(INDUSTRIAL_TOWERS, INDUSTRIAL_WIDTH).eval()
        x = torch.randn(INDUSTRIAL_BATCH, INDUSTRIAL_TOWERS * INDUSTRIAL_WIDTH)
    return model, (x,)
