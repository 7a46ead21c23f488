"""The horizontal batch-fusion catalogue (optimus/passes/batch.py), one pass at a time.

Each pattern runs alone (``Pipeline([Pass(name, [REGISTRY[name]])])``) with verification
after every step, gradients included, so a fusion that changes any output or gradient
fails here. Negative tests check what must NOT be grouped: mixed dtypes, different
constant arguments, members written in place, and members that depend on each other.
"""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import optimus_lens.passes  # noqa: F401  (registers the shipped patterns)
from optimus_lens import sample_models
from optimus_lens.core.engine import Engine, RunOptions
from optimus_lens.core.miss import is_miss
from optimus_lens.core.pattern import REGISTRY, SearchOptions
from optimus_lens.core.pipeline import Pass, Pipeline
from optimus_lens.core.record import module_path
from optimus_lens.frontend.capture import capture
from optimus_lens.passes import BATCH_PASSES
from optimus_lens.sample_models.teaching_batch import Conv1D

HAS_TRANSFORMERS = True
try:
    import transformers  # noqa: F401
except ImportError:
    HAS_TRANSFORMERS = False
needs_transformers = pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers not installed")


def run_pass(target, pattern: str, options: SearchOptions | None = None, grads: bool = True):
    """Capture ``target`` (a sample-model name or a (model, inputs) pair) and run the one
    pass ``pattern`` over it with per-step verification. Returns (trace, the captured
    nodes by name, final gm). Fused nodes are erased, which clears their args: read
    arguments from ``trace.graph_at(0)``, meta from the nodes."""
    model, inputs = sample_models.get(target) if isinstance(target, str) else target
    c = capture(model, inputs)
    original = {n.name: n for n in c.gm.graph.nodes}
    pipe = Pipeline([Pass(pattern, [REGISTRY[pattern]], options=options)])
    trace = Engine(c.gm, c.example_inputs, pipe, RunOptions(verify="step", grads=grads)).run()
    return trace, original, c.gm


def assert_every_step_ok(trace, grads: bool = True):
    for s in trace.steps:
        assert s.verify is not None and s.verify.ok is True, f"step {s.index} {s.pattern}: {s.verify}"
        if grads:
            assert s.verify.checked == "outputs+grads", f"step {s.index}: checked only {s.verify.checked}"


def assert_sites_independent(trace):
    """No site of a step is an ancestor of another site of the same step (in the graph
    the step was applied to, rebuilt from the trace)."""
    for s in trace.steps:
        snap = trace.before(s.index)
        sites = set(s.sites)
        for site in sites:
            seen, work = set(), list(snap.nodes[site].inputs)
            while work:
                n = work.pop()
                if n in seen:
                    continue
                seen.add(n)
                assert n not in sites, f"step {s.index}: {n} is an ancestor of {site}"
                work.extend(snap.nodes[n].inputs)


def targets_of(gm, fn) -> list:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is fn]


# ------------------------------------------------------------- teaching models

# model -> (pattern, group size of each step in order, fused op the graph ends with, with grads)
TEACHING = {
    "teach_batch_linear": ("batch_linear", [6], torch.baddbmm, True),
    "teach_batch_conv1d": ("batch_linear", [5], torch.baddbmm, True),
    "teach_batch_matmul": ("batch_linear", [5], torch.bmm, True),
    "teach_batch_linear_lhs": ("batch_linear_lhs", [5], F.linear, True),
    "teach_batch_linear_lhs_conv1d": ("batch_linear_lhs", [5], torch.addmm, True),
    "teach_batch_layernorm": ("batch_layernorm", [6], F.layer_norm, True),
    "teach_batch_layernorm_variants": ("batch_layernorm", [5, 5, 5, 5], F.layer_norm, True),
    "teach_batch_relu": ("batch_relu", [6], torch.relu, True),
    "teach_batch_tanh": ("batch_tanh", [6], torch.tanh, True),
    "teach_batch_sigmoid": ("batch_sigmoid", [6], torch.sigmoid, True),
    "teach_batch_detach": ("batch_detach", [6], torch.detach, False),  # detach outputs carry no gradient
    "teach_batch_nan_to_num": ("batch_nan_to_num", [6], torch.nan_to_num, True),
    "teach_batch_clamp": ("batch_clamp", [6], torch.clamp, True),
    "teach_batch_dropout": ("batch_dropout", [6], F.dropout, True),
}


