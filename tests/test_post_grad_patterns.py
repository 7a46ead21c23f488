"""The post-grad catalogue (optimus_lens.passes.post_grad) on ATen graphs: each pattern fires
where it should, every step keeps the graph's outputs (per-step verification, and the
rewritten graph against eager PyTorch), refuses with a reason where it must not fire, and
does not repeat upstream's defects (sub's alpha, uneven splits, the dtype of a batched mm,
an unsqueeze on another dim, a reshape that reorders elements)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from optimus_lens.core.engine import Engine, RunOptions
from optimus_lens.core.pattern import REGISTRY, why_not
from optimus_lens.core.pipeline import Pass, Pipeline
from optimus_lens.frontend.aten_capture import AtenGraph, capture_aten
from optimus_lens.frontend.capture import capture
from optimus_lens.frontend.run import load_model
from optimus_lens.passes.post_grad import post_grad_pattern_pass, post_grad_pipeline

aten = torch.ops.aten


def forward_graph(model: nn.Module, inputs: tuple, mode: str = "inference") -> AtenGraph:
    c = capture(model, inputs)
    return capture_aten(c.gm, c.example_inputs, mode).graph("forward")


def sample_forward(name: str) -> tuple[nn.Module, tuple, AtenGraph]:
    model, inputs, _ = load_model(f"sample:{name}")
    return model, inputs, forward_graph(model, inputs)


def run(g: AtenGraph, pipeline: Pipeline):
    """Every step verified; returns the engine (its gm is the rewritten graph)."""
    e = Engine(g.gm, g.example_inputs, pipeline, RunOptions(verify="step"), graph="forward")
    e.run()
    assert not e.trace.failed_steps(), [(s.pattern, s.verify) for s in e.trace.failed_steps()]
    return e


def one(name: str) -> Pipeline:
    return Pipeline([Pass(name, [REGISTRY[name]])])


def same_as_eager(model: nn.Module, inputs: tuple, e: Engine, rtol=1e-4, atol=1e-5) -> None:
    """The rewritten forward graph against eager PyTorch on the same inputs (inference:
    the forward graph's outputs are the model's, flattened)."""
    with torch.no_grad():
        expected = torch.utils._pytree.tree_leaves(model(*inputs))
        got = e.gm(*e.inputs)
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


def hand_graph(fn, *inputs) -> AtenGraph:
    """An ATen graph of ``fn`` (make_fx, OpOverload targets) with ``meta['val']``."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    gm = make_fx(fn)(*inputs)
    FakeTensorProp(gm, FakeTensorMode(allow_non_fake_inputs=True)).propagate(*inputs)
    return AtenGraph("forward", gm, tuple(inputs), True)


# ------------------------------------------------------------------ batch fusions


def test_batch_aten_sub_keeps_alpha():
    model, inputs, g = sample_forward("post_grad_sub_alpha")
    e = run(g, one("batch_aten_sub"))
    (step,) = e.trace.steps
    assert len(step.sites) == 10
    fused = [n for n in e.gm.graph.nodes if n.target is aten.sub.Tensor]
    assert len(fused) == 1 and fused[0].kwargs == {"alpha": 2}
    same_as_eager(model, inputs, e)


def test_batch_linear_post_grad_keys_on_dtype_and_keeps_each_members_dtype():
    model, inputs, g = sample_forward("post_grad_mixed_dtype_mm")
    e = run(g, one("batch_linear_post_grad"))
    groups = sorted(len(s.sites) for s in e.trace.steps)
    assert groups == [5, 5]  # the five fp32 and the five bf16 products fuse apart
    dtypes = {str(n.meta["val"].dtype) for n in e.gm.graph.nodes if n.target is aten.baddbmm.default}
    assert dtypes == {"torch.float32", "torch.bfloat16"}
    same_as_eager(model, inputs, e, rtol=2e-2, atol=2e-2)


def test_batch_linear_post_grad_refuses_addmm_with_beta_or_alpha():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.ParameterList(nn.Parameter(torch.randn(8, 8)) for _ in range(5))
            self.b = nn.ParameterList(nn.Parameter(torch.randn(8)) for _ in range(5))

        def forward(self, x):
            return [torch.addmm(b, x[i], w, beta=0.5) for i, (w, b) in enumerate(zip(self.w, self.b))]

    g = forward_graph(Scaled(), (torch.randn(5, 4, 8),))
    addmm = next(n for n in g.gm.graph.nodes if n.target is aten.addmm.default)
    assert "beta=0.5" in str(why_not(REGISTRY["batch_linear_post_grad"], addmm))
    assert not Engine(g.gm, g.example_inputs, one("batch_linear_post_grad"), RunOptions(verify="off")).run().steps


