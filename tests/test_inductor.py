"""Running and observing PyTorch Inductor's own Optimus pre-grad passes (optimus/inductor.py)."""

from __future__ import annotations

from dataclasses import asdict

import pytest
import torch
import torch._inductor.config as inductor_config
from torch._dynamo.utils import counters
from torch._inductor import pattern_matcher as pm
from torch._inductor.fx_passes import group_batch_fusion as gbf
from torch.fx import Node

from optimus_lens import sample_models
from optimus_lens.core.record import snapshot_graph
from optimus_lens.frontend.capture import capture
from optimus_lens.inductor.observe import (
    UNRECORDED_PATTERN,
    UNSORTED_MESSAGE,
    fusions_per_pass,
    observe_upstream,
    run_upstream,
)
from optimus_lens.inductor.watch import OTHER_PASS, Application

TOWER_OPTIONS = {
    "normalization_pass": {},
    "batch_linear": {},
    "batch_layernorm": {},
    "batch_relu": {},
    "batch_tanh": {},
    "batch_sigmoid": {},
    "unbind_stack_pass": {},
    "split_cat_pass": {},
}
SPLIT_OPTIONS = {"normalization_pass": {}, "merge_splits_pass": {}, "split_cat_pass": {}}


@pytest.fixture(scope="module")
def towers():
    torch._dynamo.reset()
    return capture(*sample_models.get("recsys_towers"))


def unequal_multi_split(x):
    fs = torch.split(x, [10, 10, 12], dim=1)
    items = [*fs[0].split([4, 6], 1), *fs[1].split([6, 4], 1), *fs[2].split([4, 4, 4], 1)]
    return [torch.relu(s) for s in items]


def records(snap):
    return {name: asdict(r) for name, r in snap.nodes.items()}


def test_run_upstream_on_recsys_towers_gives_upstreams_counters_on_a_copy(towers):
    counters["inductor"]["caller_counter"] = 7
    before = len(towers.gm.graph.nodes)
    run = run_upstream(towers.gm, towers.example_inputs, TOWER_OPTIONS)
    rewrites = {k: v for k, v in run.counters.items() if not k.startswith(("scmerge_", "pattern_matcher_"))}
    assert rewrites == {
        "batch_linear": 2,
        "batch_relu": 2,
        "batch_layernorm": 1,
        "unbind_stack_pass": 6,
        "normalization_pass": 1,
    }
    assert (run.nodes_before, run.nodes_after) == (108, 80) == (before, len(run.gm.graph.nodes))
    assert len(towers.gm.graph.nodes) == before  # the captured graph is untouched
    assert counters["inductor"]["caller_counter"] == 7 and "batch_linear" not in counters["inductor"]
    assert inductor_config.pre_grad_fusion_options == {}
    assert run.seconds > 0
    out = run.gm(*towers.example_inputs)
    ref = towers.gm(*towers.example_inputs)
    torch.testing.assert_close(out, ref)
    counters["inductor"].pop("caller_counter")


def test_fusions_per_pass_credits_simplify_split_cat_to_split_cat_pass(towers):
    run = run_upstream(towers.gm, towers.example_inputs, TOWER_OPTIONS)
    # from counters alone, simplify_split_cat's bump of unbind_stack_pass cannot be told apart
    assert fusions_per_pass(run.counters) == {
        "batch_linear": 2,
        "batch_relu": 2,
        "batch_layernorm": 1,
        "unbind_stack_pass": 6,
        "normalization_pass": 1,
    }
    assert run.fusions == {
        "batch_linear": 2,
        "batch_relu": 2,
        "batch_layernorm": 1,
        "unbind_stack_pass": 5,
        "split_cat_pass": 1,
        "normalization_pass": 1,
    }
    (simplify,) = [a for a in run.applications if a.pattern == "simplify_split_cat"]
    assert simplify.pass_name == "split_cat_pass" and simplify.counters["unbind_stack_pass"] == 1