@pytest.mark.parametrize("model", list(TEACHING))
def test_teaching_model_fuses_in_exact_groups_with_equal_outputs_and_grads(model):
    pattern, sizes, fused, grads = TEACHING[model]
    trace, original, gm = run_pass(model, pattern)
    assert [s.pattern for s in trace.steps] == [pattern] * len(sizes)
    assert [len(s.sites) for s in trace.steps] == sizes
    assert_every_step_ok(trace, grads)
    assert_sites_independent(trace)
    assert len(targets_of(gm, fused)) == len(sizes), gm.graph
    # every fused site is gone from the graph
    live = {n.name for n in gm.graph.nodes}
    assert not live & {site for s in trace.steps for site in s.sites}


def test_every_batch_pass_has_a_teaching_model_and_upstream_order():
    assert BATCH_PASSES == [
        "batch_linear_lhs",
        "batch_linear",
        "batch_layernorm",
        "batch_tanh",
        "batch_sigmoid",
        "batch_relu",
        "batch_detach",
        "batch_nan_to_num",
        "batch_clamp",
        "batch_dropout",
    ]
    assert {p for p, *_ in TEACHING.values()} == set(BATCH_PASSES)
    for name in BATCH_PASSES:
        p = REGISTRY[name]
        assert p.description and p.preconditions and p.upstream and p.source.startswith("optimus/passes/batch.py:")


def test_the_default_pipeline_runs_the_batch_fusions_in_their_registered_pipeline_order():
    """One source of truth: each shipped fusion's ``pipeline_order`` (upstream's registration
    order in group_batch_fusion.py) places it; patterns registered without one stay out of
    BATCH_PASSES (fusions beyond upstream's catalogue run after them, EXTRA_BATCH_PASSES)."""
    from optimus_lens.passes import EXTRA_BATCH_PASSES, default_pipeline

    shipped = sorted(
        (p for p in REGISTRY.values() if p.kind == "batch" and p.pipeline_order is not None),
        key=lambda p: p.pipeline_order,
    )
    names = default_pipeline().names()
    assert [p.name for p in shipped] == BATCH_PASSES
    assert [n for n in names if n.startswith("batch_")] == BATCH_PASSES + EXTRA_BATCH_PASSES
    from torch._inductor.fx_passes.group_batch_fusion import PRE_GRAD_FUSIONS

    assert BATCH_PASSES == [n for n in PRE_GRAD_FUSIONS if n in BATCH_PASSES]
    assert all(p.pipeline_order is None for p in REGISTRY.values() if p.kind == "batch" and p.name not in BATCH_PASSES)


def test_layernorm_variants_are_grouped_by_affine_parameters_and_normalized_shape():
    trace, original, _ = run_pass("teach_batch_layernorm_variants", "batch_layernorm")
    snap = trace.graph_at(0)
    groups = []
    for s in trace.steps:
        recs = [snap.nodes[n] for n in s.sites]
        groups.append({(tuple(r.args[1]), r.args[2] is None, r.args[3] is None) for r in recs})
    # each step holds one variant only, and together they cover all four
    assert all(len(g) == 1 for g in groups)
    assert {next(iter(g)) for g in groups} == {
        ((16,), True, True),
        ((16,), False, True),
        ((16,), True, False),
        ((4, 16), False, False),
    }


def test_clamp_positional_and_keyword_bounds_form_one_group():
    trace, original, gm = run_pass("teach_batch_clamp", "batch_clamp")
    (step,) = trace.steps
    snap = trace.graph_at(0)
    spellings = {(len(snap.nodes[n].args), tuple(snap.nodes[n].kwargs)) for n in step.sites}
    assert spellings == {(3, ()), (1, ("min", "max"))}
    (fused,) = targets_of(gm, torch.clamp)
    assert fused.kwargs == {"min": -1, "max": 1}


def test_nan_to_num_positional_keyword_and_method_spellings_form_one_group():
    trace, original, gm = run_pass("teach_batch_nan_to_num", "batch_nan_to_num")
    (step,) = trace.steps
    assert {trace.graph_at(0).nodes[n].op for n in step.sites} == {"call_function", "call_method"}
    (fused,) = targets_of(gm, torch.nan_to_num)
    assert fused.kwargs == {"posinf": 1.0, "neginf": -1.0}


