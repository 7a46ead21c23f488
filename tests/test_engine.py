"""The engine end to end: steps recorded per pass, verification marks failures, errors name the pattern."""

import pytest
import torch
import torch.nn as nn

from optimus_lens.core.engine import Engine, PatternError, RunOptions
from optimus_lens.core.miss import Miss
from optimus_lens.core.pattern import Match, RewritePattern
from optimus_lens.core.pipeline import Pass, Pipeline
from optimus_lens.core.trace import Trace
from optimus_lens.frontend.capture import capture
from optimus_lens.frontend.run import optimize
from optimus_lens.passes import default_pipeline
from optimus_lens.passes.common import RELU, is_call


def test_recsys_towers_fuses_in_two_passes_with_every_step_verified_and_fewer_nodes():
    res = optimize("sample:recsys_towers", verify="step")
    t = res.trace
    passes = {s.pass_name for s in t.steps}
    assert {"batch_linear", "batch_relu"} <= passes
    assert all(s.verify.ok for s in t.steps), [s.verify for s in t.steps]
    assert t.nodes_after < t.nodes_before
    assert t.final_verify.ok


def test_batch_linear_step_records_sites_created_erased_and_provenance():
    t = optimize("sample:teach_batch_linear", passes=["batch_linear"]).trace
    (s,) = t.steps
    assert len(s.sites) == 6 and len(s.erased) == 6 and set(s.erased) == set(s.sites)
    created = {t.after(1).nodes[n].short_target for n in s.created}
    assert {"stack", "baddbmm", "unbind", "getitem"} <= created
    assert set(s.replaced) == set(s.sites)  # every linear has a successor
    assert all(v in s.created for v in s.replaced.values())


def test_trace_json_round_trip_keeps_every_step_and_graph():
    t = optimize("sample:recsys_towers").trace
    back = Trace.loads(t.dumps())
    assert back.to_json() == t.to_json()
    for k in range(len(t.steps) + 1):
        assert back.graph_at(k).signature() == t.graph_at(k).signature()


def test_disabled_pass_records_no_steps():
    t = optimize("sample:recsys_towers", passes=["batch_relu"]).trace
    assert {s.pass_name for s in t.steps} == {"batch_relu"}
    assert [p["name"] for p in t.passes if p["enabled"]] == ["batch_relu"]


def test_unknown_pass_name_is_a_key_error_naming_the_known_ones():
    with pytest.raises(KeyError, match="batch_linear"):
        default_pipeline().only(["no_such_pass"])


class ReluToSigmoid(RewritePattern):
    """A deliberately wrong rewrite: relu(x) -> sigmoid(x)."""

    name = "relu_to_sigmoid_wrong"
    anchors = frozenset(RELU[0]) | frozenset(RELU[1])

    def match(self, node):
        return Match(node, [node]) if is_call(node, *RELU) else Miss("not relu")

    def rewrite(self, rw, m: Match) -> None:
        (n,) = m.nodes
        with rw.inserting_before(n):
            s = rw.call(torch.sigmoid, n.args[0])
        rw.replace_all_uses(n, s)
        rw.erase(n)


class Raises(RewritePattern):
    name = "raises_on_relu"
    anchors = ReluToSigmoid.anchors

    def match(self, node):
        return Match(node, [node])

    def rewrite(self, graph, m):
        raise RuntimeError("boom")


def _relu_model():
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)).eval()
    return capture(m, (torch.randn(3, 4),))


def test_a_wrong_rewrite_is_marked_failed_on_its_step_with_its_error():
    c = _relu_model()
    t = Engine(c.gm, c.example_inputs, Pipeline([Pass("wrong", [ReluToSigmoid()])]), RunOptions(verify="step")).run()
    (s,) = t.steps
    assert s.verify.ok is False and s.verify.max_abs_err > 1e-3
    assert t.failed_steps() == [s]


def test_a_raising_pattern_stops_the_run_by_option_with_pass_pattern_and_site():
    c = _relu_model()
    with pytest.raises(PatternError) as e:
        Engine(
            c.gm, c.example_inputs, Pipeline([Pass("p", [Raises()])]), RunOptions(verify="off", on_error="stop")
        ).run()
    assert e.value.pattern == "raises_on_relu" and e.value.pass_name == "p" and e.value.site
    assert "boom" in str(e.value)


def test_the_engine_entry_is_published_at_the_top_of_the_package():
    import optimus_lens
    from optimus_lens.core.engine import RunOptions as Options
    from optimus_lens.frontend.run import optimize as optimize_spec
    from optimus_lens.frontend.run import run_pipeline

    assert optimus_lens.run_pipeline is run_pipeline and optimus_lens.RunOptions is Options
    assert optimus_lens.optimize is optimize_spec
    c = _relu_model()
    t = optimus_lens.run_pipeline(c.gm, c.example_inputs, options=optimus_lens.RunOptions(verify="end"))
    assert t.final_verify.ok


def test_verify_off_records_no_results_and_end_checks_once():
    off = optimize("sample:teach_batch_relu", verify="off").trace
    assert all(s.verify is None for s in off.steps) and off.final_verify is None
    end = optimize("sample:teach_batch_relu", verify="end").trace
    assert all(s.verify is None for s in end.steps) and end.final_verify.ok


def test_gradients_match_after_batch_fusion():
    t = optimize("sample:recsys_towers", verify="end", grads=True).trace
    assert t.final_verify.ok and t.final_verify.checked == "outputs+grads"


def test_nan_in_the_outputs_still_verifies_instead_of_being_not_checkable():
    class ZeroOverZero(nn.Module):
        def forward(self, x):
            return torch.cat([torch.relu(p) / 0.0 for p in torch.split(x, 2, dim=1)], dim=1)

    t = optimize(ZeroOverZero(), (torch.zeros(2, 10),), verify="step").trace
    assert t.steps and all(s.verify.ok for s in t.steps), [s.verify for s in t.steps]


class _WritesItsInput(nn.Module):
    def forward(self, x, *ys):
        x.add_(1.0)
        return torch.cat([torch.relu(y) for y in ys]) + x.sum()


def test_a_graph_that_writes_its_input_in_place_is_verified_on_copies():
    """Each verification run gets its own copies of the inputs: the original graph is not
    reported as non-deterministic because its second run saw the first run's write."""

    inputs = (torch.randn(4, 8), *[torch.randn(4, 8) for _ in range(5)])
    trace = optimize(_WritesItsInput(), inputs, verify="step").trace
    assert trace.steps and all(s.verify.ok for s in trace.steps), [s.verify for s in trace.steps]


def test_gradients_of_a_graph_that_writes_its_input_are_taken_through_a_copy():
    inputs = (torch.randn(4, 8), *[torch.randn(4, 8) for _ in range(5)])
    trace = optimize(_WritesItsInput(), inputs, verify="step", grads=True).trace
    assert trace.steps and all(s.verify.ok and s.verify.checked == "outputs+grads" for s in trace.steps)


def test_an_original_graph_that_raises_is_a_clear_error_not_a_traceback():
    from optimus_lens.core.verify import OriginalRunError, reference

    c = capture(_WritesItsInput(), (torch.randn(4, 8), *[torch.randn(4, 8) for _ in range(5)]))
    bad = (torch.randn(4, 8), torch.randn(4, 3), *[torch.randn(4, 8) for _ in range(4)])  # cat of unequal widths
    with pytest.raises(OriginalRunError, match="the original graph raised RuntimeError on the example inputs"):
        reference(c.gm, bad)