def test_fusions_per_pass_drops_statistics_and_identity_rewrites():
    counts = {
        "pattern_matcher_count": 3,
        "pattern_matcher_nodes": 9,
        "scmerge_split_removed": 1,
        "normalization_pass": 2,
        "decompose_addmm": 1,
        "decompose_bmm": 2,
    }
    assert fusions_per_pass(counts) == {"normalization_pass": 2, "decompose_mm_pass": 3}
    apps = [
        Application(
            "normalization_pass", "normalize_stack_default", ["stack"], {"normalization_pass": 1}, True, True, 0.0
        ),
        Application(
            "normalization_pass", "normalize_split_default", ["split"], {"normalization_pass": 1}, True, False, 0.0
        ),
    ]
    assert fusions_per_pass(counts, apps) == {"normalization_pass": 1, "decompose_mm_pass": 3}


def test_normalization_of_an_already_normal_stack_counts_upstream_but_is_an_identity_rewrite():
    def fn(x):
        return torch.stack([x + 1, x + 2], dim=0)

    c = capture(fn, (torch.randn(3),))
    run = run_upstream(c.gm, c.example_inputs, {"normalization_pass": {}})
    assert run.counters["normalization_pass"] == 1
    (app,) = [a for a in run.applications if a.changed]
    assert app.identity and app.pattern == "normalize_stack_default"
    assert run.fusions == {}


def test_observed_steps_replay_to_upstreams_result_graph(towers):
    run = run_upstream(towers.gm, towers.example_inputs, TOWER_OPTIONS)
    trace = observe_upstream(towers.gm, towers.example_inputs, TOWER_OPTIONS, model_name="recsys_towers")
    assert [(s.pass_name, s.pattern) for s in trace.steps] == [
        (a.pass_name, a.pattern) for a in run.applications if a.changed
    ]
    assert [s.pattern for s in trace.steps][:3] == [
        "normalize_split_default",
        "PreGradBatchLinearFusion",
        "PreGradBatchLinearFusion",
    ]
    assert all(s.pass_name != OTHER_PASS for s in trace.steps)  # nothing escaped the recorder
    assert records(trace.graph_at(len(trace.steps))) == records(snapshot_graph(run.gm.graph))
    assert trace.nodes_before == 108 and trace.nodes_after == 80
    linear = trace.steps[1]
    assert len(linear.sites) == 8 and set(linear.erased) == set(linear.sites)
    assert set(linear.replaced) == set(linear.sites)
    assert trace.capture["counters"]["batch_linear"] == 2


def test_observed_merge_splits_steps_record_getitems_rewired_by_update_arg():
    c = capture(unequal_multi_split, (torch.randn(2, 32),))
    run = run_upstream(c.gm, c.example_inputs, SPLIT_OPTIONS)
    trace = observe_upstream(c.gm, c.example_inputs, SPLIT_OPTIONS)
    merges = trace.steps_of_pass("merge_splits_pass")
    assert len(merges) == run.fusions["merge_splits_pass"] == 3
    assert all(s.pattern != UNRECORDED_PATTERN for s in trace.steps)
    for s in merges:  # merge_splits renumbers existing getitems in place; the delta must carry them
        assert any(r.target == "_operator.getitem" and r.name not in s.created for r in s.delta.upsert)
    assert records(trace.graph_at(len(trace.steps))) == records(snapshot_graph(run.gm.graph))


def test_kwargs_rewritten_in_place_between_rules_become_a_pre_grad_passes_step():
    def fn(x, y):  # numpy-style kwargs: numpy_compat_normalization renames them in place
        return torch.stack([x, y], axis=1), torch.max(x, dim=1, keepdims=True)

    c = capture(fn, (torch.randn(3, 4), torch.randn(3, 4)))
    run = run_upstream(c.gm, c.example_inputs, {"normalization_pass": {}})
    trace = observe_upstream(c.gm, c.example_inputs, {"normalization_pass": {}})
    first = trace.steps[0]
    assert (first.pass_name, first.created, first.erased) == (OTHER_PASS, [], [])
    assert {r.name: r.kwargs for r in first.delta.upsert}["max_1"] == {"dim": 1, "keepdim": True}
    assert all(s.pattern != UNRECORDED_PATTERN for s in trace.steps)
    assert records(trace.graph_at(len(trace.steps))) == records(snapshot_graph(run.gm.graph))