def test_group_keys_name_the_op_dtype_and_device():
    for model, (pattern, *_rest) in TEACHING.items():
        c = capture(*sample_models.get(model))
        keys = [REGISTRY[pattern].key(n) for n in c.gm.graph.nodes]
        keys = [k for k in keys if not is_miss(k)]
        assert keys, model
        for k in keys:
            flat = repr(k)
            assert k[0] == pattern and "torch.float32" in flat and "'cpu'" in flat, (model, k)


# ------------------------------------------------------------------ realistic models


def test_transformer_block_fuses_q_k_v_into_one_linear():
    trace, original, gm = run_pass("transformer_block", "batch_linear_lhs")
    (step,) = trace.steps
    assert len(step.sites) == 3
    assert len({trace.graph_at(0).nodes[n].inputs[0] for n in step.sites}) == 1  # one shared input
    assert_every_step_ok(trace)
    (wide,) = [n for n in targets_of(gm, F.linear) if n.meta["example_value"].shape[-1] == 3 * 64]
    assert [u.target for u in wide.users] == [torch.split]


@needs_transformers
def test_bert_fuses_q_k_v_of_each_layer():
    trace, original, _ = run_pass("bert", "batch_linear_lhs")
    paths = [sorted(module_path(original[n])[0] for n in s.sites) for s in trace.steps]
    assert sorted(paths) == [
        [f"model.encoder.layer.{i}.attention.self.{m}" for m in ("key", "query", "value")] for i in (0, 1)
    ]
    assert_every_step_ok(trace)


@needs_transformers
def test_gpt2_addmm_projections_are_recognised_but_dependent_so_never_grouped():
    model, inputs = sample_models.get("gpt2")
    c = capture(model, inputs)
    addmms = [n for n in c.gm.graph.nodes if n.target is torch.addmm]
    assert len(addmms) == 8
    keys = [REGISTRY["batch_linear"].key(n) for n in addmms]
    assert not any(is_miss(k) for k in keys), keys
    # the same projection of layer 0 and layer 1 shares a key, but layer 1 depends on layer 0
    assert len(set(keys)) == 4
    for name in ("batch_linear", "batch_linear_lhs"):
        trace, _, _ = run_pass((model, inputs), name, options=SearchOptions(min_fuse_set_size=2))
        assert trace.steps == [], name


class OtherLinearForms(nn.Module):
    """Linear forms beyond the teaching models. Inputs (8, 80), (2, 4, 80), (2, 4, 16):

    * 5 ``p @ W_i`` on 3-D pieces (2, 4, 16) (batch_linear flattens to (n, 8, 16));
    * 5 ``torch.addmm(B_i, p_i, W_i)`` with a 2-D (8, 16) bias;
    * 5 ``torch.addmm(b_i, p_i, W_i, beta=0.5)``: not a plain linear, never fused;
    * 3 ``z @ V_j`` of widths 8, 24, 32 on ONE 3-D input z (batch_linear_lhs, matmul form).
    """

    def __init__(self):
        super().__init__()
        self.w = nn.ParameterList([nn.Parameter(torch.randn(16, 16) * 0.2) for _ in range(5)])
        self.b2 = nn.ParameterList([nn.Parameter(torch.randn(8, 16)) for _ in range(5)])
        self.b1 = nn.ParameterList([nn.Parameter(torch.randn(16)) for _ in range(5)])
        self.v = nn.ParameterList([nn.Parameter(torch.randn(16, n) * 0.2) for n in (8, 24, 32)])

    def forward(self, x, y, z):
        ps, qs = torch.split(x, 16, dim=1), torch.split(y, 16, dim=2)
        a = [q @ w for q, w in zip(qs, self.w)]
        b = [torch.addmm(bias, p, w) for bias, p, w in zip(self.b2, ps, self.w)]
        c = [torch.addmm(bias, p, w, beta=0.5) for bias, p, w in zip(self.b1, ps, self.w)]
        d = [z @ v for v in self.v]
        return (*a, *b, *c, *d)


