"""One run, three graphs: ``optimus run --stage all --mode training`` records the pre-grad steps
and the forward and backward ATen graphs' post-grad steps in one trace, every step verified
against its own graph; the trace tools (show, diff, repro, inspect, report, bisect) pick a
graph with ``--graph``; ``why`` and ``bench`` take ``--stage``; old traces still load."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from optimus_lens.cli import main
from optimus_lens.core.trace import Trace

MODEL = "sample:post_grad_mixed_dtype_mm"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("run") / "t.json"
    code = main(["run", MODEL, "--stage", "all", "--mode", "training", "--verify", "step", "--trace", str(path)])
    return code, path, Trace.load(path)


def test_one_trace_holds_the_pre_grad_forward_and_backward_steps_each_verified(run):
    code, path, t = run
    assert code == 0
    assert t.graph_names() == ["pre-grad", "forward", "backward"]
    for g in t.traces():
        assert g.steps, f"{g.graph}: no steps"
        assert all(s.graph == g.graph for s in g.steps)
        assert all(s.verify is not None and s.verify.ok for s in g.steps)
        assert [s.index for s in g.steps] == list(range(1, len(g.steps) + 1))
    assert t.graph_named("pre-grad").steps[0].verify.checked == "outputs+grads"  # training: gradients too
    data = json.loads(path.read_text())
    assert data["graph"] == "pre-grad" and [g["graph"] for g in data["graphs"]] == ["forward", "backward"]
    assert all("graph" in s for g in data["graphs"] for s in g["steps"])
    assert t.graph_named("backward").capture["graph"] == "backward"


def test_show_prints_every_graph_or_the_one_picked(run, capsys):
    _, path, _ = run
    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert all(f"{g} graph:" in out for g in ("pre-grad", "forward", "backward"))
    assert main(["show", str(path), "--graph", "backward"]) == 0
    out = capsys.readouterr().out
    assert "backward graph:" in out and "forward graph:" not in out


def test_a_step_number_alone_is_ambiguous_and_graph_picks_one(run, capsys):
    _, path, _ = run
    assert main(["diff", str(path), "--step", "1"]) == 2
    assert "ambiguous" in capsys.readouterr().err
    assert main(["diff", str(path), "--step", "1", "--graph", "forward"]) == 0
    assert "forward step 1" in capsys.readouterr().out


def test_repro_of_a_backward_step_runs_standalone(run, tmp_path, capsys):
    _, path, _ = run
    out = tmp_path / "repro.py"
    assert main(["repro", str(path), "--graph", "backward", "--step", "1", "-o", str(out)]) == 0
    assert "backward step 1" in capsys.readouterr().out
    res = subprocess.run([sys.executable, str(out)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "OK" in res.stdout


def test_inspect_finds_the_graph_of_a_node_or_asks(run, capsys):
    _, path, t = run
    bw = t.graph_named("backward")
    only_bw = next(n for n in bw.initial_graph.nodes if n.startswith("tangents"))
    assert main(["inspect", str(path), only_bw]) == 0
    capsys.readouterr()
    both = next(
        n for n in t.graph_named("forward").initial_graph.nodes if n in bw.initial_graph.nodes and n != "output"
    )
    assert main(["inspect", str(path), both]) == 2
    assert "--graph" in capsys.readouterr().err
    assert main(["inspect", str(path), both, "--graph", "forward"]) == 0


def test_report_draws_one_graph_and_names_the_others(run, tmp_path, capsys):
    _, path, _ = run
    out = tmp_path / "r.html"
    assert main(["report", str(path), "--graph", "backward", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert out.stat().st_size > 10_000
    assert "the trace also holds pre-grad" in text and "forward" in text


def test_bisect_searches_every_graph(capsys):
    assert main(["bisect", MODEL, "--stage", "post-grad", "--mode", "training"]) == 0
    out = capsys.readouterr().out
    assert "== forward graph ==" in out and "== backward graph ==" in out
    assert out.count("the final graph matches the original") == 2


def test_a_trace_written_before_graphs_existed_loads_as_pre_grad(run):
    _, path, _ = run
    data = json.loads(path.read_text())
    for key in ("graph", "graphs"):
        data.pop(key)
    for s in data["steps"]:
        s.pop("graph")
    old = Trace.from_json(data)
    assert old.graph_names() == ["pre-grad"] and all(s.graph == "pre-grad" for s in old.steps)


def test_why_on_an_aten_node_names_its_graph(capsys):
    assert main(["why", MODEL, "addmm", "--stage", "post-grad", "--mode", "training"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("forward graph (ATen, post-grad passes):")
    assert "batch_linear_post_grad" in out
    assert main(["why", MODEL, "sideways:addmm", "--stage", "post-grad"]) == 2
    assert "no sideways graph" in capsys.readouterr().err


def test_passes_of_the_other_stage_are_named_as_such(capsys):
    assert main(["run", MODEL, "--passes", "batch_linear_post_grad"]) == 2
    assert "not a pass of --stage pre-grad" in capsys.readouterr().err


ATEN_MM_RULES = """
import torch
from optimus_lens.core.lang import Op, Rule, Var

aten = torch.ops.aten
PATTERNS = [
    Rule("aten_addmm", Op(aten.addmm.default, Var("b"), Var("x"), Var("w")),
         lambda rw, b, x, w: rw.call(aten.addmm.default, b, x, w)),
    Rule("aten_mm", Op(aten.mm.default, Var("a"), Var("b")), lambda rw, a, b: rw.call(aten.mm.default, a, b)),
]
"""


def test_match_previews_a_pattern_file_on_each_aten_graph(tmp_path, capsys):
    """The ten linears are ``addmm`` in the forward graph; their weights' gradients are
    ``mm`` in the backward graph (the input needs no gradient, so no ``mm`` for it)."""
    pf, out = tmp_path / "aten_rules.py", tmp_path / "m.json"
    pf.write_text(ATEN_MM_RULES)
    argv = ["match", MODEL, "--stage", "post-grad", "--mode", "training", "--pattern-file", str(pf)]
    assert main(argv + ["--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "== forward graph (ATen) ==" in text and "== backward graph (ATen) ==" in text
    found = json.loads(out.read_text())
    assert found["schema"]["name"] == "optimus.match" and found["stage"] == "post-grad"
    count = {g: [m["pattern"] for m in found["graphs"][g]["matches"]] for g in ("forward", "backward")}
    assert count["forward"].count("aten_addmm") == 10 and "aten_mm" not in count["forward"]
    assert count["backward"].count("aten_mm") == 10 and "aten_addmm" not in count["backward"]


def test_dynamic_shapes_are_refused_for_the_post_grad_stage(capsys):
    assert main(["run", MODEL, "--stage", "all", "--dynamic"]) == 2
    assert "--dynamic" in capsys.readouterr().err


def test_bench_times_forward_and_backward_after_each_post_grad_pass(tmp_path, capsys):
    out = tmp_path / "b.json"
    code = main(
        ["bench", MODEL, "--stage", "post-grad", "--mode", "training", "--repeats", "2", "--warmup", "1"]
        + ["--json", str(out), "--against-upstream"]
    )
    assert code == 0
    stages = {s["name"]: s for s in json.loads(out.read_text())["stages"]}
    assert {"post:baseline", "post:batch_linear_post_grad", "post:inductor", "post:upstream"} <= set(stages)
    assert stages["post:batch_linear_post_grad"]["previous"] == "post:baseline"
    assert stages["post:baseline"]["nodes"] > 0
    assert "post grad ours vs upstream" in capsys.readouterr().out
