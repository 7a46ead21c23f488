"""Teaching models for the batch-fusion forms beyond ``nn.Linear`` and the plain
``nn.LayerNorm``: GPT-2's ``Conv1D`` (``torch.addmm`` with a (in, out) weight), a bare
``x @ W`` with a weight parameter, the Conv1D form of ``batch_linear_lhs``, and layer
norms with and without affine parameters and with a 2-D ``normalized_shape``.

Like :mod:`sample_models.teaching`, every model is tiny, deterministic and float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._registry import register
from ._util import seeded

BATCH = 8
PIECES = 5
WIDTH = 16  # width of one piece


class Conv1D(nn.Module):
    """GPT-2's ``Conv1D`` (as in HF transformers): a linear whose weight is stored
    ``(in, out)``, computed as ``torch.addmm(bias, x.view(-1, in), weight)``.

    Input ``(..., nx)`` -> output ``(..., nf)``.
    """

    def __init__(self, nf: int, nx: int):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.2)
        self.bias = nn.Parameter(torch.randn(nf) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


# ------------------------------------------------------------ batch_linear (addmm)


class TeachBatchConv1D(nn.Module):
    """5 independent GPT-2 ``Conv1D(16, 16)`` (``torch.addmm``), one per split piece,
    outputs concatenated.

    Input ``(8, 80)`` -> output ``(8, 80)``.
    """

    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList([Conv1D(WIDTH, WIDTH) for _ in range(PIECES)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pieces = torch.split(x, WIDTH, dim=1)
        return torch.cat([conv(p) for conv, p in zip(self.convs, pieces)], dim=1)


@register(
    name="teach_batch_conv1d",
    description="5 GPT-2 Conv1D (addmm, weight stored (in, out)) on 5 split pieces -> one baddbmm",
    teaches=("batch_linear",),
    kind="teaching",
)
def build_teach_batch_conv1d():
    """Build :class:`TeachBatchConv1D`; input ``(8, 80)`` -> output ``(8, 80)``."""
    with seeded():
        model = TeachBatchConv1D().eval()
        x = torch.randn(BATCH, PIECES * WIDTH)
    return model, (x,)


# ----------------------------------------------------------- batch_linear (matmul)


class TeachBatchMatmul(nn.Module):
    """5 independent ``piece @ W_i`` with ``W_i`` a ``(16, 16)`` weight parameter and no
    bias, one per split piece, outputs concatenated.

    Input ``(8, 80)`` -> output ``(8, 80)``.
    """

    def __init__(self):
        super().__init__()
        self.weights = nn.ParameterList([nn.Parameter(torch.randn(WIDTH, WIDTH) * 0.2) for _ in range(PIECES)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pieces = torch.split(x, WIDTH, dim=1)
        return torch.cat([p @ w for p, w in zip(pieces, self.weights)], dim=1)


@register(
    name="teach_batch_matmul",
    description="5 x @ W (W a (16,16) parameter, no bias) on 5 split pieces -> one bmm",
    teaches=("batch_linear",),
    kind="teaching",
)
def build_teach_batch_matmul():
    """Build :class:`TeachBatchMatmul`; input ``(8, 80)`` -> output ``(8, 80)``."""
    with seeded():
        model = TeachBatchMatmul().eval()
        x = torch.randn(BATCH, PIECES * WIDTH)
    return model, (x,)


# ------------------------------------------------------- batch_linear_lhs (addmm)

LHS_OUT_FEATURES = (8, 16, 24, 8, 16)


class TeachBatchLinearLHSConv1D(nn.Module):
    """5 GPT-2 ``Conv1D(out_i, 16)`` with out_i = 8, 16, 24, 8, 16, all applied to the SAME input.

    Input ``(8, 16)`` -> output ``(8, 72)`` (the 5 outputs concatenated).
    """

    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList([Conv1D(n, WIDTH) for n in LHS_OUT_FEATURES])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([conv(x) for conv in self.convs], dim=1)


@register(
    name="teach_batch_linear_lhs_conv1d",
    description="5 GPT-2 Conv1D (addmm) of different widths on the same input -> one wide addmm + split",
    teaches=("batch_linear_lhs",),
    kind="teaching",
)
def build_teach_batch_linear_lhs_conv1d():
    """Build :class:`TeachBatchLinearLHSConv1D`; input ``(8, 16)`` -> output ``(8, 72)``."""
    with seeded():
        model = TeachBatchLinearLHSConv1D().eval()
        x = torch.randn(BATCH, WIDTH)
    return model, (x,)


# ------------------------------------------------------- batch_layernorm variants

SEQ = 4


class TeachBatchLayerNormVariants(nn.Module):
    """Four groups of 5 layer norms over the same 5 split pieces ``(8, 4, 16)``:
    ``LayerNorm(16, elementwise_affine=False)`` (no weight, no bias),
    ``LayerNorm(16, bias=False)`` (weight only), ``F.layer_norm(p, (16,), None, b_i)``
    (bias only) and ``LayerNorm((4, 16))`` (2-D normalized_shape, weight and bias).

    Input ``(8, 4, 80)`` -> output ``(8, 4, 320)`` (the 20 results concatenated).
    """

    def __init__(self):
        super().__init__()
        self.plain = nn.ModuleList([nn.LayerNorm(WIDTH, elementwise_affine=False) for _ in range(PIECES)])
        self.weight_only = nn.ModuleList([nn.LayerNorm(WIDTH, bias=False) for _ in range(PIECES)])
        self.biases = nn.ParameterList([nn.Parameter(torch.randn(WIDTH) * 0.5) for _ in range(PIECES)])
        self.two_d = nn.ModuleList([nn.LayerNorm((SEQ, WIDTH)) for _ in range(PIECES)])
        with torch.no_grad():  # non-trivial affine params so the fusion has something to stack
            for norm in [*self.weight_only, *self.two_d]:
                norm.weight.uniform_(0.5, 1.5)
            for norm in self.two_d:
                norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pieces = torch.split(x, WIDTH, dim=-1)
        outs = [norm(p) for norm, p in zip(self.plain, pieces)]
        outs += [norm(p) for norm, p in zip(self.weight_only, pieces)]
        outs += [F.layer_norm(p, (WIDTH,), None, b) for p, b in zip(pieces, self.biases)]
        outs += [norm(p) for norm, p in zip(self.two_d, pieces)]
        return torch.cat(outs, dim=-1)


@register(
    name="teach_batch_layernorm_variants",
    description="4 x 5 layer norms: no affine, weight only, bias only, 2-D normalized_shape -> 4 fused layer norms",
    teaches=("batch_layernorm",),
    kind="teaching",
)
def build_teach_batch_layernorm_variants():
    """Build :class:`TeachBatchLayerNormVariants`; input ``(8, 4, 80)`` -> output ``(8, 4, 320)``."""
    with seeded():
        model = TeachBatchLayerNormVariants().eval()
        x = torch.randn(BATCH, SEQ, PIECES * WIDTH) * 3.0
    return model, (x,)


class TeachBatchNormalize(nn.Module):
    """Five towers' embeddings L2-normalised, each by its own ``F.normalize(e, dim=-1)``,
    then summed: one fused normalize over their stack. Inputs ``e0..e4 (8, 16)`` -> ``(8, 16)``."""

    def forward(self, *embeddings: torch.Tensor) -> torch.Tensor:
        out = F.normalize(embeddings[0], dim=-1)
        for e in embeddings[1:]:
            out = out + F.normalize(e, dim=-1)
        return out


@register(
    name="teach_batch_normalize",
    description="5 independent F.normalize(e_i, dim=-1) on (8, 16) embeddings -> 1 normalize over their stack",
    teaches=("batch_normalize",),
    kind="teaching",
)
def build_teach_batch_normalize():
    """Build :class:`TeachBatchNormalize`; inputs five ``(8, 16)`` tensors -> output ``(8, 16)``."""
    with seeded():
        xs = tuple(torch.randn(BATCH, WIDTH) * 3.0 for _ in range(PIECES))
    return TeachBatchNormalize().eval(), xs


class TeachBatchSoftmax(nn.Module):
    """Five gates, each ``softmax(x_i, dim=-1)`` in one of its three spellings, then summed:
    one fused softmax over their stack. Inputs ``x0..x4 (8, 16)`` -> ``(8, 16)``."""

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        y0, y1, y2 = torch.softmax(xs[0], dim=-1), F.softmax(xs[1], dim=-1), xs[2].softmax(-1)
        y3, y4 = torch.softmax(xs[3], -1), torch.softmax(xs[4], -1)
        return y0 + y1 + y2 + y3 + y4


@register(
    name="teach_batch_softmax",
    description="5 independent softmax(x_i, dim=-1) on (8, 16) -> 1 softmax over their stack",
    teaches=("batch_softmax",),
    kind="teaching",
)
def build_teach_batch_softmax():
    """Build :class:`TeachBatchSoftmax`; inputs five ``(8, 16)`` tensors -> output ``(8, 16)``."""
    with seeded():
        xs = tuple(torch.randn(BATCH, WIDTH) for _ in range(PIECES))
    return TeachBatchSoftmax().eval(), xs


class TeachBatchMul(nn.Module):
    """One query ``q`` multiplied by five keys (``q * k``, ``k * q``, ``torch.mul``,
    ``Tensor.mul``), the products summed: one product of the keys' stack with ``q``,
    which is read once, not copied five times. Inputs ``q, k0..k4 (8, 16)`` -> ``(8, 16)``."""

    def forward(self, q: torch.Tensor, *ks: torch.Tensor) -> torch.Tensor:
        p0, p1, p2, p3, p4 = q * ks[0], ks[1] * q, torch.mul(q, ks[2]), q.mul(ks[3]), ks[4] * q
        return p0 + p1 + p2 + p3 + p4


@register(
    name="teach_batch_mul",
    description="q (8, 16) times 5 keys (8, 16) -> 1 product of the keys' stack with q",
    teaches=("batch_mul",),
    kind="teaching",
)
def build_teach_batch_mul():
    """Build :class:`TeachBatchMul`; inputs six ``(8, 16)`` tensors -> output ``(8, 16)``."""
    with seeded():
        xs = tuple(torch.randn(BATCH, WIDTH) for _ in range(PIECES + 1))
    return TeachBatchMul().eval(), xs


class TeachBatchSum(nn.Module):
    """Five row sums (``x.sum(-1)``, ``torch.sum(x, dim=-1)``) multiplied together: one
    sum over their stack. Inputs ``x0..x4 (8, 16)`` -> ``(8,)``."""

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        s0, s1, s2 = torch.sum(xs[0], dim=-1), xs[1].sum(-1), torch.sum(xs[2], dim=-1)
        s3, s4 = xs[3].sum(-1), torch.sum(xs[4], dim=-1)
        return s0 * s1 * s2 * s3 * s4


@register(
    name="teach_batch_sum",
    description="5 independent row sums of (8, 16) inputs -> 1 sum over their stack",
    teaches=("batch_sum",),
    kind="teaching",
)
def build_teach_batch_sum():
    """Build :class:`TeachBatchSum`; inputs five ``(8, 16)`` tensors -> output ``(8,)``."""
    with seeded():
        xs = tuple(torch.randn(BATCH, WIDTH) for _ in range(PIECES))
    return TeachBatchSum().eval(), xs


class TeachMulSumToMatmul(nn.Module):
    """A batched matrix product written as a broadcast product and a sum:
    ``(a.unsqueeze(-1) * b.unsqueeze(1)).sum(-2)`` for ``a (8, 16, 16)``, ``b (8, 16, 16)``
    builds an (8, 16, 16, 16) product first; as ``einsum("abc,acd->abd")`` it is one bmm."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a.unsqueeze(-1) * b.unsqueeze(1)).sum(-2)


@register(
    name="teach_mul_sum_to_matmul",
    description="(a[..., None] * b[:, None]).sum(-2) on (8, 16, 16) inputs -> one einsum (a bmm)",
    teaches=("mul_sum_to_matmul",),
    kind="teaching",
)
def build_teach_mul_sum_to_matmul():
    """Build :class:`TeachMulSumToMatmul`; inputs two ``(8, 16, 16)`` tensors -> ``(8, 16, 16)``."""
    with seeded():
        xs = tuple(torch.randn(BATCH, WIDTH, WIDTH) for _ in range(2))
    return TeachMulSumToMatmul().eval(), xs