def _other_linear_forms():
    torch.manual_seed(0)
    return OtherLinearForms(), (torch.randn(8, 80), torch.randn(2, 4, 80), torch.randn(2, 4, 16))


def test_batch_linear_fuses_3d_matmuls_and_2d_addmm_biases_but_not_scaled_addmm():
    trace, original, gm = run_pass(_other_linear_forms(), "batch_linear")
    snap = trace.graph_at(0)
    kinds = sorted(
        tuple(sorted({(snap.nodes[n].target, len(original[n].meta["example_value"].shape)) for n in s.sites}))
        for s in trace.steps
    )
    assert kinds == [(("torch.addmm", 2),), (("torch.matmul", 3),)] or kinds == [
        (("_operator.matmul", 3),),
        (("torch.addmm", 2),),
    ], kinds
    assert [len(s.sites) for s in trace.steps] == [5, 5]
    scaled = [n for n in original.values() if n.target is torch.addmm and n.kwargs.get("beta") == 0.5]
    assert len(scaled) == 5 and not {n.name for n in scaled} & {x for s in trace.steps for x in s.sites}
    assert "beta or alpha" in REGISTRY["batch_linear"].key(scaled[0])
    assert_every_step_ok(trace)


def test_batch_linear_lhs_fuses_matmuls_of_one_3d_input_into_one_matmul_and_split():
    trace, original, gm = run_pass(_other_linear_forms(), "batch_linear_lhs")
    (step,) = trace.steps
    assert [original[n].meta["example_value"].shape[-1] for n in step.sites] == [8, 24, 32]
    assert_every_step_ok(trace)
    (split,) = [n for n in gm.graph.nodes if n.target is torch.split and n.args[0].target is torch.matmul]
    assert split.args[1:] == ([8, 24, 32], 2)
    assert split.args[0].args[0].name == "l_z_" and split.args[0].args[1].target is torch.cat


# ------------------------------------------------------------- negative tests


class MixedDtypeLinears(nn.Module):
    """5 fp32 and 5 bf16 Linear(16,16) on split pieces of an fp32 and a bf16 input,
    each followed by a clamp; all 20 results are outputs, so the search meets fp32 and
    bf16 members from the same root. Inputs (8, 80) fp32 and bf16 -> 20 outputs (8, 16)."""

    def __init__(self):
        super().__init__()
        self.f32 = nn.ModuleList([nn.Linear(16, 16) for _ in range(5)])
        self.b16 = nn.ModuleList([nn.Linear(16, 16).to(torch.bfloat16) for _ in range(5)])

    def forward(self, x, y):
        a = [lin(p) for lin, p in zip(self.f32, torch.split(x, 16, dim=1))]
        b = [lin(p) for lin, p in zip(self.b16, torch.split(y, 16, dim=1))]
        outs = [t for pair in zip(a, b) for t in pair]
        return (*outs, *[torch.clamp(t, -1, 1) for t in outs])


def _mixed_dtype_model():
    torch.manual_seed(0)
    return MixedDtypeLinears(), (torch.randn(8, 80), torch.randn(8, 80).to(torch.bfloat16))


@pytest.mark.parametrize("pattern", ["batch_linear", "batch_clamp"])
def test_fp32_and_bf16_members_are_never_grouped_together(pattern):
    trace, original, _ = run_pass(_mixed_dtype_model(), pattern, options=SearchOptions(min_fuse_set_size=2))
    assert sorted(len(s.sites) for s in trace.steps) == [5, 5]
    for s in trace.steps:
        assert len({original[n].meta["example_value"].dtype for n in s.sites}) == 1
    assert_every_step_ok(trace)


class DifferentConstants(nn.Module):
    """Three groups of 5 members that differ only in constant arguments: clamp(-1, 1) /
    clamp(0, 1) / clamp(min=-1); nan_to_num posinf 1 / 2; dropout p 0.1 / 0.2 (eval).
    Input (8, 80) -> a tuple of outputs."""

    def forward(self, x):
        ps = torch.split(x, 16, dim=1)
        c1 = [torch.clamp(p, -1, 1) for p in ps]
        c2 = [torch.clamp(p, 0, 1) for p in ps]
        c3 = [torch.clamp(p, min=-1) for p in ps]
        n1 = [torch.nan_to_num(p, 0.0, 1.0) for p in ps]
        n2 = [torch.nan_to_num(p, 0.0, posinf=2.0) for p in ps]
        d1 = [F.dropout(p, 0.1, False) for p in ps]
        d2 = [F.dropout(p, p=0.2, training=False) for p in ps]
        return tuple(torch.cat(g, dim=1) for g in (c1, c2, c3, n1, n2, d1, d2))


