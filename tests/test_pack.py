"""Packed parameters in the graph (optimus_lens.perf.pack): one leaf per fused group, read directly."""

import pytest
import torch
from torch import nn

from optimus_lens.core.engine import copy_graph_module
from optimus_lens.frontend.run import load_model, optimize
from optimus_lens.perf.pack import PATTERN, affine_view, pack_graph
from optimus_lens.perf.stages import build_stages


@pytest.fixture(scope="module")
def towers():
    """recsys_towers (8 towers) after the default pipeline, captured for training."""
    model, inputs, _ = load_model("sample:recsys_towers")
    model.train()
    r = optimize(model, inputs, verify="off")
    return r


def _grads(gm, inputs):
    out = gm(*inputs)
    out = out if isinstance(out, (tuple, list)) else (out,)
    loss = sum((o.float() * torch.linspace(-1, 1, o.numel()).view(o.shape)).sum() for o in out)
    wrt = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
    return out, dict(zip(map(id, wrt), torch.autograd.grad(loss, wrt)))


@pytest.mark.parametrize("layout", ["fused", "members"])
def test_packed_graph_reads_one_leaf_per_group_with_the_same_outputs_and_gradients(towers, layout):
    ins = towers.captured.example_inputs
    gm = copy_graph_module(towers.engine.gm)
    plan = pack_graph(gm, ins, layout=layout)
    # batch_linear x 2 (weight, bias) and batch_layernorm (gamma, beta) of the 8 towers
    assert len(plan.groups) == 6 and not plan.refused
    assert not any(n.target is torch.stack for n in gm.graph.nodes)
    new = plan.inputs(ins)
    out_a, g_a = _grads(towers.engine.gm, ins)
    out_b, g_b = _grads(gm, new)
    for a, b in zip(out_a, out_b):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for (kind, i), x in zip(plan.sources, new):
        if kind == "input" and id(ins[i]) in g_a:
            torch.testing.assert_close(g_b[id(x)], g_a[id(ins[i])], rtol=0, atol=0)
        elif kind == "pack":
            group = plan.groups[i]
            # autograd.grad returns the raw gradient; lay it out as the pack to read the members' views
            g = torch.empty_strided(x.shape, x.stride()).copy_(g_b[id(x)])
            for view, pos in zip(group.members, group.positions):
                torch.testing.assert_close(view.of(g), g_a[id(ins[pos])], rtol=1e-6, atol=1e-7)


def test_fused_layout_is_the_layout_baddbmm_reads_and_members_layout_keeps_the_parameters_strides(towers):
    ins = towers.captured.example_inputs
    fused = pack_graph(copy_graph_module(towers.engine.gm), ins, layout="fused").groups
    members = pack_graph(copy_graph_module(towers.engine.gm), ins, layout="members").groups
    w_fused = next(g for g in fused if len(g.packed.shape) == 3 and g.packed.shape[1] > 1)
    w_members = next(g for g in members if g.name == w_fused.name)
    k, d_in, d_out = w_fused.packed.shape
    assert w_fused.packed.stride == (d_in * d_out, d_out, 1)  # (k, in, out) contiguous
    assert w_fused.members[0].stride == (1, d_out)  # each weight (out, in) a transposed view
    assert w_members.members[0].stride == (d_in, 1)  # contiguous, as nn.Linear made it
    assert w_members.packed.stride == (d_in * d_out, 1, d_in)


def test_every_packed_group_and_every_refusal_is_a_step_of_the_trace(towers):
    model, inputs, _ = load_model("sample:recsys_towers")
    model.train()
    r = optimize(model, inputs, verify="off")
    ins = r.captured.example_inputs
    n = len(r.trace.steps)
    first = next(i for i, x in enumerate(ins) if isinstance(x, nn.Parameter) and x.dim() == 2)
    plan = pack_graph(r.engine.gm, ins, refused={first: "tied: a test says so"}, trace=r.trace)
    steps = r.trace.steps[n:]
    assert [s.pattern for s in steps] == [PATTERN] * 6
    refused = [s for s in steps if not s.info["packed"]]
    assert len(refused) == 1 and "tied: a test says so" in refused[0].info["reason"]
    assert refused[0].created == [] and refused[0].delta is not None and not refused[0].delta.upsert
    packed = [s for s in steps if s.info["packed"]]
    assert len(packed) == len(plan.groups) == 5
    assert all(s.created and s.info["bytes_packed"] > 0 for s in packed)
    # the trace replays through the pack steps: the last graph holds the packed placeholders
    last = r.trace.graph_at(len(r.trace.steps))
    assert {g.name for g in plan.groups} <= set(last.nodes)


