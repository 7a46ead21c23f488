"""Random models for fuzzing the passes: parallel branches plus split/cat/stack/unbind plumbing.

A :class:`RandomSpec` describes one model; :func:`build` turns it into
``(nn.Module, example_inputs)``. The fuzz test (tests/test_fuzz.py) draws specs with
hypothesis; ``benchmarks/fuzz.py`` draws thousands with ``random``. Every model traces
with Dynamo without graph breaks.

Shape of a model: the input ``x`` of shape (B, sum(widths)) is split with
``torch.split`` (sizes possibly uneven, dim written as 1 or -1) into one piece per
branch; each branch applies its op chain (linear / layer_norm / unary pointwise ops /
clamp / nan_to_num / detach / eval dropout); branches with equal widths and chains are
fusable. The branch outputs are joined by ``cat`` (in order or permuted), ``stack``
(if all shapes agree), or ``stack`` followed by ``unbind`` and ``cat`` — the plumbing
the split/cat passes clean up.

Layout and symbolic sizes (the kind of bug where a rewrite turns a fresh contiguous
tensor into a strided view): ``input_layout`` hands the model a transposed or sliced
(non-contiguous) ``x``; ``consumer`` puts a layout-sensitive use on the joined result
and on the first branch's output, both returned (``view(-1)``, ``as_strided`` over the
elements, ``reshape(-1)``), so a fusion or cleanup that changes their strides is caught
by the view raising, by as_strided reading other elements, or by the output strides;
``dynamic`` captures with dynamic shapes and, when the branches share one width, splits
by a size computed from the input (``x.size(1) // n``).

Hazards (:mod:`.hazards`, ``RandomSpec.hazards``): the classes of program that bit us —
writes through custom ops, ATen in-place overloads and aliases, overlapping input views,
grad and autocast regions, mixed dtypes and 0-dim operands, outputs that a rewrite could
make the input, ``as_strided`` with an absolute offset. Each is switchable: a spec draws
only the classes it is given (:func:`random_spec`'s ``hazards``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import hazards as hz
from .hazards import HAZARDS as HAZARDS  # re-exported: the classes a spec draws from

UNARY = ("relu", "relu_method", "tanh", "sigmoid", "clamp_pos", "clamp_kw", "nan_to_num", "detach", "dropout")
#: width-preserving ops for the fusions beyond upstream's catalogue: a softmax, a product
#: with a gain shared by every branch of one width (one parameter node), a row sum
SHAPED = ("softmax", "mul_shared", "sum_scale")
OPS = ("linear", "linear_nobias", "layer_norm", "layer_norm_noaffine", *UNARY, *SHAPED)
JOINS = ("cat", "cat_permuted", "stack", "stack_unbind_cat", "split_again_cat")
INPUT_LAYOUTS = ("contiguous", "transposed", "sliced")
CONSUMERS = ("none", "view", "as_strided", "reshape")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class RandomSpec:
    """One random model: ``widths`` per branch, ``chains`` of op names per branch (each
    linear maps width -> ``out_width`` of that branch), ``join`` from ``JOINS``, the
    ``split_dim`` spelling (1 or -1), ``batch`` size, ``dtype`` name and ``seed``;
    ``input_layout`` (``INPUT_LAYOUTS``), ``consumer`` (``CONSUMERS``) and ``dynamic``
    as in the module docstring (defaults: the plain models of earlier specs)."""

    widths: list[int]
    chains: list[list[str]]
    join: str = "cat"
    split_dim: int = 1
    batch: int = 4
    dtype: str = "float32"
    seed: int = 0
    out_widths: list[int] = field(default_factory=list)
    input_layout: str = "contiguous"
    consumer: str = "none"
    dynamic: bool = False
    #: classes from ``HAZARDS``; ``hazard_at``: the branch a write or region starts at;
    #: ``flavour`` picks among a hazard's spellings (``.T`` / ``.mT``)
    hazards: list[str] = field(default_factory=list)
    hazard_at: int = 1
    flavour: int = 0

    @property
    def grads(self) -> bool:
        """Whether gradients are compared for this model: float32, and no write into the
        input (a leaf that requires grad cannot be written in place)."""
        return self.dtype == "float32" and not hz.writes_input(self.hazards)


def random_spec(rng: random.Random, dtype: str = "float32", hazards: tuple[str, ...] = ()) -> RandomSpec:
    """A spec drawn from ``rng``: 2..9 branches, mostly sharing one width and one chain
    (so fusions happen), sometimes not; with ``hazards`` (classes of ``HAZARDS``), one or
    two of them in 3 specs of 4."""
    n = rng.randint(2, 9)
    common_w = rng.choice([4, 8, 16])
    common_chain = [rng.choice(OPS) for _ in range(rng.randint(1, 4))]
    widths, chains = [], []
    for _ in range(n):
        same = rng.random() < 0.8
        widths.append(common_w if same else rng.choice([3, 4, 8, 16]))
        chains.append(list(common_chain) if same else [rng.choice(OPS) for _ in range(rng.randint(1, 4))])
    spec = RandomSpec(
        widths, chains, rng.choice(JOINS), rng.choice([1, -1]), rng.choice([1, 2, 4]), dtype, rng.randrange(2**31)
    )
    spec.input_layout = rng.choice(INPUT_LAYOUTS)
    spec.consumer = rng.choice(CONSUMERS)
    spec.dynamic = rng.random() < 0.15
    if hazards and rng.random() < 0.75:
        spec.hazards = sorted(set(rng.sample(list(hazards), min(len(hazards), rng.choice([1, 1, 2])))))
        spec.hazard_at = rng.randint(1, n - 1)
        spec.flavour = rng.randint(0, 1)
        spec.dynamic = False
    return spec


class RandomModel(nn.Module):
    """The model a RandomSpec describes. Input (B, sum(widths)); output depends on the join."""

    def __init__(self, spec: RandomSpec):
        super().__init__()
        self.spec = spec
        self.gains = nn.ParameterDict({str(w): nn.Parameter(torch.rand(w) + 0.5) for w in sorted(set(spec.widths))})
        self.mods = nn.ModuleList()
        self.out_widths = []
        for w, chain in zip(spec.widths, spec.chains):
            layers = nn.ModuleList()
            for op in chain:
                if op in ("linear", "linear_nobias"):
                    layers.append(nn.Linear(w, w, bias=op == "linear"))
                elif op in ("layer_norm", "layer_norm_noaffine"):
                    layers.append(nn.LayerNorm(w, elementwise_affine=op == "layer_norm"))
                else:
                    layers.append(nn.Identity())
            self.mods.append(layers)
            self.out_widths.append(w)
        # how the joined result and the first branch are consumed; build() turns a view that
        # eager mode rejects (a transposed or aliased branch) into a reshape
        self.consumers = [spec.consumer, spec.consumer]
        self.register_buffer("scale0", torch.tensor(1.5))  # zero_dim: float32 whatever the model's dtype

    def _apply_op(self, op: str, mod: nn.Module, x: torch.Tensor, width: int) -> torch.Tensor:
        if op.startswith("linear") or op.startswith("layer_norm"):
            return mod(x)
        if op == "relu":
            return F.relu(x)
        if op == "relu_method":
            return x.relu()
        if op == "tanh":
            return torch.tanh(x)
        if op == "sigmoid":
            return torch.sigmoid(x)
        if op == "clamp_pos":
            return torch.clamp(x, -0.5, 0.5)
        if op == "clamp_kw":
            return torch.clamp(x, min=-0.5, max=0.5)
        if op == "nan_to_num":
            return torch.nan_to_num(x, 0.0, posinf=1.0)
        if op == "detach":
            return x.detach()
        if op == "dropout":
            return F.dropout(x, 0.5, False)
        if op == "softmax":
            return F.softmax(x, dim=-1)
        if op == "mul_shared":
            return x * self.gains[str(width)]
        if op == "sum_scale":
            return x * x.sum(-1, keepdim=True)
        raise ValueError(f"unknown op {op!r}")

    def forward(self, x: torch.Tensor, *extra: torch.Tensor):
        s = self.spec
        y, first, last = self._join(x, extra)
        outs = [y] if s.consumer == "none" else [_consume(y, self.consumers[0]), _consume(first, self.consumers[1])]
        if "output_is_input" in s.hazards:
            outs.append(torch.cat(torch.split(x, s.widths, dim=1), dim=1))
        if "as_strided_offset" in s.hazards:
            outs.append(hz.strided_offset(last))
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _join(self, x: torch.Tensor, extra: tuple = ()) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        s = self.spec
        if s.dynamic and len(set(s.widths)) == 1:
            pieces = torch.split(x, x.size(1) // len(s.widths), dim=s.split_dim)
        else:
            pieces = torch.split(x, s.widths, dim=s.split_dim)
        outs = []
        for i, (p, chain, layers, w) in enumerate(zip(pieces, s.chains, self.mods, s.widths)):
            if i == s.hazard_at:
                for kind in s.hazards:
                    if kind == "overlapping_inputs" and extra:
                        extra[0].mul_(2.0)
                    elif kind in hz.WRITES:
                        hz.write(kind, p, s.flavour)
            with hz.region(s.hazards, i, s.hazard_at):
                for op, mod in zip(chain, layers):
                    p = self._apply_op(op, mod, p, w)
            if i == s.hazard_at and "mixed_dtype" in s.hazards:
                p = p.to(hz.other_dtype(p.dtype))
            if "zero_dim" in s.hazards:
                p = p * self.scale0
            outs.append(p)
        return self._joined(outs), outs[0], outs[-1]

    def _joined(self, outs: list[torch.Tensor]) -> torch.Tensor:
        s = self.spec
        shapes_equal = len({o.shape for o in outs}) == 1
        if s.join == "cat_permuted":
            order = list(range(len(outs)))[::-1]
            return torch.cat([outs[i] for i in order], dim=-1)
        if s.join == "stack" and shapes_equal:
            return torch.stack(outs, dim=0)
        if s.join == "stack_unbind_cat" and shapes_equal:
            return torch.cat(list(torch.unbind(torch.stack(outs, dim=1), dim=1)), dim=1)
        if s.join == "split_again_cat":
            y = torch.cat(outs, dim=1)
            return torch.cat(torch.split(y, self.out_widths, dim=-1), dim=1)
        return torch.cat(outs, dim=1)


def _consume(t: torch.Tensor, how: str) -> torch.Tensor:
    """A layout-sensitive use of ``t`` (contiguous in eager): ``view(-1)``, ``as_strided``
    over its elements in storage order from its offset, or ``reshape(-1)``."""
    if how == "view":
        return t.view(-1)
    if how == "as_strided":
        return t.as_strided((t.numel(),), (1,)) * 1.0
    return t.reshape(-1)


def build(spec: RandomSpec) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """(model in eval mode, inputs) for ``spec``, deterministic in ``spec.seed``; the
    input ``x`` is (batch, sum(widths)) in ``spec.dtype``, laid out as
    ``spec.input_layout`` says (transposed: the transpose of a (sum(widths), batch)
    tensor; sliced: columns of a wider tensor). With the ``overlapping_inputs`` hazard,
    ``x`` and a second input are overlapping column windows of one buffer
    (``hazards.SHIFT`` columns apart)."""
    if "custom_op_write" in spec.hazards:
        hz.fuzz_ops()
    g = torch.Generator().manual_seed(spec.seed)
    with torch.random.fork_rng():
        torch.manual_seed(spec.seed)
        m = RandomModel(spec).eval()
    dt = DTYPES[spec.dtype]
    b, w = spec.batch, sum(spec.widths)
    if "overlapping_inputs" in spec.hazards:
        base = torch.randn(b, w + hz.SHIFT, generator=g).to(dt)
        inputs: tuple[torch.Tensor, ...] = (base[:, :w], base[:, hz.SHIFT : hz.SHIFT + w])
    elif spec.input_layout == "transposed":
        inputs = (torch.randn(w, b, generator=g).to(dt).t(),)
    elif spec.input_layout == "sliced":
        inputs = (torch.randn(b, w + 3, generator=g).to(dt)[:, 1 : 1 + w],)
    else:
        inputs = (torch.randn(b, w, generator=g).to(dt),)
    m = m.to(dt)
    m.scale0 = torch.tensor(1.5)  # stays float32: a 0-dim operand of another dtype than the model's
    if spec.consumer != "none":
        c = spec.consumer
        for m.consumers in ([c, c], [c, "reshape"], ["reshape", "reshape"]):
            try:
                with torch.no_grad():
                    m(*(t.clone() for t in inputs))  # a probe: the model may write its input
                break
            except RuntimeError:  # eager cannot view this value: its author would have written reshape
                continue
    return m, inputs


def dtype_supported(dtype: str) -> bool:
    """Whether this machine runs linear + layer_norm in ``dtype`` on CPU."""
    dt = DTYPES[dtype]
    try:
        x = torch.randn(2, 4, dtype=dt)
        F.layer_norm(F.linear(x, torch.randn(4, 4, dtype=dt)), (4,))
        return True
    except RuntimeError:
        return False
