"""Watching PyTorch's own pre-grad passes (`optimus observe`, `optimus compare`, optimus/compare.py) on the
issue's held-in input: five LayerNorm(16) on split pieces, each `.view(-1)`, where upstream's
batch_layernorm breaks the view."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from optimus_lens.cli import main
from optimus_lens.core.trace import Trace
from optimus_lens.debug.compare import compare_model, comparison_text
from optimus_lens.inductor.observe import default_options, known_pre_grad_passes

REPO = Path(__file__).resolve().parent.parent

HELD_IN = textwrap.dedent("""
    import torch


    class SplitLayerNormView(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(16) for _ in range(5))

        def forward(self, x):
            return torch.cat([n(p).view(-1) for n, p in zip(self.norms, torch.split(x, 16, dim=1))])


    def build():
        torch.manual_seed(0)
        return SplitLayerNormView().eval(), (torch.randn(4, 80),)
""")


@pytest.fixture
def held_in(tmp_path, monkeypatch):
    (tmp_path / "held_in.py").write_text(HELD_IN)
    monkeypatch.chdir(tmp_path)
    return "held_in.py:build"


def test_observe_flags_upstreams_batch_layernorm_and_its_repro_fails_on_a_fresh_interpreter(held_in, tmp_path, capsys):
    assert main(["observe", held_in, "--options", '{"batch_layernorm": {}}', "--trace", "up.json"]) == 1
    out = capsys.readouterr().out
    assert "BatchLayernormFusion" in out
    assert "UPSTREAM DEFECT: step 1 (batch_layernorm / BatchLayernormFusion) fails verification" in out
    assert "view size is not compatible" in out
    t = Trace.load(tmp_path / "up.json")
    assert t.capture["upstream"] and t.failed_steps()[0].pass_name == "batch_layernorm"
    assert main(["diff", "up.json"]) == 0  # the failing step's code, by default
    assert "layer_norm" in capsys.readouterr().out
    assert main(["repro", "up.json", "-o", "repro.py"]) == 0
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO)}
    (tmp_path / "fresh").mkdir()
    os.replace(tmp_path / "repro.py", tmp_path / "fresh" / "repro.py")
    os.remove(tmp_path / "held_in.py")  # the model's code is gone
    r = subprocess.run(
        [sys.executable, "-P", "repro.py"], cwd=tmp_path / "fresh", capture_output=True, text=True, env=env, timeout=300
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "BatchLayernormFusion" in r.stdout and "view size is not compatible" in r.stdout


def test_observe_with_default_options_records_upstreams_fusions_each_verified(capsys):
    assert set(default_options()) <= set(known_pre_grad_passes())
    assert main(["observe", "sample:recsys_towers"]) == 0
    out = capsys.readouterr().out
    assert "PreGradBatchLinearFusion" in out and "BatchLayernormFusion" in out
    assert "nodes: 108 -> 80" in out and "verify: ok" in out and "DEFECT" not in out


def test_observe_rejects_bad_options_with_exit_2(capsys):
    assert main(["observe", "sample:teach_batch_relu", "--options", '{"batch_lay": {}}']) == 2
    assert "unknown upstream pre-grad pass(es) 'batch_lay'" in capsys.readouterr().err
    assert main(["observe", "sample:teach_batch_relu", "--options", "{not json"]) == 2
    assert "not JSON" in capsys.readouterr().err


def test_compare_puts_both_runs_side_by_side_and_flags_the_upstream_defect(held_in, capsys):
    c = compare_model(held_in, {"batch_layernorm": {}})
    (defect,) = c.upstream_defects
    assert defect.pass_name == "batch_layernorm" and defect.pattern == "BatchLayernormFusion"
    assert c.nodes[0] == 29
    ours, up = c.groups["batch_layernorm"]
    assert len(ours) == len(up) == 1 and len(up[0]) == 5
    assert "UPSTREAM DEFECT: upstream step 1 (batch_layernorm / BatchLayernormFusion)" in comparison_text(c)
    assert main(["compare", held_in, "--options", '{"batch_layernorm": {}}']) == 1


def test_compare_of_the_default_pipelines_shows_the_same_fused_groups_and_where_the_runs_differ():
    c = compare_model("sample:recsys_towers")
    assert c.nodes[0] == 108 and not c.upstream_defects and not c.ours_failed
    for name in ("batch_linear", "batch_layernorm", "batch_relu"):
        ours, up = c.groups[name]
        assert sorted(ours) == sorted(up) and ours  # the same groups of the same nodes
    assert {s.pass_name for s in c.only_ours} >= {"split_cat_cleanup"}
    assert {s.pass_name for s in c.only_upstream} >= {"unbind_stack_pass"}
    text = comparison_text(c)
    assert "batch_linear" in text and "only in upstream:" in text and "only in ours:" in text


def test_an_upstream_rule_that_raises_is_the_last_step_flagged_as_a_defect(held_in, monkeypatch, capsys):
    from torch._inductor.fx_passes import group_batch_fusion as gbf

    def broken_fuse(self, graph, subset):
        raise RuntimeError("rule failed")

    monkeypatch.setattr(gbf.BatchLayernormFusion, "fuse", broken_fuse)
    assert (
        main(
            ["observe", held_in, "--options", '{"normalization_pass": {}, "batch_layernorm": {}}', "--trace", "up.json"]
        )
        == 1
    )
    out = capsys.readouterr().out
    assert "UPSTREAM DEFECT" in out and "pass batch_layernorm (BatchLayernormFusion) at " in out
    assert "raised RuntimeError: rule failed" in out
    t = Trace.load("up.json")
    last = t.steps[-1]
    assert (last.pass_name, last.verify.checked) == ("batch_layernorm", "raised") and len(last.sites) == 5
    assert t.steps[0].pass_name == "normalization_pass" and t.steps[0].verify.ok  # what ran before is kept


def test_upstreams_unbind_stack_to_slices_crash_is_recorded_and_its_repro_raises_while_good_steps_pass():
    from optimus_lens.debug.repro import run_repro, step_spec
    from optimus_lens.inductor.observe import observe

    t = observe("sample:teach_split_stack").trace
    crash = t.steps[-1]
    assert crash.pass_name == "unbind_stack_to_slices_pass" and crash.verify.checked == "raised"
    assert "IndexError" in crash.verify.message and t.final_verify.ok is False
    out = []
    assert run_repro(t.before(crash.index).to_json(), step_spec(t, crash.index), out=out.append) == 1
    assert "raised IndexError" in out[0]
    # the sample's split/cat output is read (2 * a), not returned: upstream's simplify_split_cat is right here
    assert all(s.verify.ok for s in t.steps[:-1]), [(s.pattern, s.verify.message) for s in t.steps[:-1]]
    for s in t.steps[:-1]:  # upstream's pattern-pass steps replay one match each
        out = []
        want = 0
        assert run_repro(t.before(s.index).to_json(), step_spec(t, s.index), out=out.append) == want, out


def test_steps_that_fail_only_because_an_earlier_step_broke_the_graph_are_not_flagged_as_defects(held_in, capsys):
    """With upstream's default passes the held-in graph breaks at batch_layernorm and stays
    broken: the later split/cat step fails with the same error but is not a defect of its own."""
    assert main(["observe", held_in, "--trace", "up.json"]) == 1
    out = capsys.readouterr().out
    t = Trace.load("up.json")
    ((first, inherited),) = t.failure_runs()
    assert first.pattern == "BatchLayernormFusion" and inherited and all(s.index > first.index for s in inherited)
    assert out.count("UPSTREAM DEFECT") == 1
    assert f"the same way only because the graph is still broken from step {first.index}" in out