class _Shared(nn.Module):
    """Five linears whose first weight is also read by a sixth op outside the group."""

    def __init__(self):
        super().__init__()
        self.fcs = nn.ModuleList(nn.Linear(8, 8) for _ in range(5))

    def forward(self, x):
        outs = [f(x) for f in self.fcs]
        return torch.cat(outs, 1) + self.fcs[0].weight.sum()


def test_a_parameter_read_outside_its_group_keeps_the_group_unpacked_with_the_reason():
    model = _Shared().train()
    r = optimize(model, (torch.randn(4, 8),), verify="off", passes=["batch_linear_lhs"])
    plan = pack_graph(r.engine.gm, r.captured.example_inputs, trace=r.trace)
    (refused,) = plan.refused
    assert "also read outside this group" in refused["reason"]
    assert any("fcs_modules_0" in p and "weight" in p for p in refused["params"])
    (bias,) = plan.groups  # the biases are read by the fused linear only: packed
    assert all("bias" in p for p in bias.params)


def test_mixed_dtypes_are_refused_not_packed():
    ins = (nn.Parameter(torch.randn(3, 4)), nn.Parameter(torch.randn(3, 4, dtype=torch.float64)))
    g = torch.fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    g.output(g.call_function(torch.stack, ([a, b],)))
    gm = torch.fx.GraphModule(nn.Module(), g)
    plan = pack_graph(gm, ins)
    assert not plan.groups and "mixed dtypes" in plan.refused[0]["reason"]


def test_a_cat_along_dim_1_packs_as_a_strided_view_of_each_member():
    ins = (nn.Parameter(torch.randn(3, 4)), nn.Parameter(torch.randn(3, 2)))
    g = torch.fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    g.output(g.call_function(torch.cat, ([a, b], 1)))
    gm = torch.fx.GraphModule(nn.Module(), g)
    plan = pack_graph(gm, ins)
    (group,) = plan.groups
    assert group.packed.shape == (3, 6) and group.members[0].stride == (6, 1)
    new = plan.inputs(ins)
    torch.testing.assert_close(gm(*new), torch.cat(ins, 1), rtol=0, atol=0)
    # a member's slice of a cat along dim 1 is not contiguous, so "members" cannot hold it
    plan2 = pack_graph(torch.fx.GraphModule(nn.Module(), _cat_graph()), ins, layout="members")
    assert not plan2.groups and "layout='members'" in plan2.refused[0]["reason"]


def _cat_graph():
    g = torch.fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    g.output(g.call_function(torch.cat, ([a, b], 1)))
    return g


def test_affine_view_finds_strides_and_refuses_what_no_strides_place():
    assert affine_view(torch.tensor([[3, 5, 7], [4, 6, 8]])).stride == (1, 2)
    assert affine_view(torch.tensor([[0, 1], [3, 2]])) is None


def test_training_bench_has_a_packed_stage_that_reads_the_packed_leaves():
    stages, facts = build_stages("sample:teach_batch_linear", mode="training", final_only=True)
    names = [s.label for s in stages]
    assert "packed" in names and "prepack_weights" not in names
    packed = stages[names.index("packed")]
    assert packed.kind == "prepack" and facts["bytes_packed"] > 0
    assert not any(n.target is torch.stack for n in packed.gm.graph.nodes)
    leaves = [x for x in packed.inputs if isinstance(x, nn.Parameter)]
    assert any(x.dim() == 3 for x in leaves)  # the packed (k, in, out) weights are the graph's leaves