@pytest.mark.parametrize("pattern,groups", [("batch_clamp", 3), ("batch_nan_to_num", 2), ("batch_dropout", 2)])
def test_members_with_different_constant_arguments_are_not_grouped(pattern, groups):
    torch.manual_seed(0)
    trace, original, _ = run_pass((DifferentConstants(), (torch.randn(8, 80) * 3,)), pattern)
    assert [len(s.sites) for s in trace.steps] == [5] * groups
    for s in trace.steps:  # all members of a step come from one list comprehension: one source line
        assert len({original[n].meta["stack_trace"].strip().splitlines()[-1] for n in s.sites}) == 1
    assert_every_step_ok(trace)


class TrainingDropout(nn.Module):
    """6 training-mode dropouts: default training=True, training=True by position and by keyword."""

    def forward(self, x):
        ps = torch.split(x, 16, dim=1)
        ys = [
            F.dropout(ps[0], 0.1),
            F.dropout(ps[1], 0.1, True),
            F.dropout(ps[2], p=0.1, training=True),
            F.dropout(ps[3], 0.1),
            F.dropout(ps[4], 0.1, True),
            F.dropout(ps[5], p=0.1, training=True),
        ]
        return torch.cat(ys, dim=1)


def test_training_mode_dropout_is_not_fused():
    trace, original, _ = run_pass((TrainingDropout(), (torch.randn(8, 96),)), "batch_dropout")
    assert trace.steps == []
    drops = [n for n in original.values() if n.target is F.dropout]
    assert len(drops) == 6
    assert all("training mode" in REGISTRY["batch_dropout"].key(n) for n in drops)
    assert trace.final_verify.ok is True


LHS_WIDTHS = (8, 16, 24, 8, 16, 8, 16, 24)


class Members(nn.Module):
    """8 members of one batch pattern's op, member i on its own input h_i = x_i + 0
    (batch_linear_lhs: every member on h_0), outputs concatenated along dim 1.

    ``mode="outputs"``: the outputs of members 0, 1, 2 are written in place, directly
    (``add_``), through a view (``view(-1).mul_``) and by ``F.relu(y, True)``.
    ``mode="input"``: h_0 is written in place after members 1..7 and before member 0.
    Inputs 8 x (8, 16) -> output (8, 128) (batch_linear_lhs: (8, 120)).
    """

    def __init__(self, pattern: str, mode: str):
        super().__init__()
        self.pattern, self.mode = pattern, mode
        self.lins = nn.ModuleList([nn.Linear(16, 16) for _ in range(8)])
        self.lhs = nn.ModuleList([nn.Linear(16, w) for w in LHS_WIDTHS])
        self.norms = nn.ModuleList([nn.LayerNorm(16) for _ in range(8)])

    def member(self, i, h):
        p = self.pattern
        if p == "batch_linear":
            return self.lins[i](h)
        if p == "batch_linear_lhs":
            return self.lhs[i](h)
        if p == "batch_layernorm":
            return self.norms[i](h)
        return {
            "batch_relu": lambda: torch.relu(h),
            "batch_tanh": lambda: torch.tanh(h),
            "batch_sigmoid": lambda: torch.sigmoid(h),
            "batch_detach": lambda: h.detach(),
            "batch_nan_to_num": lambda: torch.nan_to_num(h, 0.0, 1.0, -1.0),
            "batch_clamp": lambda: torch.clamp(h, -1, 1),
            "batch_dropout": lambda: F.dropout(h, 0.1, False),
        }[p]()

    def forward(self, *xs):
        hs = [x + 0 for x in xs]
        if self.pattern == "batch_linear_lhs":
            hs = [hs[0]] * 8
        if self.mode == "outputs":
            outs = [self.member(i, h) for i, h in enumerate(hs)]
            outs[0].add_(1)
            outs[1].view(-1).mul_(2)
            F.relu(outs[2], True)
        else:
            later = [self.member(i, h) for i, h in enumerate(hs) if i > 0]
            hs[0].mul_(2)
            outs = [self.member(0, hs[0]), *later]
        return torch.cat(outs, dim=1)


