"""Teaching models: one tiny, obvious model per Optimus pattern.

Most of them take one input ``x`` of shape ``(8, 96)``, split it with
``torch.split`` into 6 independent pieces of width 16, apply the taught op to
every piece (written in a different spelling where the op has several), and
concatenate the 6 results back to ``(8, 96)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._registry import register
from ._util import seeded

BATCH = 8
PIECES = 6
WIDTH = 16  # width of one piece


def _pieces_input(scale: float = 1.0) -> torch.Tensor:
    """Example input ``(8, 96)`` = 6 pieces of width 16 (call inside ``seeded()``)."""
    return torch.randn(BATCH, PIECES * WIDTH) * scale


# ------------------------------------------------------------------ batch_linear


class TeachBatchLinear(nn.Module):
    """6 independent ``nn.Linear(16, 16)``, one per split piece, outputs concatenated.

    Input ``(8, 96)`` -> output ``(8, 96)``.
    """

    def __init__(self):
        super().__init__()
        self.linears = nn.ModuleList([nn.Linear(WIDTH, WIDTH) for _ in range(PIECES)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pieces = torch.split(x, WIDTH, dim=1)
        return torch.cat([lin(p) for lin, p in zip(self.linears, pieces)], dim=1)


@register(
    name="teach_batch_linear",
    description="6 independent Linear(16,16) on 6 split pieces -> one batched matmul (bmm)",
    teaches=("batch_linear",),
    kind="teaching",
)
def build_teach_batch_linear():
    """Build :class:`TeachBatchLinear`; input ``(8, 96)`` -> output ``(8, 96)``."""
    with seeded():
        model = TeachBatchLinear().eval()
        x = _pieces_input()
    return model, (x,)


# -------------------------------------------------------------- batch_linear_lhs

LHS_OUT_FEATURES = (8, 16, 24, 8, 16)


class TeachBatchLinearLHS(nn.Module):
    """5 ``nn.Linear(16, out_i)`` with out_i = 8, 16, 24, 8, 16, all applied to the SAME input.

    Input ``(8, 16)`` -> output ``(8, 72)`` (the 5 outputs concatenated).
    """

    def __init__(self):
        super().__init__()
        self.linears = nn.ModuleList([nn.Linear(WIDTH, n) for n in LHS_OUT_FEATURES])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([lin(x) for lin in self.linears], dim=1)


@register(
    name="teach_batch_linear_lhs",
    description="5 Linears of different widths on the same input -> one wide Linear + split",
    teaches=("batch_linear_lhs",),
    kind="teaching",
)
def build_teach_batch_linear_lhs():
    """Build :class:`TeachBatchLinearLHS`; input ``(8, 16)`` -> output ``(8, 72)``."""
    with seeded():
        model = TeachBatchLinearLHS().eval()
        x = torch.randn(BATCH, WIDTH)
    return model, (x,)


# --------------------------------------------------------------- batch_layernorm


class TeachBatchLayerNorm(nn.Module):
    """6 ``nn.LayerNorm(16)``, one per split piece, outputs concatenated.

    Input ``(8, 96)`` -> output ``(8, 96)``.
    """

    def __init__(self):
        super().__init__()
        self.norms = nn.ModuleList([nn.LayerNorm(WIDTH) for _ in range(PIECES)])
        with torch.no_grad():  # non-trivial affine params so the fusion has something to stack
            for norm in self.norms:
                norm.weight.uniform_(0.5, 1.5)
                norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pieces = torch.split(x, WIDTH, dim=1)
        return torch.cat([norm(p) for norm, p in zip(self.norms, pieces)], dim=1)


@register(
    name="teach_batch_layernorm",
    description="6 LayerNorm(16) on 6 split pieces -> one stacked layer_norm",
    teaches=("batch_layernorm",),
    kind="teaching",
)
def build_teach_batch_layernorm():
    """Build :class:`TeachBatchLayerNorm`; input ``(8, 96)`` -> output ``(8, 96)``."""
    with seeded():
        model = TeachBatchLayerNorm().eval()
        x = _pieces_input(scale=3.0)
    return model, (x,)


# -------------------------------------------------------------------- batch_relu


class TeachBatchReLU(nn.Module):
    """ReLU on 6 split pieces, written in every spelling: ``F.relu``, ``torch.relu``,
    ``Tensor.relu`` and the ``nn.ReLU`` module.

    Input ``(8, 96)`` -> output ``(8, 96)``.
    """

    def __init__(self):
        super().__init__()
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p0, p1, p2, p3, p4, p5 = torch.split(x, WIDTH, dim=1)
        y0 = F.relu(p0)
        y1 = torch.relu(p1)
        y2 = p2.relu()
        y3 = self.relu(p3)
        y4 = F.relu(p4)
        y5 = torch.relu(p5)
        return torch.cat([y0, y1, y2, y3, y4, y5], dim=1)


@register(
    name="teach_batch_relu",
    description="ReLU on 6 pieces in 4 spellings (F.relu, torch.relu, x.relu(), nn.ReLU) -> one relu",
    teaches=("batch_relu",),
    kind="teaching",
)
def build_teach_batch_relu():
    """Build :class:`TeachBatchReLU`; input ``(8, 96)`` -> output ``(8, 96)``."""
    with seeded():
        model = TeachBatchReLU().eval()
        x = _pieces_input()
    return model, (x,)


# -------------------------------------------------------------------- batch_tanh


class TeachBatchTanh(nn.Module):
    """tanh on 6 split pieces, written as ``torch.tanh``, ``Tensor.tanh`` and the ``nn.Tanh`` module.

    Input ``(8, 96)`` -> output ``(8, 96)``.
    """

    def __init__(self):
        super().__init__()
        self.tanh = nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p0, p1, p2, p3, p4, p5 = torch.split(x, WIDTH, dim=1)
        y0 = torch.tanh(p0)
        y1 = p1.tanh()
        y2 = self.tanh(p2)
        y3 = torch.tanh(p3)
        y4 = p4.tanh()
        y5 = self.tanh(p5)
        return torch.cat([y0, y1, y2, y3, y4, y5], dim=1)


@register(
    name="teach_batch_tanh",
    description="tanh on 6 pieces in 3 spellings (torch.tanh, x.tanh(), nn.Tanh) -> one tanh",
    teaches=("batch_tanh",),
    kind="teaching",
)
def build_teach_batch_tanh():
    """Build :class:`TeachBatchTanh`; input ``(8, 96)`` -> output ``(8, 96)``."""
    with seeded():
        model = TeachBatchTanh().eval()
        x = _pieces_input()
    return model, (x,)


# ----------------------------------------------------------------- batch_sigmoid


class TeachBatchSigmoid(nn.Module):
    """sigmoid on 6 split pieces, written as ``torch.sigmoid``, ``Tensor.sigmoid``,
    the ``nn.Sigmoid`` module and ``F.sigmoid``.

    Input ``(8, 96)`` -> output ``(8, 96)``.
    """

    def __init__(self):
        super().__init__()
        self.sigmoid = nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p0, p1, p2, p3, p4, p5 = torch.split(x, WIDTH, dim=1)
        y0 = torch.sigmoid(p0)
        y1 = p1.sigmoid()
        y2 = self.sigmoid(p2)
        y3 = F.sigmoid(p3)
        y4 = torch.sigmoid(p4)
        y5 = p5.sigmoid()
        return torch.cat([y0, y1, y2, y3, y4, y5], dim=1)


@register(
    name="teach_batch_sigmoid",
    description="sigmoid on 6 pieces in 4 spellings (torch.sigmoid, x.sigmoid(), nn.Sigmoid, F.sigmoid) -> one sigmoid",
    teaches=("batch_sigmoid",),
    kind="teaching",
)
def build_teach_batch_sigmoid():
    """Build :class:`TeachBatchSigmoid`; input ``(8, 96)`` -> output ``(8, 96)``."""
    with seeded():
        model = TeachBatchSigmoid().eval()
        x = _pieces_input()
    return model, (x,)


# ------------------------------------------------------------------ batch_detach


class TeachBatchDetach(nn.Module):
    """detach on 6 split pieces, written as ``torch.detach`` and ``Tensor.detach``.

    Input ``(8, 96)`` -> output ``(8, 96)``.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p0, p1, p2, p3, p4, p5 = torch.split(x, WIDTH, dim=1)
        y0 = torch.detach(p0)
        y1 = p1.detach()
        y2 = torch.detach(p2)
        y3 = p3.detach()
        y4 = torch.detach(p4)
        y5 = p5.detach()
        return torch.cat([y0, y1, y2, y3, y4, y5], dim=1)


