"""Fuzz: every pass keeps random models' outputs (and gradients, in fp32) equal to eager.

Models come from optimus_lens.sample_models.random_models: parallel branches of linear / layer norm /
pointwise ops over pieces of a split, joined by cat / stack / unbind plumbing, in fp32,
bf16 and fp16, with transposed or sliced inputs, view / as_strided consumers of the
fused and cleaned-up values, and dynamic-shape captures; a step fails on other output
strides and on a rollback too. CI runs a bounded number of examples; benchmarks/fuzz.py runs thousands.
"""

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import HealthCheck, given, settings

from optimus_lens.frontend.run import optimize
from optimus_lens.sample_models.random_models import (
    CONSUMERS,
    INPUT_LAYOUTS,
    JOINS,
    OPS,
    RandomSpec,
    build,
    dtype_supported,
)

DTYPES = [d for d in ("float32", "bfloat16", "float16") if dtype_supported(d)]


@st.composite
def specs(draw):
    n = draw(st.integers(2, 8))
    common_w = draw(st.sampled_from([4, 8, 16]))
    common = draw(st.lists(st.sampled_from(OPS), min_size=1, max_size=4))
    widths, chains = [], []
    for _ in range(n):
        if draw(st.booleans()) or draw(st.booleans()):  # 3 in 4 branches share width and chain
            widths.append(common_w)
            chains.append(list(common))
        else:
            widths.append(draw(st.sampled_from([3, 4, 8, 16])))
            chains.append(draw(st.lists(st.sampled_from(OPS), min_size=1, max_size=4)))
    spec = RandomSpec(
        widths,
        chains,
        draw(st.sampled_from(JOINS)),
        draw(st.sampled_from([1, -1])),
        draw(st.sampled_from([1, 2, 4])),
        draw(st.sampled_from(DTYPES)),
        draw(st.integers(0, 2**16)),
    )
    spec.input_layout = draw(st.sampled_from(INPUT_LAYOUTS))
    spec.consumer = draw(st.sampled_from(CONSUMERS))
    spec.dynamic = draw(st.integers(0, 6)) == 0
    return spec


def check_spec(spec: RandomSpec) -> None:
    model, inputs = build(spec)
    trace = optimize(model, inputs, verify="step", grads=spec.dtype == "float32", dynamic=spec.dynamic).trace
    failed = trace.failed_steps()
    assert not failed, [(s.index, s.pattern, s.error or (s.verify.message, s.verify.max_abs_err)) for s in failed]
    assert trace.final_verify.ok, trace.final_verify


# fixed examples (derandomize): the suite stays deterministic, benchmarks/fuzz.py explores
@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(specs())
def test_every_step_on_random_models_matches_eager_outputs_and_gradients(spec):
    check_spec(spec)


def test_a_detached_branch_whose_gradient_becomes_zero_instead_of_none_still_verifies():
    """Found by benchmarks/fuzz.py (seed 1): fused detached branches leave a zero gradient
    where the original has none; the values agree, so this is not a failure."""
    lin = ["linear", "sigmoid", "clamp_kw", "detach"]
    check_spec(
        RandomSpec(
            [16] * 8,
            [lin, lin, ["clamp_pos", "linear"], lin, lin, lin, lin, lin],
            "stack_unbind_cat",
            1,
            2,
            "float32",
            169983466,
        )
    )