def _members(pattern, mode):
    torch.manual_seed(0)
    return Members(pattern, mode).eval(), tuple(torch.randn(8, 16) for _ in range(8))


#: the in-place methods Members calls (the test's own list of what its model writes)
WRITERS_IN_MEMBERS = {"add_", "mul_"}


def _written_members(snap) -> set[str]:
    """Names of the nodes written in place (walking up through ``view``) in a graph
    snapshot, found without the pattern helpers."""
    out = set()
    for r in snap.nodes.values():
        inplace = (r.op == "call_method" and r.target in WRITERS_IN_MEMBERS) or (
            r.target == "torch.nn.functional.relu" and len(r.args) > 1 and r.args[1] is True
        )
        if inplace:
            t = snap.nodes[r.inputs[0]]
            while t.op == "call_method" and t.target == "view":
                t = snap.nodes[t.inputs[0]]
            out.add(t.name)
    return out


# relu, tanh and sigmoid save their output for backward: writing into it in place makes
# the model itself fail to backpropagate, so only outputs are compared for them
NO_GRADS_WHEN_OUTPUT_WRITTEN = {"batch_detach", "batch_relu", "batch_tanh", "batch_sigmoid"}


@pytest.mark.parametrize("pattern", BATCH_PASSES)
def test_members_whose_outputs_are_written_in_place_are_not_fused(pattern):
    grads = pattern not in NO_GRADS_WHEN_OUTPUT_WRITTEN
    trace, original, _ = run_pass(_members(pattern, "outputs"), pattern, grads=grads)
    written = _written_members(trace.graph_at(0))
    assert len(written) == 3
    (step,) = trace.steps
    assert len(step.sites) == 5
    assert not written & set(step.sites)
    assert_every_step_ok(trace, grads=grads)


@pytest.mark.parametrize("pattern", [p for p in BATCH_PASSES if p != "batch_linear_lhs"])
def test_a_member_whose_input_is_written_in_place_is_not_fused(pattern):
    trace, original, _ = run_pass(_members(pattern, "input"), pattern, grads=pattern != "batch_detach")
    snap = trace.graph_at(0)
    (h0,) = _written_members(snap)
    (step,) = trace.steps
    assert len(step.sites) == 7
    assert all(h0 not in snap.nodes[s].inputs for s in step.sites)
    assert_every_step_ok(trace, grads=pattern != "batch_detach")


def test_linears_sharing_an_input_fuse_on_one_side_of_its_write_only():
    # members 1..7 read h_0 before h_0.mul_(2), member 0 after it: the seven fuse, member 0
    # keeps its own linear (its key carries the other write epoch); the earlier linears saved
    # h_0 for backward, so the model itself cannot backpropagate: outputs only
    trace, _, _ = run_pass(_members("batch_linear_lhs", "input"), "batch_linear_lhs", grads=False)
    (step,) = trace.steps
    snap = trace.graph_at(0)
    (h0,) = _written_members(snap)
    assert len(step.sites) == 7
    mul = next(n for n in snap.nodes.values() if n.target == "mul_")
    assert all(list(snap.nodes).index(s) < list(snap.nodes).index(mul.name) for s in step.sites)
    assert_every_step_ok(trace, grads=False)
    lins = [n for n in capture(*_members("batch_linear_lhs", "input")).gm.graph.nodes if n.target is F.linear]
    keys = [REGISTRY["batch_linear_lhs"].key(n) for n in lins]
    assert len({keys[0], keys[-1]}) == 2 and len(set(keys[1:])) == 2  # before and after the write


