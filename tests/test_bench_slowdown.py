"""Passes whose measured effect is a slowdown are flagged: the per-round ratio to the stage
before, its p10..p90 as the noise, in `optimus bench`'s table and JSON and in the app."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from streamlit.testing.v1 import AppTest

import optimus_lens.perf.bench as bench
from optimus_lens.cli import main
from optimus_lens.frontend.patternfile import load_pattern_file, pipeline_with
from optimus_lens.perf.bench import bench_pipeline, paired_ratio
from optimus_lens.perf.timings import Stage

# A correct but deliberately slow rewrite: relu(x) -> clamp(x, min=0) plus 0 times the sum
# of a 2048 x 2048 block of zeros made from x (so tracing keeps it in the graph): the same
# values and strides, about 100x the work of the graph it replaces.
SLOW_RELU = """
import torch

def pattern(x):
    return torch.relu(x)

def replacement(x):
    return torch.clamp(x, min=0) + x.new_zeros(2048, 2048).sum() * 0
"""


class ReluMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        return torch.relu(self.fc(x)) * 2


def _slow_pipeline(tmp_path):
    path = tmp_path / "slow_relu.py"
    path.write_text(textwrap.dedent(SLOW_RELU))
    return pipeline_with(load_pattern_file(path)), path


def test_paired_ratio_takes_the_per_round_ratio_and_its_spread():
    before = [1.0, 2.0, 1.0, 4.0, 1.0]
    after = [2.0, 4.0, 2.0, 8.0, 2.0]  # twice as slow in every round, whatever the load
    assert paired_ratio(before, after) == (0.5, 0.5, 0.5)
    med, lo, hi = paired_ratio([1.0] * 10, [0.5] * 9 + [2.0])
    assert (med, lo, hi) == (2.0, 2.0, 2.0)  # one slow round in ten is noise, not a slowdown
    with pytest.raises(ValueError):
        paired_ratio([1.0], [1.0, 2.0])


def test_a_pass_slower_than_the_stage_before_in_every_round_is_flagged_and_a_faster_one_is_not():
    gm = torch.fx.symbolic_trace(torch.nn.Identity())
    x = (torch.ones(2),)
    stages = [
        Stage("baseline", gm, x, "baseline"),
        Stage("fast", gm, x),
        Stage("slow", gm, x),
        Stage("alone:slow", gm, x, "alone"),
        Stage("upstream", gm, x, "upstream"),
    ]
    load = [1.0, 3.0, 1.0, 1.0, 1.0, 2.0, 1.0, 1.0, 1.0, 1.0]  # the same load hits a round's samples
    samples = {
        "baseline": load,
        "fast": [x / 2 for x in load],
        "slow": load,
        "alone:slow": [x * 2 for x in load],
        "upstream": [9.0] * 10,
    }
    variants = [bench._Variant(i, False, lambda: None, samples=samples[s.label]) for i, s in enumerate(stages)]
    res = bench._result(stages, variants, {}, False, "inference")
    by = {s.stage: s for s in res.stages}
    assert by["fast"].previous == "baseline" and by["fast"].vs_previous == 2.0 and not by["fast"].slowdown
    assert by["slow"].previous == "fast" and by["slow"].vs_previous == 0.5 and by["slow"].slowdown
    assert by["alone:slow"].previous == "baseline" and by["alone:slow"].slowdown
    assert by["upstream"].vs_previous is None and not by["upstream"].slowdown
    assert [s.stage for s in res.slowdowns()] == ["slow", "alone:slow"]
    assert (
        "! slowdown: slow runs at 0.50x the speed of the graph before it (after fast; per-round ratio "
        "p10..p90 0.50..0.50)"
    ) in res.table()
    assert res.to_json()["slowdowns"] == ["slow", "alone:slow"]
    few = [bench._Variant(i, False, lambda: None, samples=samples[s.label][:5]) for i, s in enumerate(stages)]
    assert bench._result(stages, few, {}, False, "inference").slowdowns() == []  # 5 rounds: too few to flag


def test_bench_flags_a_pattern_file_pass_that_makes_the_graph_slower(tmp_path):
    pipeline, _ = _slow_pipeline(tmp_path)
    torch.manual_seed(0)
    r = bench_pipeline(
        ReluMLP().eval(), inputs=(torch.randn(8, 16),), pipeline=pipeline, repeats=12, warmup=1, threads=1, device="cpu"
    )
    slow = r.stage("slow_relu")
    assert slow is not None and slow.steps == 1
    assert slow.slowdown and slow.vs_previous_p90 < 1.0
    assert "slow_relu" in [s.stage for s in r.slowdowns()]
    assert f"! slowdown: slow_relu runs at {slow.vs_previous:.2f}x" in r.table()


def test_cli_bench_prints_the_slowdown_line_and_json_lists_it(tmp_path, capsys):
    _, path = _slow_pipeline(tmp_path)
    out = tmp_path / "b.json"
    assert (
        main(
            [
                "bench",
                "sample:recsys_towers",
                "--pattern-file",
                str(path),
                "--repeats",
                "12",
                "--threads",
                "1",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "! slowdown: slow_relu runs at" in text
    assert "slow_relu" in json.loads(out.read_text())["slowdowns"]


APP = """
from optimus_lens.perf.timings import BenchResult, StageTiming
from optimus_lens.app.timing import show_result

slow = StageTiming("batch_layernorm", 9, 1.2, 1.1, 1.3, 20, speedup=0.83, steps=3, previous="batch_linear",
                   vs_previous=0.84, vs_previous_p10=0.78, vs_previous_p90=0.93)
fine = StageTiming("batch_relu", 9, 1.0, 0.95, 1.05, 20, speedup=1.0, steps=3, previous="batch_layernorm",
                   vs_previous=1.2, vs_previous_p10=0.95, vs_previous_p90=1.3)
show_result(BenchResult("cpu", "thread-cpu-time", [
    StageTiming("baseline", 10, 1.0, 0.95, 1.05, 9, kind="baseline"), slow, fine], threads=1))
"""


def test_timing_panel_shows_a_warning_line_per_flagged_pass():
    at = AppTest.from_string(APP).run(timeout=60)
    assert not at.exception
    lines = [w.value for w in at.warning if w.value.startswith("slowdown:")]
    assert lines == [
        "slowdown: batch_layernorm runs at 0.84x the speed of the graph before it (after batch_linear; "
        "per-round ratio p10..p90 0.78..0.93)"
    ]
