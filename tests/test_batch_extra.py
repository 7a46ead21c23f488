"""Batch fusions beyond upstream's catalogue: batch_normalize groups independent F.normalize
calls (the L2-normalised tower outputs of a retrieval model), shifts a front-counted dim past
the stack dim, keeps values, gradients and strides, and never runs under upstream's pipeline."""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import nn

from optimus_lens import sample_models
from optimus_lens.core import meta
from optimus_lens.core.engine import Engine, RunOptions
from optimus_lens.core.pattern import REGISTRY
from optimus_lens.core.pipeline import Pass, Pipeline
from optimus_lens.frontend.capture import capture
from optimus_lens.passes import default_pipeline, upstream_pipeline
from optimus_lens.passes.profit import group_estimate


def _run(model, inputs, pipe=None):
    c = capture(model, inputs)
    pipe = pipe or Pipeline([Pass("batch_normalize", [REGISTRY["batch_normalize"]])])
    return Engine(c.gm, c.example_inputs, pipe, RunOptions(verify="step", grads=True)).run(), c.gm


class Normalized(nn.Module):
    """Five F.normalize over dim ``dim`` of (4, 8, 5) inputs, two more with another p and eps."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, *xs):
        same = [F.normalize(x, dim=self.dim) for x in xs[:5]]
        other = [F.normalize(xs[5], p=1.0, dim=self.dim), F.normalize(xs[6], dim=self.dim, eps=1e-6)]
        return torch.cat(same + other, dim=-1).view(-1)  # view: outputs' strides matter


def test_twin_towers_normalises_its_six_towers_once():
    model, inputs = sample_models.get("twin_towers")
    trace, gm = _run(model, inputs, default_pipeline())
    (step,) = [s for s in trace.steps if s.pattern == "batch_normalize"]
    assert len(step.sites) == 6 and step.verify.ok
    assert trace.final_verify is None or trace.final_verify.ok
    assert len([n for n in gm.graph.nodes if n.target is F.normalize]) == 1


def test_front_counted_dims_shift_past_the_stack_and_only_equal_arguments_group():
    for dim in (0, 1, 2, -1, -3):
        inputs = tuple(torch.randn(4, 8, 5, requires_grad=True) for _ in range(7))
        trace, gm = _run(Normalized(dim), inputs)
        (step,) = trace.steps
        assert len(step.sites) == 5, dim  # p=1 and eps=1e-6 stay apart
        assert step.verify.ok and step.verify.checked == "outputs+grads", (dim, step.verify)
        (fused,) = [n for n in gm.graph.nodes if n.target is F.normalize and n.kwargs.get("p") == 2.0]
        assert fused.kwargs["dim"] == (dim + 1 if dim >= 0 else dim)


def test_upstream_pipeline_never_runs_it():
    model, inputs = sample_models.get("twin_towers")
    c = capture(model, inputs)
    names = [p.name for p in upstream_pipeline({"batch_relu": {}}).passes]
    assert "batch_normalize" not in names and "batch_normalize" in [p.name for p in default_pipeline().passes]
    assert REGISTRY["batch_normalize"].key(next(n for n in c.gm.graph.nodes if n.target is F.normalize))


# ------------------------------------------------- softmax, mul, sum and the contraction


def _one(name):
    return Pipeline([Pass(name, [REGISTRY[name]], estimate=group_estimate)])


def _targets(gm, *fns):
    return [n for n in gm.graph.nodes if n.target in fns]


def test_mmoe_gates_softmax_mix_and_contract_once():
    """MMoE's three gates: one softmax, one product of their stack with the experts, one
    sum, and the product and sum become one bmm over (B, T, K) x (B, K, E)."""
    model, inputs = sample_models.get("mmoe")
    trace, gm = _run(model, inputs, default_pipeline())
    by = {}
    for s in trace.steps:
        by.setdefault(s.pattern, []).append(len(s.sites))
        assert s.verify.ok, (s.pattern, s.verify)
    assert by["batch_softmax"] == [3] and by["batch_mul"] == [3] and by["batch_sum"] == [3]
    assert by["mul_sum_to_matmul"] == [2]
    assert len(_targets(gm, torch.softmax)) == 1
    (bmm,) = _targets(gm, torch.bmm)  # (B, T, K) x (B, K, E)
    assert [tuple(meta.shape(a)) for a in bmm.args] == [(256, 3, 8), (256, 8, 32)]
    assert not _targets(gm, torch.sum, operator.mul, torch.mul, torch.functional.einsum)


def test_twin_towers_dots_with_tower_zero_are_one_product_and_one_sum():
    """The five dots of tower 0 with the others: tower 0 is read once against the stack of
    the five (a batched dot, not a matrix product: no bmm)."""
    model, inputs = sample_models.get("twin_towers")
    trace, gm = _run(model, inputs, default_pipeline())
    sizes = {s.pattern: len(s.sites) for s in trace.steps if s.pattern in ("batch_mul", "batch_sum")}
    assert sizes == {"batch_mul": 5, "batch_sum": 5}
    assert trace.final_verify is None or trace.final_verify.ok
    (total,) = _targets(gm, torch.sum)  # the layer norms' affine muls are the other muls
    assert total.args[0].target is torch.mul and len(total.args[0].users) == 1
    assert not _targets(gm, torch.functional.einsum, torch.bmm)


class Sums(nn.Module):
    def __init__(self, dim, keepdim):
        super().__init__()
        self.dim, self.keepdim = dim, keepdim

    def forward(self, *xs):
        if self.dim is None:
            ss = [x.sum() for x in xs[:3]] + [torch.sum(x) for x in xs[3:5]]
        else:
            ss = [x.sum(self.dim, keepdim=self.keepdim) for x in xs[:3]]
            ss += [torch.sum(x, dim=self.dim, keepdim=self.keepdim) for x in xs[3:5]]
        return torch.stack(ss + [xs[5].mean() * 0 + ss[0]]).view(-1)  # view: strides matter


def test_sum_dims_shift_past_the_stack_for_every_form():
    for dim, keepdim in [(0, False), (1, True), (-1, False), ((0, 2), False), ((-1, 0), True), (None, False)]:
        inputs = tuple(torch.randn(4, 6, 5, requires_grad=True) for _ in range(6))
        trace, gm = _run(Sums(dim, keepdim), inputs, _one("batch_sum"))
        (step,) = [s for s in trace.steps if s.pattern == "batch_sum"]
        assert len(step.sites) == 5, (dim, keepdim, step.sites)
        assert step.verify.ok and step.verify.checked == "outputs+grads", (dim, step.verify)


class Softmaxes(nn.Module):
    def forward(self, *xs):
        ys = [torch.softmax(xs[0], 1), F.softmax(xs[1], dim=1), xs[2].softmax(dim=1)]
        ys += [F.softmax(xs[3], 1, 3), torch.softmax(xs[4], 1, dtype=torch.float64).float()]
        return torch.cat(ys, dim=-1)


def test_softmax_spellings_fuse_and_a_dtype_keeps_its_member_apart():
    inputs = tuple(torch.randn(4, 6, 5, requires_grad=True) for _ in range(5))
    trace, gm = _run(Softmaxes(), inputs, _one("batch_softmax"))
    (step,) = trace.steps
    assert len(step.sites) == 4 and step.verify.ok and step.verify.checked == "outputs+grads"
    (fused,) = [n for n in gm.graph.nodes if n.target is torch.softmax and "dtype" not in n.kwargs]
    assert fused.kwargs["dim"] == 2
    member = next(n for n in gm.graph.nodes if n.target is torch.softmax and n.kwargs.get("dtype") is torch.float64)
    assert "dtype" in str(REGISTRY["batch_softmax"].key(member))


class Products(nn.Module):
    """q (6, 5) against four (4, 6, 5) values in every order and spelling (q broadcasts up),
    three lower-rank ones padded against a higher-rank shared operand, and one product that
    shares nothing."""

    def forward(self, q, a, b, c, d, w, u, v, t, lone):
        ps = [q * a, b * q, torch.mul(q, c), d.mul(q)]
        rs = [u * w, w * v, t * w]  # u, v, t (5,) against w (4, 6, 5)
        return torch.cat([p.reshape(-1) for p in ps + rs] + [(lone * lone).reshape(-1)])


def test_products_with_one_shared_operand_broadcast_it_and_a_product_sharing_nothing_has_no_key():
    """(Two members never pay on their own: a stack and one product are as many kernels as
    two products, so the profit estimate refuses them unless the stack is an unbind's
    pieces put back; groups here have 3 and 4.)"""
    inputs = (torch.randn(6, 5), *(torch.randn(4, 6, 5) for _ in range(5)), *(torch.randn(5) for _ in range(3)))
    inputs = tuple(t.requires_grad_() for t in inputs) + (torch.randn(3),)
    trace, gm = _run(Products(), inputs, _one("batch_mul"))
    sites = sorted(len(s.sites) for s in trace.steps)
    assert sites == [3, 4], [s.sites for s in trace.steps]
    assert all(s.verify.ok and s.verify.checked == "outputs+grads" for s in trace.steps)
    lone = next(n for n in gm.graph.nodes if n.target is operator.mul and n.args[0] is n.args[1])
    assert "no other mul" in str(REGISTRY["batch_mul"].key(lone))


class Contractions(nn.Module):
    def forward(self, a, b, x, y, s, t, u, v):
        mm = (a.unsqueeze(-1) * b.unsqueeze(1)).sum(-2)  # bmm: (8, 16, 16)
        dots = (x * y).sum(-1)  # a batched dot: no free dim on either side
        p = s.unsqueeze(-1) * t.unsqueeze(1)
        shared = p.sum(-2) + p.mean()  # the product has another user
        two_batch = (u.unsqueeze(-1) * v.unsqueeze(-3)).sum(-2, keepdim=True)  # (2, 4, 16, 1, 16): einsum
        return mm.sum() + dots.sum() + shared.sum() + two_batch.sum()


def test_a_product_summed_over_a_shared_dim_becomes_einsum_only_when_it_is_a_matrix_product():
    g = lambda *s: torch.randn(*s, requires_grad=True)  # noqa: E731
    inputs = (g(8, 16, 16), g(8, 16, 16), g(64, 64), g(64, 64), g(8, 16, 16), g(8, 16, 16))
    inputs += (g(2, 4, 16, 16), g(2, 4, 16, 16))
    trace, gm = _run(Contractions(), inputs, _one("mul_sum_to_matmul"))
    assert len(trace.steps) == 2
    assert all(s.verify.ok and s.verify.checked == "outputs+grads" for s in trace.steps)
    (bmm,) = _targets(gm, torch.bmm)
    assert not [u for u in bmm.users if u.target is torch.permute]  # already (batch, m, n)
    (e,) = _targets(gm, torch.functional.einsum)
    assert e.args[0] == "abcd,abde->abce"
    p = REGISTRY["mul_sum_to_matmul"]
    why = {str(p.match(n)) for n in gm.graph.nodes if n.target == "sum" and n.args[0].target is operator.mul}
    assert any("not a matrix product" in w for w in why) and any("other users" in w for w in why), why
    small = capture(
        Contractions(), tuple(torch.randn(*t.shape[:-2], 4, 4) if t.dim() > 2 else t.detach() for t in inputs)
    )
    whys = [str(p.match(n)) for n in small.gm.graph.nodes if n.target == "sum" and n.args[0].target is operator.mul]
    assert any("elements (< 4096)" in w for w in whys), whys


def test_upstream_pipeline_never_runs_the_extra_fusions():
    names = {p.name for p in upstream_pipeline({"batch_relu": {}, "normalization_pass": {}}).passes}
    extra = {"batch_softmax", "batch_mul", "batch_sum", "mul_sum_to_matmul"}
    assert not names & extra and extra <= {p.name for p in default_pipeline().passes}


class Restacked(nn.Module):
    def forward(self, y):
        return torch.stack([u.unsqueeze(-1) for u in y.unbind(1)], dim=2).view(-1)


def test_a_stack_of_unsqueezed_unbind_pieces_becomes_one_reshape():
    """What the gate fusions leave between softmax and product: ``stack([u_i[..., None]])``
    of every piece of one unbind is one reshape of the unbind input (parity.md: upstream's
    move_reshape_out_of_split_stack takes split pieces and reshape/view only)."""
    name = "move_reshape_out_of_split_stack"
    trace, gm = _run(Restacked(), (torch.randn(4, 3, 5, requires_grad=True),), _one(name))
    (step,) = trace.steps
    assert step.verify.ok and step.verify.checked == "outputs+grads"
    assert not [n for n in gm.graph.nodes if n.target in (torch.stack, torch.unbind, "unbind", "unsqueeze")]


class PairSharing(nn.Module):
    def forward(self, s, a, b):
        return torch.cat([(s * a).view(-1), (b * s).view(-1)])


def test_a_pair_that_would_cost_a_stack_is_not_fused_and_why_names_the_profit_estimate():
    """Two products become a stack and one product: no launch saved, bytes copied."""
    from optimus_lens.debug.why import DryRun

    model, inputs = PairSharing(), tuple(torch.randn(4, 8) for _ in range(3))
    trace, _ = _run(model, inputs, default_pipeline())
    assert not [s for s in trace.steps if s.pattern == "batch_mul"]
    c = capture(model, inputs)
    mul = next(n for n in c.gm.graph.nodes if n.target is operator.mul)
    (v,) = DryRun(c.gm, default_pipeline()).explain(mul.name, ["batch_mul"]).verdicts
    assert not v.applies and "profit estimate expects fusing them to cost time" in v.text, v.text
    assert "kernel" in v.text and "more copied per call" in v.text, v.text


class HalfContraction(nn.Module):
    def forward(self, a, b):
        return (a.unsqueeze(-1) * b.unsqueeze(1)).sum(-2)


def test_a_16_bit_contraction_is_left_as_product_and_sum():
    """A bf16 product rounds each term before the sum; a bmm does not (the results differ
    by more than verification's tolerance), so the rewrite takes float32 and float64 only."""
    inputs = tuple(torch.randn(8, 16, 16, dtype=torch.bfloat16) for _ in range(2))
    c = capture(HalfContraction(), inputs)
    (total,) = [n for n in c.gm.graph.nodes if n.target == "sum"]
    assert "bfloat16 operands" in str(REGISTRY["mul_sum_to_matmul"].match(total))


def test_the_matmul_reads_what_the_unsqueezes_read_and_they_go():
    """``(a.unsqueeze(-1) * b.unsqueeze(1)).sum(-2)`` -> ``bmm(a, b)``: no squeeze of an
    unsqueeze is left, and the unsqueezes the product alone read are erased."""
    inputs = tuple(torch.randn(8, 16, 16, requires_grad=True) for _ in range(2))
    trace, gm = _run(HalfContraction(), inputs, _one("mul_sum_to_matmul"))
    (step,) = trace.steps
    assert step.verify.ok and step.verify.checked == "outputs+grads"
    ops = [n.target for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
    assert ops == [torch.bmm], ops
