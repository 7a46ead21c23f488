"""Finding the first failing step (optimus/bisect.py, `optimus bisect`): a binary search over replayed
steps checks O(log steps) graphs and lands on the step per-step verification names."""

import math

import torch

import optimus_lens.passes
from optimus_lens.cli import main
from optimus_lens.core.miss import Miss
from optimus_lens.core.pattern import Match, RewritePattern
from optimus_lens.core.pipeline import Pass, Pipeline
from optimus_lens.debug.bisect import bisect_trace, first_failing
from optimus_lens.frontend.run import optimize

RELUS = frozenset({torch.relu, torch.nn.functional.relu})


class ReluAsSigmoid(RewritePattern):
    """Deliberately wrong: replaces relu by sigmoid."""

    name = "relu_as_sigmoid_bisect"
    anchors = RELUS

    def match(self, node):
        return Match(node, [node]) if node.target in RELUS else Miss("not a relu")

    def rewrite(self, rw, m):
        with rw.inserting_before(m.anchor):
            new = rw.call(torch.sigmoid, m.anchor.args[0])
        rw.carry_meta(m.anchor, new)
        rw.replace_all_uses(m.anchor, new)
        rw.erase(m.anchor)


DEFAULT_PIPELINE = optimus_lens.passes.default_pipeline


def with_broken_pass(before: str = "split_cat_cleanup") -> Pipeline:
    """The default pipeline with the broken pass inserted before ``before``."""
    pipe = DEFAULT_PIPELINE()
    at = pipe.names().index(before)
    return Pipeline(pipe.passes[:at] + [Pass("broken", [ReluAsSigmoid()])] + pipe.passes[at:])


def test_bisect_finds_the_step_per_step_verification_finds_checking_log_steps_graphs():
    verified = optimize("sample:recsys_towers", verify="step", pipeline=with_broken_pass()).trace
    first = verified.failed_steps()[0]
    assert first.pass_name == "broken" and 1 < first.index < len(verified.steps)
    run = optimize("sample:recsys_towers", verify="off", pipeline=with_broken_pass())
    assert all(s.verify is None for s in run.trace.steps)
    b = bisect_trace(run.trace, run.captured.example_inputs)
    assert b.first_bad == first.index and not b.direct
    n = len(run.trace.steps)
    assert len(b.probes) <= 1 + math.ceil(math.log2(n)) == b.max_probes < n
    probed = dict((k, v.ok) for k, v in b.probes)
    assert probed[n] is False and probed[b.first_bad] is False and probed.get(b.first_bad - 1) is not False
    assert first_failing(verified).first_bad == first.index


def test_bisect_of_a_correct_run_checks_only_the_final_graph():
    run = optimize("sample:recsys_towers", verify="off")
    b = bisect_trace(run.trace, run.captured.example_inputs)
    assert b.first_bad is None and [k for k, _ in b.probes] == [len(run.trace.steps)]
    assert "matches" in b.message


def test_bisect_cli_reports_the_first_failing_step_and_exits_1(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(optimus_lens.passes, "default_pipeline", with_broken_pass)
    trace = tmp_path / "t.json"
    assert main(["bisect", "sample:recsys_towers", "--trace", str(trace)]) == 1
    out = capsys.readouterr().out
    assert "first failing step:" in out and "(broken / relu_as_sigmoid_bisect)" in out
    assert f"optimus repro {trace} --step" in out and "checked" in out
    assert main(["bisect", "sample:recsys_towers", "--verify", "step"]) == 1
    assert "each verified as it was applied" in capsys.readouterr().out
    monkeypatch.undo()
    assert main(["bisect", "sample:teach_batch_relu"]) == 0
    assert "the final graph matches the original" in capsys.readouterr().out
    assert main(["bisect", "sample:nope"]) == 2
