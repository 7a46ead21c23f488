"""The bench protocol: stages, interleaved rounds, modes, upstream and reference stages, JSON, CLI."""

import json

import pytest
import torch

import optimus_lens.perf.bench as bench
from optimus_lens.cli import main
from optimus_lens.perf.bench import bench_pipeline, measure
from optimus_lens.perf.stages import upstream_options
from optimus_lens.perf.timings import BenchResult, Stage, StageTiming


def _gm(scale: float):
    class M(torch.nn.Module):
        def forward(self, x):
            return x * scale

    return torch.fx.symbolic_trace(M())


def test_rounds_interleave_every_variant_with_a_rotating_start(monkeypatch):
    calls: list[str] = []

    def fake_call(fn, inputs, mode):
        label = f"v{len(made)}"
        made.append(label)
        return lambda: calls.append(label)

    made: list[str] = []
    monkeypatch.setattr(bench, "make_call", fake_call)
    monkeypatch.setattr(bench, "_time_once", lambda call, inner, cuda, clock: (call(), 1.0)[1])
    x = (torch.ones(4),)
    r = measure(
        [Stage("baseline", _gm(1.0), x, "baseline"), Stage("a", _gm(2.0), x), Stage("b", _gm(3.0), x)],
        repeats=3,
        warmup=0,
    )
    timed = calls[3:]  # after one warm-up call each
    assert timed == ["v0", "v1", "v2", "v1", "v2", "v0", "v2", "v0", "v1"]
    assert [s.repeats for s in r.stages] == [3, 3, 3] and r.stages[0].speedup == 1.0


def test_training_mode_differentiates_with_respect_to_the_parameters():
    w = torch.nn.Parameter(torch.ones(3))
    seen = []

    def fn(x, w):
        out = x * w
        out.register_hook(lambda g: seen.append(g))
        return (out,)

    bench.make_call(fn, (torch.ones(3), w), "training")()
    assert seen and w.grad is None  # a gradient flowed, nothing accumulated
    with pytest.raises(ValueError, match="require grad"):
        bench.make_call(fn, (torch.ones(3), torch.ones(3)), "training")


def test_measure_rejects_bad_arguments():
    x = (torch.ones(2),)
    with pytest.raises(ValueError, match="no stages"):
        measure([], repeats=1)
    with pytest.raises(ValueError, match="mode must be"):
        measure([Stage("baseline", _gm(1.0), x)], mode="eval")
    with pytest.raises(ValueError, match="repeats"):
        measure([Stage("baseline", _gm(1.0), x)], repeats=0)


@pytest.fixture(scope="module")
def towers32():
    return bench_pipeline("sample:recsys_towers32", repeats=3, warmup=1, against_upstream=True, threads=1)


def test_inference_bench_times_changed_passes_prepack_upstream_and_reference(towers32):
    r = towers32
    names = [s.stage for s in r.stages]
    assert names[0] == "baseline" and names[-2:] == ["upstream", "reference"]
    assert "prepack_weights" in names and "batch_linear" in names
    assert all(s.steps > 0 for s in r.stages if s.kind == "pass")
    assert "batch_tanh" in r.unchanged and "batch_tanh" not in names
    assert r.mode == "inference" and r.threads == 1 and r.bytes_packed == 1_081_344
    assert r.method == "thread-cpu-time"  # one thread: its CPU time, not the wall clock
    assert r.upstream_options["batch_linear"] == {"min_fuse_set_size": 5, "max_fuse_search_depth": 5}
    assert r.ours.stage == "prepack_weights"
    assert set(r.ratios()) == {"ours_vs_upstream", "ours_vs_reference"}
    base, packed = r.stage("baseline"), r.stage("prepack_weights")
    assert packed.peak_bytes <= base.peak_bytes < r.stage("batch_linear").peak_bytes
    assert all(s.p10_ms <= s.median_ms <= s.p90_ms for s in r.stages)


def test_json_holds_the_documented_fields(towers32):
    d = json.loads(json.dumps(towers32.to_json()))
    assert d["device"] == "cpu" and d["mode"] == "inference"
    for s in d["stages"]:
        assert {
            "name",
            "latency_ms_median",
            "latency_ms_p10",
            "latency_ms_p90",
            "peak_bytes",
            "speedup_vs_baseline",
        } <= set(s)
    assert any(s["name"] == "upstream" for s in d["stages"])


