"""Held-out inputs of the hazard classes, restated from public PyTorch reports: each a factory
returning (model, example_inputs), checked against eager by tests/oracle.py (values, dtypes,
output overlaps, the inputs after the call, gradients for GRAD_CASES), with the default
pipeline and verification off, as inside torch.compile. Results: benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/heldout_cases.py          # one line per case; exit 1 if any differs
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.library.define("optimus_heldout::fill_", "(Tensor(a!) x, float v) -> ()")


@torch.library.impl("optimus_heldout::fill_", "CompositeExplicitAutograd")
def _fill(x, v):
    x.fill_(v)


@torch.library.register_fake("optimus_heldout::fill_")
def _fill_fake(x, v):
    return None


class Towers(nn.Module):
    def __init__(s, n=6, d=8, head=None):
        super().__init__()
        s.lins = nn.ModuleList(nn.Linear(d, d) for _ in range(n))
        s.n, s.d, s.head = n, d, head

    def pieces(s, x):
        return torch.split(x, [s.d] * s.n, dim=1)


class DropoutViewOut(Towers):  # eval dropouts; output a view chain of the cat
    def forward(s, x):
        ps = [F.dropout(p, 0.1, False) for p in s.pieces(x)]
        return torch.cat(ps, 1).view(-1)


class TwoOutsOneStack(Towers):
    def forward(s, x):
        ys = [torch.relu(lin(p)) * 2.0 for lin, p in zip(s.lins, s.pieces(x))]
        return torch.cat(ys, 1).flatten(), ys[0].flatten()


class CustomWrite(Towers):
    def forward(s, x):
        ps = [p.clone() for p in s.pieces(x)]
        outs = []
        for i, (lin, p) in enumerate(zip(s.lins, ps)):
            if i == 3:
                torch.ops.optimus_heldout.fill_(ps[4], 0.5)
            outs.append(lin(p))
        return torch.cat(outs, 1)


class AtenInplace(Towers):
    def forward(s, x):
        ps = [p.clone() for p in s.pieces(x)]
        outs = []
        for i, p in enumerate(ps):
            outs.append(torch.tanh(p))
            if i == 1:
                torch.ops.aten.add_.Tensor(ps[2], 1.0)
        return torch.cat(outs, 1)


class MTWrite(Towers):
    def forward(s, x):
        h = [p.clone() for p in s.pieces(x)]
        outs = []
        for i, p in enumerate(h):
            outs.append(torch.sigmoid(p))
            if i == 0:
                h[3].mT.mul_(3.0)
        return torch.cat(outs, 1)


class Atleast2dWrite(Towers):
    def forward(s, x):
        h = [p.clone() for p in s.pieces(x)]
        outs = []
        for i, p in enumerate(h):
            outs.append(torch.relu(p))
            if i == 2:
                torch.atleast_2d(h[5]).sub_(1.0)
        return torch.cat(outs, 1)


class OverlapInputs(nn.Module):
    def forward(s, a, b):
        outs = []
        for i, p in enumerate(torch.split(a, 4, 1)):
            outs.append(torch.tanh(p))
            if i == 0:
                b.mul_(2.0)
        return torch.cat(outs, 1)


def overlap_inputs():
    base = torch.randn(3, 24)
    return OverlapInputs(), (base[:, :20], base[:, 8:])


class NoGradMix(Towers):
    def forward(s, x):
        outs = []
        for i, (lin, p) in enumerate(zip(s.lins, s.pieces(x))):
            if i % 2:
                with torch.no_grad():
                    outs.append(lin(p))
            else:
                outs.append(lin(p))
        return torch.cat(outs, 1)


class AutocastMix(Towers):
    def forward(s, x):
        outs = []
        for i, (lin, p) in enumerate(zip(s.lins, s.pieces(x))):
            if i < 3:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    outs.append(lin(p).float())
            else:
                outs.append(lin(p))
        return torch.cat(outs, 1)


class MixedStackUnbind(nn.Module):
    def forward(s, a, b):
        return list(torch.unbind(torch.stack([a, b]), 0))


def mixed_stack():
    return MixedStackUnbind(), (torch.randn(4, 4), torch.randn(4, 4, dtype=torch.float64))


class ZeroDimMul(nn.Module):
    def __init__(s):
        super().__init__()
        s.register_buffer("c", torch.tensor(1.25))

    def forward(s, x):
        return torch.cat([p * s.c for p in torch.split(x, 4, 1)], 1)


class AsStridedOffset(Towers):
    def forward(s, x):
        ys = [torch.sigmoid(p) for p in s.pieces(x)]
        return torch.as_strided(ys[-1], (4,), (1,), 2), torch.cat(ys[:-1], 1)


class OutputIsInput(nn.Module):
    def forward(s, x):
        return torch.cat(torch.split(x, 3, 1), 1), x * 2


class StackUnbindOut(nn.Module):
    def forward(s, x):
        return torch.stack(torch.unbind(x, 0), 0)


def _t(cls, *a, shape=(2, 48), dtype=torch.float32):
    def f():
        return cls(*a).eval(), (torch.randn(*shape, dtype=dtype),)

    f.__name__ = cls.__name__
    return f


CASES = {
    "dropout_view_out": _t(DropoutViewOut, shape=(1, 48)),
    "two_outs_one_stack": _t(TwoOutsOneStack, shape=(1, 48)),
    "custom_write": _t(CustomWrite),
    "aten_inplace": _t(AtenInplace),
    "mT_write": _t(MTWrite, shape=(2, 48)),
    "atleast_2d_write": _t(Atleast2dWrite),
    "overlap_inputs": overlap_inputs,
    "no_grad_mix": _t(NoGradMix),
    "autocast_mix": _t(AutocastMix),
    "mixed_stack": mixed_stack,
    "zero_dim_mul_bf16": _t(ZeroDimMul, shape=(2, 24), dtype=torch.bfloat16),
    "as_strided_offset": _t(AsStridedOffset),
    "output_is_input": _t(OutputIsInput, shape=(2, 12)),
    "stack_unbind_out": _t(StackUnbindOut, shape=(3, 5)),
}
GRAD_CASES = {"no_grad_mix", "autocast_mix", "two_outs_one_stack"}
globals().update(CASES)  # each factory also by its case name: what an oracle given this module reads


def main() -> int:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import oracle

    from optimus_lens import RunOptions, run_pipeline

    def rewrite(gm, example_inputs) -> int:
        return len(run_pipeline(gm, example_inputs, None, RunOptions(verify="off")).steps)

    bad = 0
    for name, factory in CASES.items():
        why, steps = oracle.differs(factory, rewrite, name in GRAD_CASES)
        bad += why is not None
        print(f"{name}: {why or 'same as eager'} (steps={steps})", flush=True)
    print(f"{len(CASES) - bad}/{len(CASES)} same as eager")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
