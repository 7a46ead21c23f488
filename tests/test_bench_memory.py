"""Per-pass timing protocol and the static liveness estimate of peak memory."""
import torch
import torch.nn as nn
from torch.fx import symbolic_trace

from optimus.bench import bench_pipeline
from optimus.capture import capture
from optimus.memory import peak_bytes


def test_liveness_estimate_counts_inputs_and_frees_dead_intermediates():
    class Chain(nn.Module):
        def forward(self, x):
            a = x * 2          # 4 KiB
            b = a * 3          # 4 KiB, a dies after this
            c = b.reshape(-1)  # view: no allocation
            return c + 1       # 4 KiB, b dies after this
    c = capture(Chain(), (torch.zeros(32, 32),))
    r = peak_bytes(c.gm.graph)
    kib = 32 * 32 * 4
    assert r["inputs_bytes"] == kib
    assert r["peak_bytes"] == 3 * kib  # input + two live intermediates at most


def test_bench_measures_every_stage_side_by_side_with_baseline_speedup_one():
    r = bench_pipeline("sample:teach_batch_relu", repeats=3, warmup=1)
    assert [s.stage for s in r.stages][0] == "baseline"
    assert len(r.stages) >= 2 and r.method == "wall-clock"
    assert r.stages[0].speedup == 1.0
    assert all(s.median_ms > 0 and s.p10_ms <= s.median_ms <= s.p90_ms and s.peak_bytes > 0 for s in r.stages)
    assert "baseline" in r.table()