def test_training_bench_times_the_packed_stage_and_trains_the_reference():
    r = bench_pipeline("sample:recsys_towers32", repeats=2, warmup=1, mode="training", passes=["batch_linear"])
    assert [s.stage for s in r.stages] == ["baseline", "batch_linear", "packed", "reference"]
    # the two tower linears of 32 towers, weights and biases: one packed leaf each
    assert r.mode == "training" and r.bytes_packed == 4 * 2 * 32 * (64 * 64 + 64)
    assert r.stage("packed").steps == 4 and r.ours.stage == "packed"
    assert "packed parameters: 1,064,960 bytes" in r.table()
    assert {s.peak_source for s in r.stages} == {"estimate-forward"} and "of the forward graph" in r.table()


def test_compiled_variants_get_latency_speedup_and_compile_time():
    from torch._dynamo.utils import counters

    saved = {k: dict(v) for k, v in counters.items()}  # compiling bumps torch's global counters: put them back
    try:
        r = bench_pipeline("sample:teach_batch_relu", repeats=2, warmup=1, compile=True, passes=["batch_relu"])
    finally:
        torch._dynamo.reset()
        counters.clear()
        for k, v in saved.items():
            counters[k].update(v)
    assert [s.stage for s in r.stages] == ["baseline", "batch_relu"]
    for s in r.stages:
        assert s.compiled_median_ms > 0 and s.compile_s > 0 and s.compiled_speedup > 0
    assert r.stages[0].compiled_speedup == 1.0
    assert "compiled ms" in r.table()


def test_upstream_options_name_upstream_passes_with_our_search_options():
    o = upstream_options(
        ["normalization_pass", "batch_linear_lhs", "batch_relu", "split_cat_cleanup", "unbind_cat_to_view_pass"]
    )
    assert o == {
        "normalization_pass": {},
        "batch_linear_lhs": {"min_fuse_set_size": 2, "max_fuse_search_depth": 16},
        "batch_relu": {"min_fuse_set_size": 5, "max_fuse_search_depth": 5},
        "split_cat_pass": {},
        "unbind_stack_pass": {},
        "unbind_cat_to_view_pass": {},
    }


def test_noise_warning_names_the_noisy_stages():
    steady = StageTiming("baseline", 10, 1.0, 0.9, 1.1, 5)
    noisy = StageTiming("batch_relu", 9, 0.8, 0.5, 3.0, 5, speedup=1.25)
    assert BenchResult("cpu", "wall-clock", [steady]).noise_warning() is None
    assert "(batch_relu)" in BenchResult("cpu", "wall-clock", [steady, noisy]).noise_warning()


def test_cli_bench_writes_json_and_rejects_bad_input(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["bench", "sample:teach_batch_relu", "--repeats", "2", "--threads", "1", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["stages"][0]["name"] == "baseline" and d["threads"] == 1
    assert "baseline" in capsys.readouterr().out
    assert main(["bench", "sample:nope"]) == 2
    assert main(["bench", "sample:teach_batch_relu", "--repeats", "0"]) == 2
    if not torch.cuda.is_available():
        assert main(["bench", "sample:teach_batch_relu", "--device", "cuda"]) == 2
        assert "CUDA is not available" in capsys.readouterr().err


def test_figures_show_compiled_series_and_compile_time_only_when_compiled():
    from optimus_lens import viz

    base = StageTiming(
        "baseline",
        10,
        1.0,
        0.9,
        1.1,
        5,
        kind="baseline",
        compiled_median_ms=0.5,
        compile_s=3.0,
        compiled_p10_ms=0.45,
        compiled_p90_ms=0.55,
        compiled_speedup=1.0,
    )
    fused = StageTiming(
        "batch_relu",
        9,
        0.5,
        0.45,
        0.6,
        5,
        speedup=2.0,
        steps=1,
        compiled_median_ms=0.25,
        compile_s=2.0,
        compiled_p10_ms=0.2,
        compiled_p90_ms=0.3,
        compiled_speedup=2.0,
    )
    b = BenchResult("cpu", "wall-clock", [base, fused], mode="training")
    fig = viz.speedup_figure(b)
    assert [t.name for t in fig.data] == ["eager", "torch.compile (Inductor)"]
    assert list(fig.data[1].y) == [1.0, 2.0]
    assert list(viz.compile_time_figure(b).data[0].y) == [3.0, 2.0]
    assert "training" in fig.layout.title.text
    assert viz.compile_time_figure(BenchResult("cpu", "wall-clock", [StageTiming("baseline", 1, 1, 1, 1, 1)])) is None
    assert viz.bench_rows(b)[1]["compile s"] == 2.0