@register(
    name="teach_batch_detach",
    description="detach on 6 pieces (torch.detach, x.detach()) -> one detach",
    teaches=("batch_detach",),
    kind="teaching",
)
def build_teach_batch_detach():
    """Build :class:`TeachBatchDetach`; input ``(8, 96)`` -> output ``(8, 96)``."""
    with seeded():
        model = TeachBatchDetach().eval()
        x = _pieces_input()
    return model, (x,)


# -------------------------------------------------------------- batch_nan_to_num


class TeachBatchNanToNum(nn.Module):
    """nan_to_num(nan=0, posinf=1, neginf=-1) on 6 split pieces, with the arguments
    given positionally, by keyword, and mixed (``torch.nan_to_num(x, 0.0, posinf=1.0, ...)``),
    and as the ``Tensor.nan_to_num`` method.

    Input ``(8, 96)`` (the example input holds some NaN/+inf/-inf) -> output ``(8, 96)``, finite.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p0, p1, p2, p3, p4, p5 = torch.split(x, WIDTH, dim=1)
        y0 = torch.nan_to_num(p0, 0.0, posinf=1.0, neginf=-1.0)
        y1 = torch.nan_to_num(p1, nan=0.0, posinf=1.0, neginf=-1.0)
        y2 = torch.nan_to_num(p2, 0.0, 1.0, -1.0)
        y3 = p3.nan_to_num(0.0, posinf=1.0, neginf=-1.0)
        y4 = torch.nan_to_num(p4, 0.0, posinf=1.0, neginf=-1.0)
        y5 = p5.nan_to_num(nan=0.0, posinf=1.0, neginf=-1.0)
        return torch.cat([y0, y1, y2, y3, y4, y5], dim=1)


@register(
    name="teach_batch_nan_to_num",
    description="nan_to_num on 6 pieces with positional / keyword / mixed args -> one nan_to_num",
    teaches=("batch_nan_to_num",),
    kind="teaching",
)
def build_teach_batch_nan_to_num():
    """Build :class:`TeachBatchNanToNum`; input ``(8, 96)`` with a few non-finite values -> output ``(8, 96)``."""
    with seeded():
        model = TeachBatchNanToNum().eval()
        x = _pieces_input()
        # a few non-finite entries in every piece, so nan_to_num visibly does something
        for i in range(PIECES):
            x[i % BATCH, i * WIDTH] = float("nan")
            x[(i + 1) % BATCH, i * WIDTH + 1] = float("inf")
            x[(i + 2) % BATCH, i * WIDTH + 2] = float("-inf")
    return model, (x,)


# ------------------------------------------------------------------- batch_clamp


class TeachBatchClamp(nn.Module):
    """clamp to [-1, 1] on 6 split pieces: pieces 0-2 as ``torch.clamp(x, -1, 1)``
    (positional), pieces 3-5 as ``torch.clamp(x, min=-1, max=1)`` (keyword).

    Input ``(8, 96)`` -> output ``(8, 96)``.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p0, p1, p2, p3, p4, p5 = torch.split(x, WIDTH, dim=1)
        # positional group
        y0 = torch.clamp(p0, -1, 1)
        y1 = torch.clamp(p1, -1, 1)
        y2 = torch.clamp(p2, -1, 1)
        # keyword group
        y3 = torch.clamp(p3, min=-1, max=1)
        y4 = torch.clamp(p4, min=-1, max=1)
        y5 = torch.clamp(p5, min=-1, max=1)
        return torch.cat([y0, y1, y2, y3, y4, y5], dim=1)