# Found by benchmarks/fuzz.py (seed 100): a batch_detach of non-dense split aliases read by as_strided
# (now refused in the key), an unbind_cat_to_view whose replaced cat fed a pointwise chain into a
# view (downstream example values were left stale; now refreshed), transposed inputs through
# fusions into views and outputs, and a dynamic-shape capture whose second-shape check drew
# contiguous inputs for a graph captured on a transposed one. Seeds 300 and 400: eval-mode
# dropout returns its input itself in eager mode, but its FakeTensor is fresh and contiguous,
# so as_strided on a dropout (or a detach of one) of a split piece read other elements after
# fusion; example values now carry eager strides (optimus_lens.core.strides.eager_strides).
FOUND = [
    RandomSpec(
        widths=[16, 3, 16, 16, 16, 4, 16, 16],
        chains=[
            ["dropout", "detach", "detach"],
            ["layer_norm_noaffine"],
            ["dropout", "detach", "detach"],
            ["dropout", "detach", "detach"],
            ["dropout", "detach", "detach"],
            ["clamp_kw", "layer_norm_noaffine"],
            ["dropout", "detach", "detach"],
            ["dropout", "detach", "detach"],
        ],
        join="stack",
        split_dim=1,
        batch=4,
        dtype="float16",
        seed=67038161,
        input_layout="contiguous",
        consumer="as_strided",
        dynamic=False,
    ),
    RandomSpec(
        widths=[16, 16, 16, 16, 16, 16],
        chains=[["dropout"], ["dropout"], ["dropout"], ["dropout"], ["dropout"], ["dropout"]],
        join="split_again_cat",
        split_dim=1,
        batch=4,
        dtype="float32",
        seed=1479256695,
        input_layout="contiguous",
        consumer="as_strided",
        dynamic=False,
    ),
    RandomSpec(
        widths=[16, 16, 16, 16, 16, 16],
        chains=[["detach"], ["detach"], ["detach"], ["detach"], ["detach"], ["detach"]],
        join="cat_permuted",
        split_dim=-1,
        batch=4,
        dtype="float16",
        seed=1356180125,
        input_layout="contiguous",
        consumer="as_strided",
        dynamic=False,
    ),
    RandomSpec(
        widths=[4, 4, 4, 4, 4],
        chains=[
            ["clamp_pos", "dropout", "sigmoid", "detach"],
            ["clamp_pos", "dropout", "sigmoid", "detach"],
            ["clamp_pos", "dropout", "sigmoid", "detach"],
            ["clamp_pos", "dropout", "sigmoid", "detach"],
            ["clamp_pos", "dropout", "sigmoid", "detach"],
        ],
        join="stack_unbind_cat",
        split_dim=1,
        batch=2,
        dtype="float32",
        seed=823078943,
        input_layout="transposed",
        consumer="view",
        dynamic=False,
    ),
    RandomSpec(
        widths=[4, 4, 4, 4, 4, 4, 4],
        chains=[
            ["clamp_kw", "dropout", "detach", "clamp_kw"],
            ["clamp_kw", "dropout", "detach", "clamp_kw"],
            ["clamp_kw", "dropout", "detach", "clamp_kw"],
            ["clamp_kw", "dropout", "detach", "clamp_kw"],
            ["clamp_kw", "dropout", "detach", "clamp_kw"],
            ["clamp_kw", "dropout", "detach", "clamp_kw"],
            ["clamp_kw", "dropout", "detach", "clamp_kw"],
        ],
        join="split_again_cat",
        split_dim=1,
        batch=4,
        dtype="float16",
        seed=616809142,
        input_layout="transposed",
        consumer="view",
        dynamic=False,
    ),
    RandomSpec(
        widths=[8, 8, 8, 8, 8, 8, 8, 8],
        chains=[
            ["clamp_kw", "dropout", "relu"],
            ["clamp_kw", "dropout", "relu"],
            ["clamp_kw", "dropout", "relu"],
            ["clamp_kw", "dropout", "relu"],
            ["clamp_kw", "dropout", "relu"],
            ["clamp_kw", "dropout", "relu"],
            ["clamp_kw", "dropout", "relu"],
            ["clamp_kw", "dropout", "relu"],
        ],
        join="split_again_cat",
        split_dim=-1,
        batch=2,
        dtype="float16",
        seed=2028493610,
        input_layout="transposed",
        consumer="none",
        dynamic=False,
    ),
    RandomSpec(
        widths=[16, 16, 16, 16, 16, 16, 4, 16],
        chains=[
            ["relu", "dropout"],
            ["relu", "dropout"],
            ["relu", "dropout"],
            ["relu", "dropout"],
            ["relu", "dropout"],
            ["relu", "dropout"],
            ["layer_norm_noaffine", "clamp_kw"],
            ["relu", "dropout"],
        ],
        join="stack_unbind_cat",
        split_dim=-1,
        batch=2,
        dtype="bfloat16",
        seed=935692110,
        input_layout="transposed",
        consumer="as_strided",
        dynamic=True,
    ),
]


