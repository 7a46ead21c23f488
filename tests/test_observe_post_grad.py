"""Upstream's post-grad passes observed step by step (optimus_lens.inductor.observe_post): the
three upstream defects the post-grad samples hold are failing verified steps of the pass
that has them, and ours keep every output on the same graphs; Inductor's other post-grad
passes are steps too; ``optimus observe --stage post-grad`` and ``compare --stage
post-grad`` say so and exit 1."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from optimus_lens.cli import main
from optimus_lens.frontend.aten_capture import AtenGraph
from optimus_lens.frontend.run import optimize
from optimus_lens.inductor.observe_post import (
    check_post_grad_options,
    default_post_grad_options,
    observe_post_grad,
    observe_post_grad_graph,
)

aten = torch.ops.aten

#: sample -> (post_grad_fusion_options, the upstream pass whose step breaks the graph)
DEFECTS = {
    "post_grad_sub_alpha": ({"batch_aten_sub": {}}, "batch_aten_sub"),
    "post_grad_uneven_split": ({"normalization_aten_pass": {}}, "normalization_aten_pass"),
    "post_grad_mixed_dtype_mm": ({"batch_linear_post_grad": {}}, "batch_linear_post_grad"),
}


@pytest.fixture(scope="module", params=list(DEFECTS))
def defect(request):
    name = request.param
    options, culprit = DEFECTS[name]
    up = observe_post_grad(f"sample:{name}", options=options)
    ours = optimize(f"sample:{name}", stage="post-grad", verify="step")
    return name, culprit, up, ours


def test_upstream_defect_is_a_failing_verified_step_of_its_pass(defect):
    _, culprit, up, _ = defect
    (fw,) = up.trace.graphs
    first, _ = fw.failure_runs()[0]
    assert first.pass_name == culprit
    assert first.verify.ok is False and first.verify.checked in ("outputs", "raised")
    assert fw.final_verify.ok is False


def test_our_catalogue_has_none_of_them(defect):
    _, culprit, _, ours = defect
    (fw,) = ours.trace.graphs
    assert any(s.pass_name == culprit for s in fw.steps)  # ours fires on the same graph ...
    assert not fw.failed_steps() and fw.final_verify.ok  # ... and keeps its outputs


def test_the_uneven_split_is_rewritten_with_five_equal_sections_by_upstream():
    up = observe_post_grad("sample:post_grad_uneven_split", options={"normalization_aten_pass": {}})
    (fw,) = up.trace.graphs
    step = next(s for s in fw.steps if s.pattern == "normalize_split_default_aten")
    split = next(r for r in step.delta.upsert if r.target.endswith("split_with_sizes.default"))
    assert split.args[1] == [4, 4, 4, 4, 4]
    assert "split_with_sizes expects split_sizes to sum exactly to 18" in step.verify.message


def test_inductors_other_post_grad_passes_are_steps_with_what_they_erased():
    def f(x):
        return aten.relu.default(aten.slice.Tensor(x, 0, 0, 9223372036854775807))

    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    x = torch.randn(4, 8)
    gm = make_fx(f)(x)
    FakeTensorProp(gm, FakeTensorMode(allow_non_fake_inputs=True)).propagate(x)
    t = observe_post_grad_graph(AtenGraph("forward", gm, (x,), True), {})
    (step,) = t.steps
    assert (step.pass_name, step.erased) == ("remove_noop_ops", ["slice_1"])
    assert step.verify.ok and t.final_verify.ok


def test_options_are_checked_against_upstreams_registry():
    check_post_grad_options(default_post_grad_options())
    with pytest.raises(KeyError, match="batch_aten_subb"):
        check_post_grad_options({"batch_aten_subb": {}})
    with pytest.raises(TypeError):
        check_post_grad_options({"batch_aten_sub": 1})
    assert default_post_grad_options()["group_linear"] == {"require_fbgemm": True}
    assert "decompose_mm_pass" not in default_post_grad_options()  # off in our default too


def test_a_graph_records_to_json_with_its_name_and_steps(defect, tmp_path):
    from optimus_lens.core.trace import Trace

    _, _, up, _ = defect
    path = tmp_path / "up.json"
    up.trace.save(path)
    back = Trace.load(path)
    assert back.graph_names() == ["pre-grad", "forward"]
    assert [s.graph for s in back.graph_named("forward").steps] == ["forward"] * len(up.trace.graphs[0].steps)


def test_observe_cli_names_the_defect_and_exits_1(capsys):
    code = main(
        ["observe", "sample:post_grad_sub_alpha", "--stage", "post-grad", "--options", '{"batch_aten_sub": {}}']
    )
    out = capsys.readouterr().out
    assert code == 1
    assert "UPSTREAM DEFECT: forward step 1 (batch_aten_sub / BatchSubPostGradFusion)" in out


def test_observe_cli_refuses_an_unknown_post_grad_option(capsys):
    assert main(["observe", "sample:post_grad_sub_alpha", "--stage", "post-grad", "--options", '{"nope": {}}']) == 2
    assert "unknown upstream post-grad pass" in capsys.readouterr().err


def test_compare_post_grad_sets_the_same_groups_side_by_side(capsys):
    code = main(
        ["compare", "sample:post_grad_sub_alpha", "--stage", "post-grad", "--options", '{"batch_aten_sub": {}}']
    )
    out = capsys.readouterr().out
    assert code == 1  # upstream's defect
    assert "== forward graph (ATen) ==" in out
    assert "batch_aten_sub     1         1  yes" in out
    assert "UPSTREAM DEFECT" in out and "OUR DEFECT" not in out