@register(
    name="teach_batch_clamp",
    description="clamp(-1, 1) on 6 pieces, 3 with positional and 3 with min=/max= args -> one clamp",
    teaches=("batch_clamp",),
    kind="teaching",
)
def build_teach_batch_clamp():
    """Build :class:`TeachBatchClamp`; input ``(8, 96)`` -> output ``(8, 96)``."""
    with seeded():
        model = TeachBatchClamp().eval()
        x = _pieces_input(scale=2.0)
    return model, (x,)


# ----------------------------------------------------------------- batch_dropout


class TeachBatchDropout(nn.Module):
    """``F.dropout(x, p=0.1, training=False)`` on 6 split pieces (deterministic: identity).

    Input ``(8, 96)`` -> output ``(8, 96)``.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pieces = torch.split(x, WIDTH, dim=1)
        return torch.cat([F.dropout(p, p=0.1, training=False) for p in pieces], dim=1)


@register(
    name="teach_batch_dropout",
    description="F.dropout(p=0.1, training=False) on 6 pieces -> one dropout",
    teaches=("batch_dropout",),
    kind="teaching",
)
def build_teach_batch_dropout():
    """Build :class:`TeachBatchDropout`; input ``(8, 96)`` -> output ``(8, 96)``."""
    with seeded():
        model = TeachBatchDropout().eval()
        x = _pieces_input()
    return model, (x,)


# --------------------------------------------------------------------- split_cat


class TeachSplitCat(nn.Module):
    """Split/cat plumbing, three cases side by side.

    Inputs ``x (8, 16)``, ``w (8, 10)``, ``y (8, 4, 8)``; outputs a tuple
    ``(2 a (8, 16), b (8, 10), 2 c (8, 4, 8))``:

    * ``a``: ``torch.split(x, 4, dim=-1)`` (negative dim, int split size, so it
      needs normalising to sizes ``[4, 4, 4, 4]`` on dim 1), then the 4 pieces
      concatenated in order with ``torch.cat(dim=1)``: an identity, removable.
    * ``b``: ``torch.split(w, 4, dim=1)`` on width 10 -> uneven sizes
      ``[4, 4, 2]``, pieces concatenated in REVERSED order: NOT an identity,
      must not be simplified.
    * ``c``: ``torch.stack(list(torch.unbind(y, dim=1)), dim=1)``: an identity.
    """

    def forward(self, x: torch.Tensor, w: torch.Tensor, y: torch.Tensor):
        x0, x1, x2, x3 = torch.split(x, 4, dim=-1)
        a = torch.cat([x0, x1, x2, x3], dim=1)

        w0, w1, w2 = torch.split(w, 4, dim=1)
        b = torch.cat([w2, w1, w0], dim=1)

        c = torch.stack(list(torch.unbind(y, dim=1)), dim=1)
        # each identity feeds the next op, as inside a model: removed, it hands that op the
        # input itself (an identity returned as is would make the output the caller's own
        # input tensor, which the step check refuses)
        return 2 * a, b, 2 * c


@register(
    name="teach_split_cat",
    description="split->cat identity (needs normalising), uneven split cat'ed in reverse "
    "(must stay), unbind->stack identity",
    teaches=("normalization", "split_cat", "unbind_stack"),
    kind="teaching",
)
def build_teach_split_cat():
    """Build :class:`TeachSplitCat`; inputs ``x (8, 16)``, ``w (8, 10)``, ``y (8, 4, 8)``
    -> outputs ``((8, 16), (8, 10), (8, 4, 8))``."""
    with seeded():
        model = TeachSplitCat().eval()
        x = torch.randn(BATCH, 16)
        w = torch.randn(BATCH, 10)
        y = torch.randn(BATCH, 4, 8)
    return model, (x, w, y)


# ------------------------------------------------------------------ unbind_stack


class TeachUnbindStack(nn.Module):
    """unbind -> stack identity, and unbind -> cat (a reshape in disguise).

    Inputs ``y (8, 4, 8)``, ``z (8, 3, 16)``; outputs a tuple
    ``(2 s (8, 4, 8), 2 c (8, 48))``:

    * ``s = torch.stack(torch.unbind(y, dim=1), dim=1)``: identity, ``s == y``.
    * ``c = torch.cat(torch.unbind(z, dim=1), dim=1)``: equals ``z.reshape(8, 48)``.
    """

    def forward(self, y: torch.Tensor, z: torch.Tensor):
        s = torch.stack(torch.unbind(y, dim=1), dim=1)
        c = torch.cat(torch.unbind(z, dim=1), dim=1)
        return 2 * s, 2 * c  # read by the next op (see TeachSplitCat)


@register(
    name="teach_unbind_stack",
    description="unbind->stack identity and unbind->cat (a view/reshape)",
    teaches=("unbind_stack", "unbind_cat_to_view"),
    kind="teaching",
)
def build_teach_unbind_stack():
    """Build :class:`TeachUnbindStack`; inputs ``y (8, 4, 8)``, ``z (8, 3, 16)``
    -> outputs ``((8, 4, 8), (8, 48))``."""
    with seeded():
        model = TeachUnbindStack().eval()
        y = torch.randn(BATCH, 4, 8)
        z = torch.randn(BATCH, 3, 16)
    return model, (y, z)
