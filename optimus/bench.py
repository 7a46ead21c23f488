"""Per-pass timing and memory of a pipeline: baseline, then the graph after each enabled pass.

Protocol (the same on both devices): every stage is warmed up, then the stages are
timed round-robin — one sample of each stage per round — so that drift on a noisy
machine hits all stages alike and every speedup is a ratio measured in the same run.
Each figure is a median with its 10th/90th percentiles.

* CUDA: ``torch.cuda.Event`` pairs around each call, synchronised; peak memory is
  ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` minus what was
  allocated before the call (bytes).
* CPU: ``time.perf_counter`` around a batch of calls sized to at least ~2 ms per sample;
  peak memory is the static liveness estimate of :mod:`optimus.memory`.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch
from torch.fx import GraphModule

from optimus import memory


@dataclass
class StageTiming:
    """One stage: latency in ms (median, p10, p90 over ``repeats`` samples), speedup over
    the baseline (baseline median / this median), peak memory in bytes and where that
    figure comes from ("cuda" measured, "estimate" from liveness), and the optional
    ``torch.compile`` (Inductor) latency and compile time (s)."""

    stage: str
    nodes: int
    median_ms: float
    p10_ms: float
    p90_ms: float
    repeats: int
    speedup: float = 1.0
    peak_bytes: int = 0
    peak_source: str = "estimate"
    compiled_median_ms: float | None = None
    compile_s: float | None = None


@dataclass
class BenchResult:
    device: str
    method: str  # "cuda-events" | "wall-clock"
    stages: list[StageTiming] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"device": self.device, "method": self.method, "stages": [asdict(s) for s in self.stages]}

    def table(self) -> str:
        """The result as a plain-text table (what ``optimus bench`` prints)."""
        w = max([len("stage"), *(len(s.stage) for s in self.stages)])
        rows = [f"{'stage':{w}s} {'nodes':>6s} {'median ms':>10s} {'p10..p90 ms':>17s} {'speedup':>8s} "
                f"{'peak MiB':>9s}"]
        for s in self.stages:
            rows.append(f"{s.stage:{w}s} {s.nodes:6d} {s.median_ms:10.3f} {s.p10_ms:8.3f}..{s.p90_ms:<8.3f} "
                        f"{s.speedup:7.2f}x {s.peak_bytes / 2**20:9.2f}")
        noisy = [s.stage for s in self.stages if s.p90_ms > 2 * s.p10_ms]
        if noisy:
            rows.append(f"noisy: p90 > 2x p10 for {len(noisy)} of {len(self.stages)} stages; speedups within "
                        "that spread are noise (more --repeats, or a quieter machine)")
        rows.append(f"device {self.device}, {self.method}; peak memory "
                    f"{'measured' if self.method == 'cuda-events' else 'estimated from tensor liveness'}")
        return "\n".join(rows)


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def _to(x, device):
    return x.to(device) if isinstance(x, torch.Tensor) else x


def measure_stages(stages: list[tuple[str, GraphModule]], inputs: tuple, repeats: int = 20, warmup: int = 3,
                   device: str | None = None, compile: bool = False,
                   progress: Callable[[int, int, str], None] | None = None) -> BenchResult:
    """Time each ``(label, GraphModule)`` stage on ``inputs`` (see the module doc).

    ``device`` defaults to "cuda" when available, else "cpu". With ``compile``, each stage
    is also compiled with ``torch.compile`` (Inductor) and timed; compile time in s.
    ``progress(done, total, label)`` is called as work advances. Raises ValueError for
    an empty stage list.
    """
    if not stages:
        raise ValueError("no stages to measure")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.startswith("cuda")
    ins = tuple(_to(x, device) for x in inputs)
    fns = []
    for _, gm in stages:
        gm.recompile()
        fns.append(gm.to(device))
    total = len(stages) * (warmup + repeats) + (len(stages) if compile else 0)
    done = 0

    def tick(label: str) -> None:
        nonlocal done
        done += 1
        if progress:
            progress(done, total, label)

    with torch.no_grad():
        # warm-up, and on CPU the number of calls per sample (>= ~2 ms)
        inner = []
        for (label, _), fn in zip(stages, fns):
            t0 = time.perf_counter()
            for _ in range(warmup):
                fn(*ins)
                tick(label)
            per_call = (time.perf_counter() - t0) / max(warmup, 1)
            inner.append(1 if cuda else max(1, min(1000, int(0.002 / max(per_call, 1e-7)))))
        samples: list[list[float]] = [[] for _ in stages]
        for _ in range(repeats):
            for i, fn in enumerate(fns):
                samples[i].append(_time_once(fn, ins, inner[i], cuda))
                tick(stages[i][0])
        peaks = [(_cuda_peak(fn, ins), "cuda") if cuda else (memory.peak_bytes(gm.graph)["peak_bytes"], "estimate")
                 for (_, gm), fn in zip(stages, fns)]
        compiled = [(None, None)] * len(stages)
        if compile:
            compiled = []
            for (label, gm), n_inner in zip(stages, inner):
                compiled.append(_compiled_timing(gm, ins, warmup, repeats, n_inner, cuda))
                tick(label)
    out = BenchResult(device=torch.cuda.get_device_name() if cuda else "cpu",
                      method="cuda-events" if cuda else "wall-clock")
    base = statistics.median(samples[0])
    for (label, gm), s, (pk, src), (cm, cs) in zip(stages, samples, peaks, compiled):
        med = statistics.median(s)
        out.stages.append(StageTiming(label, len(gm.graph.nodes), med, _pct(s, 0.1), _pct(s, 0.9), len(s),
                                      base / med if med > 0 else float("nan"), pk, src, cm, cs))
    return out


def _time_once(fn, ins, inner: int, cuda: bool) -> float:
    """Milliseconds per call for one sample."""
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn(*ins)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end)
    t0 = time.perf_counter()
    for _ in range(inner):
        fn(*ins)
    return (time.perf_counter() - t0) * 1e3 / inner


def _cuda_peak(fn, ins) -> int:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn(*ins)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def _compiled_timing(gm, ins, warmup, repeats, inner, cuda) -> tuple[float, float]:
    import torch._dynamo

    torch._dynamo.reset()
    cfn = torch.compile(gm, backend="inductor")
    t0 = time.perf_counter()
    cfn(*ins)
    if cuda:
        torch.cuda.synchronize()
    compile_s = time.perf_counter() - t0
    for _ in range(warmup):
        cfn(*ins)
    ms = statistics.median(_time_once(cfn, ins, inner, cuda) for _ in range(repeats))
    return ms, compile_s


def bench_pipeline(spec, passes: list[str] | None = None, repeats: int = 20, warmup: int = 3,
                   compile: bool = False, device: str | None = None, inputs: tuple | None = None,
                   capture_method: str = "dynamo", graph_index: int | None = None,
                   progress: Callable[[int, int, str], None] | None = None) -> BenchResult:
    """Capture ``spec`` (see :func:`optimus.run.load_model`), run the pipeline keeping a
    copy of the graph after each enabled pass, and time every stage with
    :func:`measure_stages`. Stages: "baseline", then one per enabled pass.
    ``capture_method`` and ``graph_index`` pick the same graph a run showed (graph breaks)."""
    from optimus.run import optimize

    res = optimize(spec, inputs=inputs, passes=passes, verify="off", record=False, keep_stages=True,
                   capture_method=capture_method, graph_index=graph_index)
    return measure_stages(res.engine.stages, res.captured.example_inputs, repeats, warmup, device, compile, progress)