def test_fused_nodes_get_val_and_carry_aot_provenance():
    model, inputs, g = sample_forward("post_grad_sub_alpha")
    e = run(g, one("batch_aten_sub"))
    created = [n for n in e.gm.graph.nodes if n.name in set(e.trace.steps[0].created)]
    assert all("val" in n.meta and "example_value" not in n.meta for n in created)
    pieces = [n for n in created if n.target is aten.select.int]
    assert pieces and all(n.meta.get("seq_nr") is not None and n.meta.get("from_node") for n in pieces)


def test_members_reading_a_tensor_written_in_place_fuse_only_on_one_side_of_the_write():
    """The write's schema (``aten.add_.Tensor``: ``Tensor(a!) self``) orders it after the reads
    before it: the five tanhs before the write fuse into one op placed before it, the five
    after it into another; no group spans the write, and the result is eager's."""

    def f(x):
        out = [torch.tanh(x[i]) for i in range(5)]
        x.add_(1)
        return out + [torch.tanh(x[i]) for i in range(5)]

    x = torch.randn(5, 4)
    g = hand_graph(f, x.clone())
    nodes = list(g.gm.graph.nodes)
    write = next(i for i, n in enumerate(nodes) if n.target is aten.add_.Tensor)
    side = {n.name: i < write for i, n in enumerate(nodes)}
    e = run(g, one("batch_aten_tanh"))
    assert len(e.trace.steps) == 2
    for s in e.trace.steps:
        assert len({side[n] for n in s.sites if n in side and n.startswith("tanh")}) == 1, s.sites
    x1, x2 = x.clone(), x.clone()
    expected, got = f(x1), e.gm(x2)
    for a, b in zip(expected, got):
        torch.testing.assert_close(b, a)
    torch.testing.assert_close(x2, x1)  # the input written once, as eager writes it


