"""The post-grad scale and end-to-end compile benchmarks (benchmarks/post_grad_scale.py,
benchmarks/compile_e2e.py) still run: each at a tiny size, in seconds, so they cannot rot."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def _load(name: str):
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_towers_module_captures_to_the_graph_search_scale_builds():
    from optimus_lens.frontend.capture import capture

    towers_model, search_scale = _load("towers_model"), _load("search_scale")
    model, x = towers_model.towers_model(60, towers=4)
    gm = capture(model, (x,), grad=True).gm
    built, _ = search_scale.build_towers(*search_scale.shape_for(60, towers=4))
    assert len(gm.graph.nodes) == len(built.graph.nodes)
    ops = [n.op for n in gm.graph.nodes]
    assert ops == [n.op for n in built.graph.nodes]


def test_search_scale_floor_times_the_primitives_inside_a_run_and_puts_them_back():
    from torch.fx import Graph, GraphModule

    search_scale = _load("search_scale")
    before = {name: owner.__dict__[attr] for name, (owner, attr) in search_scale.FLOOR_PARTS.items()}
    row = search_scale.measure(200, repeat=1, upstream_repeat=1, towers=8, floor=True)
    f = row["floor"]
    assert set(f) == {*search_scale.FLOOR_PARTS, "total_s"}
    assert 0 < f["create_node"] and 0 < f["fake_dispatch"] and 0 < f["recompile"]
    assert sum(v for k, v in f.items() if k != "total_s") < f["total_s"]
    assert {name: owner.__dict__[attr] for name, (owner, attr) in search_scale.FLOOR_PARTS.items()} == before
    assert Graph.create_node is before["create_node"] and GraphModule.recompile is before["recompile"]
    assert "floor: FX and FakeTensor primitives" in search_scale.report_row(None, row)


def test_post_grad_scale_times_both_sides_on_the_forward_and_backward_graphs():
    pgs = _load("post_grad_scale")
    small, big = pgs.measure(40, repeat=1, towers=4), pgs.measure(80, repeat=1, towers=4)
    assert [g["graph"] for g in small["graphs"]] == ["forward", "backward"]
    fwd = small["graphs"][0]
    for run in pgs.RUNS:
        assert fwd[run + "_s"] > 0 and fwd[run + "_median_s"] > 0
    assert fwd["steps"] > 0, "our post-grad fusions found nothing to batch in the towers forward graph"
    assert fwd["nodes_after_inductor"] == fwd["nodes"]  # Inductor alone fuses nothing here
    bwd = small["graphs"][1]
    assert bwd["nodes_after_upstream"] != bwd["nodes"]  # upstream's options do (the backward's mm groups)
    text = pgs.report(small, big)
    assert "ours/upstream off" in text and "growth of medians" in text
    assert all("growth_per_4x" in g for g in big["graphs"])


def test_compile_e2e_reports_ratios_to_plain_inductor():
    e2e = _load("compile_e2e")
    row = {"nodes": 40, "mode": "inference", "pre_grad_s": 1.0, "post_grad_s": 1.0, "equal_eager": True}
    row |= {"max_abs_diff": 0.0, "pre_grad_nodes_after": 50}
    rows = [
        {**row, "way": "inductor", "first_call_s": 10.0, "per_call_ms": 2.0, "pre_grad_s": 0.5},
        {**row, "way": "upstream", "first_call_s": 20.0, "per_call_ms": 1.0, "pre_grad_s": 4.0},
        {**row, "way": "ours", "first_call_s": 15.0, "per_call_ms": 1.0, "ours_pass_s": 0.4},
        {"way": "upstream_all", "nodes": 40, "mode": "inference", "error": "timed out after 5 s"},
    ]
    text = e2e.report(rows)
    assert "x2.00" in text and "x1.50" in text and "x0.50" in text  # first calls and per call vs inductor
    assert "ours/upstream 0.250" in text and "its Optimus options: 3.50 s" in text
    assert "upstream_all  error: timed out" in text


def test_compile_e2e_side_by_side_reports_medians_against_the_first_way():
    e2e = _load("compile_e2e")
    row = {"per_call_ms": 2.0, "p25_ms": 1.5, "p75_ms": 2.5, "pre_grad_nodes_after": 50, "equal_eager": True}
    res = {"nodes": 40, "mode": "inference", "calls": 10}
    res["rows"] = [{**row, "way": "ours"}, {**row, "way": "upstream", "per_call_ms": 3.0}]
    text = e2e.report_side_by_side(res)
    assert "side by side (10 rounds" in text and "2.000 (1.500..2.500)" in text and "x1.500" in text
    assert "error: boom" in e2e.report_side_by_side({"nodes": 40, "mode": "inference", "error": "boom"})


@pytest.mark.timeout(300)
def test_compile_e2e_compiles_in_a_fresh_process_and_matches_eager():
    out = subprocess.run(
        [sys.executable, str(BENCH / "compile_e2e.py"), "--ways", "ours", "--sizes", "12", "--towers", "2"]
        + ["--modes", "inference", "--calls", "1"],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    ours = next(line for line in out.stdout.splitlines() if line.strip().startswith("ours"))
    assert ours.rstrip().endswith(")") and "True" in ours
