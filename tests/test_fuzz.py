"""Fuzz: every pass keeps random models' outputs (and gradients, in fp32) equal to eager.

Models come from optimus_lens.sample_models.random_models: parallel branches of linear / layer norm /
pointwise ops over pieces of a split, joined by cat / stack / unbind plumbing, in fp32,
bf16 and fp16, with transposed or sliced inputs, view / as_strided consumers of the
fused and cleaned-up values, and dynamic-shape captures; a step fails on other output
strides and on a rollback too. CI runs a bounded number of examples; benchmarks/fuzz.py runs thousands.
"""

import hypothesis.strategies as st
import pytest
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


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
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
