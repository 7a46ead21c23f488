"""Per-pass timing protocol and the static liveness estimate of peak memory."""

import torch
import torch.nn as nn

from optimus_lens.frontend.capture import capture
from optimus_lens.perf.bench import bench_pipeline
from optimus_lens.perf.memory import peak_bytes


def test_liveness_estimate_counts_inputs_and_frees_dead_intermediates():
    class Chain(nn.Module):
        def forward(self, x):
            a = x * 2  # 4 KiB
            b = a * 3  # 4 KiB, a dies after this
            c = b.reshape(-1)  # view: no allocation
            return c + 1  # 4 KiB, b dies after this

    c = capture(Chain(), (torch.zeros(32, 32),))
    r = peak_bytes(c.gm.graph)
    kib = 32 * 32 * 4
    assert r["inputs_bytes"] == kib
    assert r["peak_bytes"] == 3 * kib  # input + two live intermediates at most


def test_liveness_estimate_counts_split_pieces_as_views_of_one_live_base():
    class Pieces(nn.Module):
        def forward(self, x):
            a = x * 2  # 4 KiB
            p, q = torch.split(a, 16, 1)  # views: a stays alive while p or q is used
            r = p.relu()  # 2 KiB
            s = q.sum()  # 4 bytes; a dies after this
            return r + s  # 2 KiB

    c = capture(Pieces(), (torch.zeros(32, 32),))
    r = peak_bytes(c.gm.graph)
    kib = 32 * 32 * 4
    # at the sum: x (input) + a (alive through its view q, pieces allocate nothing) + r + s
    assert r["peak_bytes"] == kib + kib + kib // 2 + 4
    assert r["peak_node"] == "s"


def test_bench_measures_every_stage_side_by_side_with_baseline_speedup_one():
    r = bench_pipeline("sample:teach_batch_relu", repeats=3, warmup=1)
    assert [s.stage for s in r.stages][0] == "baseline"
    assert len(r.stages) >= 2 and r.method == "wall-clock"
    assert r.stages[0].speedup == 1.0
    assert all(s.median_ms > 0 and s.p10_ms <= s.median_ms <= s.p90_ms and s.peak_bytes > 0 for s in r.stages)
    assert "baseline" in r.table()


def test_bench_table_fits_long_stage_names_and_flags_noisy_timings():
    from optimus_lens.perf.timings import BenchResult, StageTiming

    steady = StageTiming("baseline", 10, 1.0, 0.9, 1.1, 5)
    long_name = StageTiming("move_reshape_out_of_split_stack_pass", 9, 0.8, 0.5, 3.0, 5, speedup=1.25)
    table = BenchResult("cpu", "wall-clock", [steady, long_name]).table()
    head, first, second = table.splitlines()[:3]
    assert head.index("nodes") + 5 == first.index("10") + 2 == second.index(" 9") + 2  # one column edge
    assert "noisy: p90 > 2x p10 for 1 of 2 stages" in table
    assert "noisy" not in BenchResult("cpu", "wall-clock", [steady]).table()
