"""CUDA checks of the bench, pre-packing and optimus_lens.compile (skipped without a GPU; run by scripts/gpu_check.sh)."""

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_cuda_bench_uses_events_and_measured_peaks():
    from optimus_lens.perf.bench import bench_pipeline

    r = bench_pipeline("sample:recsys_towers32", device="cuda", repeats=5, warmup=2, against_upstream=True)
    assert r.method == "cuda-events" and r.device == torch.cuda.get_device_name()
    assert [s.stage for s in r.stages][-2:] == ["upstream", "reference"]
    assert all(s.peak_source == "cuda" and s.peak_bytes > 0 and s.median_ms > 0 for s in r.stages)


def test_cuda_training_bench_runs_forward_and_backward():
    from optimus_lens.perf.bench import bench_pipeline

    r = bench_pipeline("sample:recsys_towers32", device="cuda", mode="training", repeats=3, warmup=1, final_only=True)
    assert [s.stage for s in r.stages] == ["baseline", "pipeline", "reference"]
    assert all(s.peak_bytes > 0 for s in r.stages)


def test_prepacked_constants_move_with_the_graph_module_to_cuda():
    from optimus_lens.core.engine import copy_graph_module
    from optimus_lens.frontend.run import optimize
    from optimus_lens.perf.prepack import prepack

    res = optimize("sample:recsys_towers32", verify="off", keep_stages=True)
    base, ins = res.engine.stages[0][1], res.captured.example_inputs
    gm = copy_graph_module(res.engine.gm)
    prepack(gm, ins, guard=None)
    gm.to("cuda")
    cuda_ins = tuple(x.detach().cuda() for x in ins)
    with torch.no_grad():
        torch.testing.assert_close(gm(*cuda_ins)[0].cpu(), base(*ins)[0], rtol=1e-4, atol=1e-4)


def test_optimus_compile_on_cuda_equals_eager_and_records_steps():
    from torch._dynamo.utils import counters

    import optimus_lens
    from optimus_lens import sample_models

    model, inputs = sample_models.get("recsys_towers32")
    model, inputs = model.cuda(), tuple(x.cuda() for x in inputs)
    saved = {k: dict(v) for k, v in counters.items()}  # compiling bumps torch's global counters: put them back
    try:
        with torch._inductor.config.patch(force_disable_caches=True):
            compiled = optimus_lens.compile(model)
            with torch.no_grad():
                torch.testing.assert_close(compiled(*inputs), model(*inputs), rtol=1e-4, atol=1e-4)
    finally:
        torch._dynamo.reset()
        counters.clear()
        for k, v in saved.items():
            counters[k].update(v)
    assert any(s.pattern == "batch_linear" for s in compiled.optimus_traces[0].steps)