@pytest.mark.parametrize("spec", FOUND, ids=[f"{s.join}-{s.input_layout}-{s.consumer}" for s in FOUND])
def test_layout_cases_found_by_the_fuzzer_keep_values_and_strides(spec):
    check_spec(spec)


# ---------------------------------------------------------------- against eager, with the hazard classes

import oracle  # noqa: E402 - tests/oracle.py: eager against the rewritten program, not our verification

from optimus_lens import RunOptions, run_pipeline  # noqa: E402
from optimus_lens.sample_models.random_models import HAZARDS  # noqa: E402


def rewrite(gm, example_inputs) -> int:
    """The default pipeline over one Dynamo graph with verification off, as inside torch.compile."""
    return len(run_pipeline(gm, example_inputs, None, RunOptions(verify="off")).steps)


def eager_difference(spec: RandomSpec) -> str | None:
    why, _ = oracle.differs(lambda: build(spec), rewrite, spec.grads)
    return why


@st.composite
def hazard_specs(draw, classes: tuple[str, ...]):
    """A random model with at most one hazard class of ``classes`` ("none": a plain model)."""
    spec = draw(specs())
    hazard = draw(st.sampled_from(("none", *classes)))
    if hazard != "none":
        spec.hazards = [hazard]
        spec.hazard_at = draw(st.integers(1, len(spec.widths) - 1))
        spec.flavour = draw(st.integers(0, 1))
        spec.dynamic = False
        if hazard == "autocast_region":
            spec.dtype = "float32"
    return spec


def test_every_hazard_class_puts_its_construct_in_the_captured_graph():
    from optimus_lens.frontend.capture import capture

    seen = {}
    for h in HAZARDS:
        spec = RandomSpec([4, 4, 4], [["linear"]] * 3, hazards=[h], hazard_at=1, dtype="float32", seed=3)
        model, inputs = build(spec)
        with torch.enable_grad():
            gm = capture(model, inputs).gm
        seen[h] = {str(n.target) for n in gm.graph.nodes}
    assert "optimus_fuzz.scale" in " ".join(seen["custom_op_write"])
    assert "aten.mul_.Scalar" in " ".join(seen["aten_inplace"])
    assert "<built-in function getattr>" in seen["attr_alias"] or any("getattr" in t for t in seen["attr_alias"])
    assert any("atleast_2d" in t for t in seen["identity_alias"])
    assert any("as_strided" in t for t in seen["as_strided_offset"])
    assert (
        sum(
            n.op == "placeholder"
            for n in capture(*build(RandomSpec([4, 4], [["relu"]] * 2, hazards=["overlapping_inputs"]))).gm.graph.nodes
        )
        == 2
    )


class Clones(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x).clone()


def test_the_oracle_tells_a_wrong_rewrite_from_a_right_one():
    spec = RandomSpec([4, 4, 4], [["relu"]] * 3, join="cat", seed=5)

    def relu_as_sigmoid(gm, example_inputs):
        for n in gm.graph.nodes:
            if n.target in (torch.relu, torch.nn.functional.relu):
                n.target = torch.sigmoid
                n.kwargs = {}
        gm.recompile()
        return 1

    def drops_the_clone(gm, example_inputs):  # same values, but the output now is the relu's input
        out = next(n for n in gm.graph.nodes if n.op == "output")
        x = next(n for n in gm.graph.nodes if n.op == "placeholder")
        relu = next(n for n in gm.graph.nodes if n.target is torch.relu)
        relu.target = torch.relu_
        out.args = ((relu,),)
        gm.graph.eliminate_dead_code()
        gm.recompile()
        assert x in relu.all_input_nodes
        return 1

    assert oracle.differs(lambda: build(spec), lambda gm, ex: 0)[0] is None
    assert oracle.differs(lambda: build(spec), relu_as_sigmoid)[0].startswith("output 0: max abs diff")
    clones = lambda: (Clones(), (torch.randn(5),))  # noqa: E731
    why = oracle.differs(clones, drops_the_clone)[0]
    assert why.startswith("output aliasing differs"), why