def test_the_default_pipeline_cancels_the_stack_between_two_fused_layers():
    """A fused relu over the pieces of a fused bmm reads them in order, so its stack is the
    bmm's result itself: merge_unbind_stack_aten removes it (upstream's fusions keep the
    engine's member order and leave it)."""

    class TwoLayers(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.ModuleList(nn.Linear(8, 8) for _ in range(6))

        def forward(self, x):
            return [torch.relu(lin(x[i])) for i, lin in enumerate(self.a)]

    model, x = TwoLayers(), torch.randn(6, 4, 8)
    e = run(forward_graph(model, (x,)), post_grad_pipeline())
    passes = [s.pass_name for s in e.trace.steps]
    assert passes.count("batch_linear_post_grad") == 1 and passes.count("batch_aten_relu") == 1
    assert "unbind_stack_aten_pass" in passes
    relu = next(n for n in e.gm.graph.nodes if n.target is aten.relu.default)
    assert relu.args[0].target is aten.baddbmm.default  # no stack left between them
    same_as_eager(model, (x,), e)


# ------------------------------------------------------------------ split / cat


def test_normalize_split_aten_reads_uneven_sections_from_the_values():
    model, inputs, g = sample_forward("post_grad_uneven_split")
    e = run(g, post_grad_pattern_pass_pipeline("normalization_aten_pass"))
    split = next(n for n in e.gm.graph.nodes if n.target is aten.split_with_sizes.default)
    assert split.args[1] == [4, 4, 4, 4, 2] and split.kwargs == {"dim": 1}
    same_as_eager(model, inputs, e)


def post_grad_pattern_pass_pipeline(name: str, **opts) -> Pipeline:
    return Pipeline([post_grad_pattern_pass(name, opts)])


def test_an_already_normal_node_is_left_alone():
    g = hand_graph(lambda x: aten.cat.default([x, x], -1), torch.randn(2, 3))
    cat = next(n for n in g.gm.graph.nodes if n.target is aten.cat.default)
    assert why_not(REGISTRY["normalize_cat_aten"], cat) is None  # cat(.., -1): rewritten as cat(.., dim=1)
    cat.args, cat.kwargs = (cat.args[0],), {"dim": 1}
    assert "already normal" in str(why_not(REGISTRY["normalize_cat_aten"], cat))


def test_merge_unbind_stack_aten_checks_the_unsqueeze_dim_and_the_whole_dim():
    def wrong_dim(p):
        return aten.cat.default([aten.unsqueeze.default(aten.select.int(p, 0, i), 1) for i in range(3)], 0)

    def scattered(p):
        return aten.cat.default([aten.unsqueeze.default(aten.select.int(p, 0, i), 0) for i in (0, 1, 3)], 0)

    def every_other(p):
        return aten.cat.default([aten.unsqueeze.default(aten.select.int(p, 0, i), 0) for i in (1, 3, 5)], 0)

    def whole(p):
        return aten.cat.default([aten.unsqueeze.default(aten.select.int(p, 0, i), 0) for i in range(4)], 0)

    pattern = REGISTRY["merge_unbind_stack_aten"]
    for fn, x, why in (
        (wrong_dim, torch.randn(3, 4), "unsqueeze dim 1"),
        (scattered, torch.randn(4, 5), "not evenly spaced"),
    ):
        g = hand_graph(fn, x)
        cat = next(n for n in g.gm.graph.nodes if n.target is aten.cat.default)
        assert why in str(pattern.match(cat))
    g = hand_graph(whole, torch.randn(4, 5))  # the cat is the graph output: returning p itself would alias it
    cat = next(n for n in g.gm.graph.nodes if n.target is aten.cat.default)
    assert "would overlap input 0" in str(pattern.match(cat))
    g = hand_graph(lambda p: aten.relu.default(whole(p)), torch.randn(4, 5))
    e = run(g, one("merge_unbind_stack_aten"))
    assert len(e.trace.steps) == 1 and len(e.gm.graph.nodes) == 3  # placeholder -> relu -> output
    x = torch.randn(7, 5)
    g = hand_graph(every_other, x)
    e = run(g, one("merge_unbind_stack_aten"))
    (sl,) = [n for n in e.gm.graph.nodes if n.target is aten.slice.Tensor]
    assert sl.args[1:] == (0, 1, 6, 2)
    torch.testing.assert_close(e.gm(x), every_other(x))


class SelectCat(nn.Module):
    """upstream's _TestSelectCat (test_split_cat_fx_aten_passes.py), smaller."""

    def forward(self, x, y):
        sel = [torch.ops.aten.select.int(x, 1, i) for i in range(6)]
        cat = torch.ops.aten.cat.default(sel, 1)
        cat1 = torch.ops.aten.cat.default(sel[:5], 1)
        cat2 = torch.ops.aten.cat.default([sel[0], sel[2], sel[4]], 1)
        cat3 = torch.ops.aten.cat.default([torch.ops.aten.select.int(y, 1, i) for i in range(5)], 1)
        return cat, cat1, cat2, cat3


class SelectCatUsed(SelectCat):
    """SelectCat whose cats are read by a relu, not returned: none is a graph output."""

    def forward(self, x, y):
        return tuple(torch.relu(c) for c in super().forward(x, y))


def test_select_cat_merges_only_every_row_in_order():
    model, inputs = SelectCatUsed(), (torch.randn(8, 6, 16), torch.randn(8, 6, 16))
    e = run(forward_graph(model, inputs), one("merge_select_cat_aten"))
    assert len(e.trace.steps) == 1  # cat (all six rows); not five rows, every other row, or five of y's six
    same_as_eager(model, inputs, e)


def test_select_cat_leaves_a_cat_returned_as_an_output_fresh():
    """Eager returns a fresh tensor; the merged cat would be a view of input x (upstream's
    rewrite does that: docs/parity.md)."""
    g = forward_graph(SelectCat(), (torch.randn(8, 6, 16), torch.randn(8, 6, 16)))
    e = run(g, one("merge_select_cat_aten"))
    assert not e.trace.steps
    cat = next(n for n in g.gm.graph.nodes if n.target is aten.cat.default)
    assert "would overlap input 0" in str(REGISTRY["merge_select_cat_aten"].match(cat))


class MoveViewAfterCat(nn.Module):
    """upstream's _TestMoveViewAferCat: seven (1, 8, 96) pieces viewed as (8, 96), cat on 1."""

    def forward(self, x):
        pieces = torch.ops.aten.split_with_sizes.default(x, [1] * 7)
        views = [torch.ops.aten.view.default(p, [8, 96]) for p in pieces]
        clone = torch.ops.aten.clone.default(views[0])
        cat = torch.ops.aten.cat.default(views, 1)
        return torch.cat([clone, torch.ops.aten.cat.default([clone, cat], 1)], 1)


class ReshapedPieces(nn.Module):
    """Three (2, 4) row pieces of x (6, 4) each reshaped to (4, 2), cat on dim 1: no
    reshape of x (nor of its transpose, which upstream writes) gives this (4, 6)."""

    def forward(self, x):
        return torch.cat([p.reshape(4, 2) for p in torch.split(x, 2, dim=0)], 1)


def test_move_view_after_cat_fires_only_where_one_reshape_is_the_same_tensor():
    model, inputs = MoveViewAfterCat(), (torch.randn(7, 8, 96),)
    e = run(forward_graph(model, inputs), one("move_view_after_cat"))
    assert len(e.trace.steps) == 1
    same_as_eager(model, inputs, e)
    g = forward_graph(ReshapedPieces(), (torch.randn(6, 4),))
    cat = next(n for n in g.gm.graph.nodes if n.target is aten.cat.default)
    assert "would reorder elements" in str(REGISTRY["move_view_after_cat"].match(cat))


class SplitCat(nn.Module):
    """upstream's _TestSplitCat: eight 32-column pieces of one split, cat back, plus a cat with z."""

    def forward(self, x, y, z):
        cat = torch.ops.aten.cat.default([x, y], 1)
        split = torch.ops.aten.split.Tensor(cat, 32, 1)
        cat_1 = torch.ops.aten.cat.default(list(split), 1)
        cat_2 = torch.ops.aten.cat.default([split[0], z], 1)
        return torch.ops.aten.cat.default([cat_1, cat_2], 1)


def test_split_cat_aten_replaces_a_whole_split_and_honours_the_threshold():
    model, inputs = SplitCat(), (torch.randn(16, 128), torch.randn(16, 128), torch.randn(16, 32))
    g = forward_graph(model, inputs)
    cat = next(n for n in g.gm.graph.nodes if n.target is aten.cat.default and len(n.args[0]) == 8)
    assert "fewer than threshold_to_cat=10" in str(REGISTRY["merge_split_cat_aten"].match(cat))
    e = run(g, post_grad_pattern_pass_pipeline("split_cat_aten_pass", threshold_to_cat=5))
    assert len(e.trace.steps) == 1
    same_as_eager(model, inputs, e)


# ------------------------------------------------------------------ decompose_mm, group_linear


@pytest.mark.parametrize("rows, fires", [(1, True), (4, False)])
def test_decompose_mm_uses_upstreams_cpu_thresholds(rows, fires):
    g = hand_graph(lambda a, b: aten.mm.default(a, b), torch.randn(rows, 16), torch.randn(16, 8))
    e = run(g, post_grad_pattern_pass_pipeline("decompose_mm_pass"))
    assert bool(e.trace.steps) == fires
    mm = [n for n in e.gm.graph.nodes if n.target is aten.mm.default]
    assert bool(mm) != fires
    if not fires:
        assert "M = 4 > cpu_max_first_dimension_decomposition = 1" in str(REGISTRY["decompose_mm"].match(mm[0]))


def test_decompose_mm_thresholds_are_the_pass_options():
    g = hand_graph(lambda a, b: aten.mm.default(a, b), torch.randn(4, 16), torch.randn(16, 8))
    e = run(g, post_grad_pattern_pass_pipeline("decompose_mm_pass", cpu_max_first_dimension_decomposition=4))
    assert len(e.trace.steps) == 1


def test_group_linear_says_why_it_cannot_run_here():
    g = hand_graph(lambda a, b: aten.mm.default(a, b), torch.randn(4, 16), torch.randn(16, 8))
    mm = next(n for n in g.gm.graph.nodes if n.target is aten.mm.default)
    reason = str(why_not(REGISTRY["group_linear"], mm))
    assert "fbgemm" in reason and "not installed" in reason


def test_post_grad_patterns_do_not_answer_for_pre_grad_nodes():
    c = capture(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), (torch.randn(2, 4),))
    linear = next(n for n in c.gm.graph.nodes if n.target is F.linear or "linear" in str(n.target))
    for name in ("batch_linear_post_grad", "batch_aten_relu", "normalize_cat_aten"):
        assert why_not(REGISTRY[name], linear) is not None