class Chain(nn.Module):
    """A chain of 6 same-shape members of one op (each feeds the next), plus 5 independent
    pairs on split pieces (a member feeding a second one). Input (8, 80)."""

    def __init__(self, pattern: str):
        super().__init__()
        self.pattern = pattern
        self.lins = nn.ModuleList([nn.Linear(16, 16) for _ in range(16)])
        self.norms = nn.ModuleList([nn.LayerNorm(16) for _ in range(16)])
        self.convs = nn.ModuleList([Conv1D(16, 16) for _ in range(16)])

    def op(self, i, h):
        return {
            "batch_linear": lambda: self.lins[i](h),
            "batch_layernorm": lambda: self.norms[i](h),
            "addmm": lambda: self.convs[i](h),
            "batch_relu": lambda: torch.relu(h),
            "batch_tanh": lambda: torch.tanh(h),
            "batch_sigmoid": lambda: torch.sigmoid(h),
            "batch_clamp": lambda: torch.clamp(h, -1, 1),
            "batch_nan_to_num": lambda: torch.nan_to_num(h, 0.0, 1.0, -1.0),
            "batch_dropout": lambda: F.dropout(h, 0.1, False),
            "batch_detach": lambda: h.detach(),
        }[self.pattern]()

    def forward(self, x):
        ps = torch.split(x, 16, dim=1)
        h = ps[0] * 1
        for i in range(6):
            h = self.op(i, h)
        two_layers = [self.op(6 + i, self.op(11 + i, p * 1)) for i, p in enumerate(ps)]
        return h, torch.cat(two_layers, dim=1)


CHAIN_PATTERNS = [
    "batch_linear",
    "batch_layernorm",
    "batch_relu",
    "batch_tanh",
    "batch_sigmoid",
    "batch_clamp",
    "batch_nan_to_num",
    "batch_dropout",
    "batch_detach",
]


@pytest.mark.parametrize("pattern", CHAIN_PATTERNS + ["addmm"])
def test_dependent_members_are_never_in_one_group(pattern):
    torch.manual_seed(0)
    name = "batch_linear" if pattern == "addmm" else pattern
    grads = pattern != "batch_detach"
    trace, original, _ = run_pass(
        (Chain(pattern).eval(), (torch.randn(8, 80),)), name, options=SearchOptions(min_fuse_set_size=2), grads=grads
    )
    # each layer of the 5 pairs fuses with one (independent) member of the chain; two
    # members of the chain, or the two members of a pair, never share a step
    assert [len(s.sites) for s in trace.steps] == [6, 6], [s.sites for s in trace.steps]
    assert_sites_independent(trace)
    assert_every_step_ok(trace, grads=grads)
    chain_head = [n for n in original.values() if n.op == "call_function" and n.target is operator.mul][0]
    snap = trace.graph_at(0)
    users = snap.users()
    chain, work = set(), [chain_head.name]
    while work:
        for u in users[work.pop()]:
            if snap.nodes[u].op != "output" and u not in chain:
                chain.add(u)
                work.append(u)
    assert len(chain) >= 6
    for s in trace.steps:
        assert len(chain & set(s.sites)) == 1, s.sites


def test_recsys_towers_fuse_layer_by_layer():
    trace, _, _ = run_pass("recsys_towers", "batch_linear")
    assert [len(s.sites) for s in trace.steps] == [8, 8]
    assert_sites_independent(trace)
    assert_every_step_ok(trace)


# --------------------------------------------------------------------------- anchors


@pytest.mark.parametrize(  # not the paper-scale industrial_recsys: its towers are recsys_towers' at 128 wide
    "name",
    [
        n
        for n in sample_models.names()
        if (HAS_TRANSFORMERS or sample_models.REGISTRY[n].kind != "realistic") and n != "industrial_recsys"
    ],
)
def test_only_nodes_with_an_anchor_target_get_a_group_key(name):
    """The engine keys only a pattern's anchors at the start of a pass: a node outside
    them with a key would silently never be fused. Checked before and after the pipeline."""
    from optimus_lens.frontend.run import run_pipeline

    keyed = [p for p in REGISTRY.values() if p.kind == "batch" and p.anchors]
    assert {p.name for p in keyed} >= set(BATCH_PASSES)

    def check(graph):
        for n in graph.nodes:
            for p in keyed:
                if not is_miss(p.key(n)):
                    assert n.target in p.anchors, f"{p.name} keys {n.format_node()} outside its anchors"

    model, inputs = sample_models.get(name)
    c = capture(model, inputs)
    check(c.gm.graph)
    run_pipeline(c.gm, c.example_inputs, options=RunOptions(verify="off"))
    check(c.gm.graph)