#: hazard classes whose random models all match eager today: a class joins when benchmarks/fuzz.py
#: --per-class (benchmarks/RESULTS.md) finds nothing in it (the FOUND_FAILING case of the class then
#: passes: strict xfail says so). mixed_dtype: nothing in 90 models (seeds 2 and 5); its one failure
#: of seed 1 was float32 rounding cast to float64, which the oracle now holds to float32's tolerance
PASSING_NOW: tuple[str, ...] = (
    "mixed_dtype",
    "custom_op_write",
    "aten_inplace",
    "attr_alias",
    "identity_alias",
    "overlapping_inputs",
    "grad_region",
    "autocast_region",
    "output_is_input",
    "as_strided_offset",
    "zero_dim",
)


@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(hazard_specs(PASSING_NOW))
def test_random_models_of_the_classes_that_pass_now_compute_what_eager_computes(spec):
    """Eager against the rewritten program under a plain Dynamo backend (tests/oracle.py, not
    our verification). Fixed examples (derandomize): the suite stays deterministic, the
    exploration is benchmarks/fuzz.py's."""
    assert eager_difference(spec) is None, spec


#: the minimal failing model each class had before effects were read from the ops' schemas
#: (benchmarks/fuzz.py --per-class 60 --seed 1 --shrink), each failing only with its hazard except
#: "none": cat(split(x)) of eval-mode dropouts becomes x. Each matches eager now.
FOUND_FAILING = [
    pytest.param(
        RandomSpec(
            widths=[4, 4, 4, 4, 4],
            chains=[["dropout"], ["dropout"], ["dropout"], ["dropout"], ["dropout"]],
            join="cat",
            split_dim=1,
            batch=1,
            dtype="float16",
            seed=1659422620,
            input_layout="contiguous",
            consumer="none",
            dynamic=False,
            hazards=[],
            hazard_at=1,
            flavour=0,
        ),
        id="none",
    ),  # output aliasing differs: eager [((), ())], rewritten [((0,), ())]
    pytest.param(
        RandomSpec(
            widths=[8, 8, 8, 8, 8],
            chains=[["linear"], ["linear"], ["linear"], ["linear"], ["linear"]],
            join="cat",
            split_dim=1,
            batch=1,
            dtype="float32",
            seed=860075941,
            input_layout="contiguous",
            consumer="none",
            dynamic=False,
            hazards=["custom_op_write"],
            hazard_at=4,
            flavour=1,
        ),
        id="custom_op_write",
    ),  # output 0: max abs diff 0.816
    pytest.param(
        RandomSpec(
            widths=[8, 8, 8, 8, 8],
            chains=[["clamp_kw"], ["clamp_kw"], ["clamp_kw"], ["clamp_kw"], ["clamp_kw"]],
            join="cat",
            split_dim=1,
            batch=1,
            dtype="bfloat16",
            seed=492154002,
            input_layout="contiguous",
            consumer="none",
            dynamic=False,
            hazards=["aten_inplace"],
            hazard_at=4,
            flavour=0,
        ),
        id="aten_inplace",
    ),  # output 0: max abs diff 0.0311
    pytest.param(
        RandomSpec(
            widths=[8, 8, 8, 8, 8],
            chains=[["clamp_pos"], ["clamp_pos"], ["clamp_pos"], ["clamp_pos"], ["clamp_pos"]],
            join="cat",
            split_dim=-1,
            batch=1,
            dtype="float16",
            seed=921653113,
            input_layout="contiguous",
            consumer="none",
            dynamic=False,
            hazards=["attr_alias"],
            hazard_at=3,
            flavour=0,
        ),
        id="attr_alias",
    ),  # output 0: max abs diff 0.197
    pytest.param(
        RandomSpec(
            widths=[16, 16, 16, 16, 16],
            chains=[["sigmoid"], ["sigmoid"], ["sigmoid"], ["sigmoid"], ["sigmoid"]],
            join="cat",
            split_dim=-1,
            batch=1,
            dtype="float16",
            seed=869503968,
            input_layout="contiguous",
            consumer="none",
            dynamic=False,
            hazards=["identity_alias"],
            hazard_at=1,
            flavour=0,
        ),
        id="identity_alias",
    ),  # output 0: max abs diff 0.15
    pytest.param(
        RandomSpec(
            widths=[8, 8, 8, 8, 8],
            chains=[["clamp_pos"], ["clamp_pos"], ["clamp_pos"], ["clamp_pos"], ["clamp_pos"]],
            join="cat",
            split_dim=1,
            batch=1,
            dtype="float32",
            seed=899879657,
            input_layout="contiguous",
            consumer="none",
            dynamic=False,
            hazards=["overlapping_inputs"],
            hazard_at=1,
            flavour=0,
        ),
        id="overlapping_inputs",
    ),  # output 0: max abs diff 0.151
    pytest.param(
        RandomSpec(
            widths=[4, 4, 3, 4],
            chains=[["mul_shared"], ["mul_shared"], ["detach"], ["mul_shared"]],
            join="cat",
            split_dim=1,
            batch=1,
            dtype="float32",
            seed=1960896470,
            input_layout="contiguous",
            consumer="none",
            dynamic=False,
            hazards=["grad_region"],
            hazard_at=2,
            flavour=1,
        ),
        id="grad_region",
    ),  # gradient 1: max abs diff 1.43
    pytest.param(
        RandomSpec(
            widths=[8, 8, 8, 8, 8],
            chains=[["linear"], ["linear"], ["linear"], ["linear"], ["relu", "linear"]],
            join="cat",
            split_dim=1,
            batch=1,
            dtype="float32",
            seed=759602742,
            input_layout="contiguous",
            consumer="none",
            dynamic=False,
            hazards=["autocast_region"],
            hazard_at=3,
            flavour=0,
        ),
        id="autocast_region",
    ),  # output 0: (1, 40) torch.bfloat16 instead of (1, 40) torch.float32
    pytest.param(
        RandomSpec(
            widths=[4, 4, 4],
            chains=[["layer_norm"], ["layer_norm"], ["layer_norm"]],
            join="cat",
            split_dim=1,
            batch=1,
            dtype="float16",
            seed=116098177,
            input_layout="contiguous",
            consumer="reshape",
            dynamic=False,
            hazards=["zero_dim"],
            hazard_at=1,
            flavour=1,
        ),
        id="zero_dim",
    ),  # output aliasing differs: eager [((), ()), ((), ())], rewritten [((), (1,)), ((), (0,))]
    pytest.param(
        RandomSpec(
            widths=[8, 8],
            chains=[["clamp_kw"], ["clamp_kw"]],
            join="cat",
            split_dim=1,
            batch=1,
            dtype="bfloat16",
            seed=1328472348,
            input_layout="contiguous",
            consumer="none",
            dynamic=False,
            hazards=["output_is_input"],
            hazard_at=1,
            flavour=0,
        ),
        id="output_is_input",
    ),  # output aliasing differs: eager [((), ()), ((), ())], rewritten [((), ()), ((0,), ())]
    pytest.param(
        RandomSpec(
            widths=[4, 4, 4],
            chains=[["softmax"], ["softmax"], ["softmax"]],
            join="cat",
            split_dim=1,
            batch=1,
            dtype="float16",
            seed=1531451685,
            input_layout="contiguous",
            consumer="none",
            dynamic=False,
            hazards=["as_strided_offset"],
            hazard_at=2,
            flavour=1,
        ),
        id="as_strided_offset",
    ),  # output 1: max abs diff 0.57
]


@pytest.mark.parametrize("spec", FOUND_FAILING)
def test_the_minimal_case_of_each_failing_class_matches_eager(spec):
    assert eager_difference(spec) is None


def test_the_oracle_holds_a_float64_value_computed_in_float32_to_float32s_tolerance_only():
    x = torch.rand(64) * 4 - 2
    ulp = torch.sigmoid(x).double()
    off = (torch.sigmoid(x) + torch.finfo(torch.float32).eps).double()  # a float32 kernel's other rounding
    assert oracle.close(ulp, off) is not None  # float64's own tolerance sees it
    assert oracle.close(ulp, off, torch.float32) is None
    assert oracle.close(ulp, ulp * 1.01, torch.float32).startswith("max abs diff")
    assert oracle.least_precise(torch.nn.Linear(2, 2).to(torch.bfloat16), (torch.randn(2),)) is torch.bfloat16