def test_observe_verifies_sorted_steps_and_marks_unsorted_ones_not_checkable(towers):
    trace = observe_upstream(towers.gm, towers.example_inputs, TOWER_OPTIONS, verify=True)
    kinds = {(s.verify.ok, s.verify.checked) for s in trace.steps}
    assert kinds <= {(True, "outputs"), (None, "not-checkable")}
    unsorted = [s for s in trace.steps if s.verify.ok is None]
    assert unsorted and all(s.verify.message == UNSORTED_MESSAGE for s in unsorted)
    assert unsorted[0].pass_name == "batch_linear"
    assert trace.final_verify.ok


def _patch_points():
    classes, todo = [], [gbf.GroupBatchFusionBase]
    while todo:
        classes.append(todo.pop())
        todo.extend(classes[-1].__subclasses__())
    points = {(cls, "fuse"): cls.__dict__["fuse"] for cls in classes if "fuse" in cls.__dict__}
    for cls in (pm.GraphPatternEntry, pm.ReplacementPatternEntry, pm.LoweringPatternEntry):
        points[(cls, "apply")] = cls.__dict__["apply"]
    points[(pm.PatternMatcherPass, "apply")] = pm.PatternMatcherPass.__dict__["apply"]
    points[(Node, "_update_args_kwargs")] = Node.__dict__.get("_update_args_kwargs")
    return points


def test_everything_is_restored_when_an_upstream_rule_raises(towers, monkeypatch):
    def broken_fuse(self, graph, subset):
        raise RuntimeError("rule failed")

    monkeypatch.setattr(gbf.BatchLayernormFusion, "fuse", broken_fuse)
    before = _patch_points()
    counters["inductor"]["caller_counter"] = 3
    theirs = dict(counters["inductor"])  # the caller's counters (earlier compiles in this process left some)
    for call in (run_upstream, observe_upstream):
        with pytest.raises(RuntimeError, match="rule failed"):
            call(towers.gm, towers.example_inputs, TOWER_OPTIONS)
        assert _patch_points() == before
        assert gbf.BatchLayernormFusion.__dict__["fuse"] is broken_fuse
        assert "_update_args_kwargs" not in Node.__dict__
        assert inductor_config.pre_grad_fusion_options == {}
        assert dict(counters["inductor"]) == theirs
        assert not towers.gm._create_node_hooks and not towers.gm._replace_hooks
    counters["inductor"].pop("caller_counter")
    monkeypatch.undo()
    assert observe_upstream(towers.gm, towers.example_inputs, {"batch_relu": {}}).steps  # works again


def test_unknown_pass_name_is_a_key_error_listing_the_known_ones(towers):
    with pytest.raises(KeyError, match="batch_linear_lhs"):
        run_upstream(towers.gm, towers.example_inputs, {"batch_aten_relu": {}})
    with pytest.raises(TypeError):
        observe_upstream(towers.gm, towers.example_inputs, {"batch_relu": 1})


def test_with_keep_going_a_raising_rule_ends_the_trace_as_a_failed_step(towers, monkeypatch):
    def broken_fuse(self, graph, subset):
        raise RuntimeError("rule failed")

    monkeypatch.setattr(gbf.BatchLayernormFusion, "fuse", broken_fuse)
    before = _patch_points()
    trace = observe_upstream(towers.gm, towers.example_inputs, TOWER_OPTIONS, verify=True, keep_going=True)
    last = trace.steps[-1]
    assert (last.pass_name, last.pattern, len(last.sites)) == ("batch_layernorm", "BatchLayernormFusion", 8)
    assert (last.verify.ok, last.verify.checked) == (False, "raised") and "rule failed" in last.verify.message
    assert trace.final_verify == last.verify and trace.failed_steps() == [last]
    assert [s.pass_name for s in trace.steps[:-1]] == ["normalization_pass", "batch_linear", "batch_linear"]
    assert _patch_points() == before and inductor_config.pre_grad_fusion_options == {}
