"""Per-pass timing and memory of a pipeline, measured side by side in one run.

Stages (:func:`optimus_lens.perf.stages.build_stages`): ``baseline`` (the captured graph), then the graph after each enabled pass that
made a step (cumulative; passes without a step are listed as ``unchanged``, not timed),
then in inference ``prepack_weights`` (:mod:`optimus_lens.perf.prepack`: the parameter
stacks folded into constants) and in training ``packed`` (:mod:`optimus_lens.perf.pack`: the
graph reading one packed leaf per fused group, timed with those leaves as its inputs, as
the hand-fused reference is with its stacked weights). On request also each
pass alone (``alone:<pass>``), ``upstream`` (the captured graph after PyTorch Inductor's
own ``pre_grad_passes`` with the ``pre_grad_fusion_options`` equivalent to the enabled
passes, :func:`optimus_lens.perf.stages.upstream_options`) and ``reference`` (a hand-fused model the sample
provides through an ``optimus_reference()`` method).

Post-grad stages (``stage="post-grad"`` or ``"all"``, :mod:`optimus_lens.perf.aten_stages`):
``post:baseline`` (the program's ATen graphs as AOTAutograd hands them to Inductor: the
captured program's, or with ``"all"`` the one our pre-grad passes rewrote), then the ATen
graphs after each post-grad pass that made a step (``post:<pass>``), and with
``against_upstream`` ``post:inductor`` (upstream's ``post_grad_passes`` with no Optimus
options) and ``post:upstream`` (with the options equivalent to ours, on the ATen graphs of
upstream's pre-grad output with ``"all"``). A post-grad stage is one call of the forward
graph on its recorded primals and, in training, the backward graph on its recorded saved
activations and tangents: "eager" runs the ATen graphs op by op, ``compile`` each under
``torch.compile`` (Inductor).

Protocol (the same on both devices):

* every variant (a stage eager, and with ``compile`` the stage under ``torch.compile``
  with Inductor; compile time is the first call's wall time, s) is warmed up;
* then the variants are timed round-robin, one sample of each per round, the starting
  variant rotating from round to round, so drift on a noisy machine hits all alike and
  every ratio comes from one run; each figure is a median with its 10th/90th percentile;
* a pass's own effect is the per-round ratio of the stage before it to its stage
  (:func:`paired_ratio`; ``alone:<pass>`` against the baseline), median and p10..p90; a
  pass whose ratio is below 1 even at its p90 (slower in at least 9 of 10 rounds; at
  least ``MIN_FLAG_ROUNDS`` rounds) is flagged as a slowdown (:meth:`optimus_lens.perf.timings.BenchResult.slowdowns`; a ``!`` line in the table, a
  warning in the app's timing panel);
* ``mode="inference"`` calls the graph under ``torch.no_grad``; ``mode="training"`` runs
  forward and backward (``torch.autograd.grad`` of the sum of the outputs with respect
  to every input that requires grad: the parameters; no optimizer step).

Devices:

* CUDA: ``torch.cuda.Event`` pairs around each call, synchronised; peak memory is
  ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, minus what was
  allocated before the call (bytes), measured for every variant;
* CPU: a batch of calls sized to at least ~2 ms per sample, timed by ``time.perf_counter``
  (wall clock) or, when torch runs one thread, by ``time.thread_time`` (the CPU time of
  the one thread doing the work: on an idle machine the same as wall clock, on a shared
  one it leaves out the time the thread waited for a core, which the wall clock adds as
  noise); peak memory is the static liveness estimate of :mod:`optimus_lens.perf.memory` (which
  counts constants such as pre-packed weights) of each stage's graph; for training the
  estimate covers the forward graph only (not the activations saved for backward), and
  compiled variants get no CPU memory figure.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from optimus_lens.perf import memory
from optimus_lens.perf.stages import build_stages
from optimus_lens.perf.timings import MODES, BenchResult, Stage, StageTiming


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def paired_ratio(before: list[float], after: list[float]) -> tuple[float, float, float]:
    """Median, p10 and p90 of ``before[r] / after[r]`` over the rounds r (> 1: ``after``
    is faster). The samples of one round are taken back to back, so load on the machine
    moves both alike and the per-round ratio is far steadier than a ratio of medians;
    its p10..p90 is the measured noise of the comparison. Raises ValueError for lists
    of different lengths or none."""
    if not before or len(before) != len(after):
        raise ValueError(f"need the same number of samples per stage, got {len(before)} and {len(after)}")
    rs = [b / a for b, a in zip(before, after) if a > 0]
    return statistics.median(rs), _pct(rs, 0.1), _pct(rs, 0.9)


def _to(x, device: str):
    """``x`` on ``device``; a parameter stays a leaf parameter (so training takes its gradient)."""
    if isinstance(x, torch.nn.Parameter):
        return (
            x
            if x.device.type == torch.device(device).type
            else torch.nn.Parameter(x.detach().to(device), requires_grad=x.requires_grad)
        )
    return x.to(device) if isinstance(x, torch.Tensor) else x


def _outputs(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _outputs(o)]
    return []


def make_call(fn: Callable, inputs: tuple, mode: str) -> Callable[[], None]:
    """One timed unit of work: ``fn(*inputs)`` under ``torch.no_grad`` (inference), or
    forward plus ``torch.autograd.grad`` of the outputs' sum with respect to the inputs
    that require grad (training). Raises ValueError when training has nothing to
    differentiate."""
    if mode == "inference":

        def infer() -> None:
            with torch.no_grad():
                fn(*inputs)

        return infer
    wrt = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
    if not wrt:
        raise ValueError("training mode needs parameters or inputs that require grad")

    def train() -> None:
        outs = [o for o in _outputs(fn(*inputs)) if o.requires_grad]
        torch.autograd.grad(sum(o.float().sum() for o in outs), wrt, allow_unused=True)

    return train


def aten_call(graphs: list[tuple[Callable, tuple]]) -> Callable[[], None]:
    """One timed unit of work for an ATen stage: every graph called on its inputs in turn
    (forward, then backward on its recorded saved activations and tangents), under
    ``torch.no_grad``: AOTAutograd's graphs hold the backward computation themselves."""

    def run() -> None:
        with torch.no_grad():
            for fn, ins in graphs:
                fn(*ins)

    return run


def _time_once(
    call: Callable[[], None], inner: int, cuda: bool, clock: Callable[[], float] = time.perf_counter
) -> float:
    """Milliseconds per call for one sample (CPU: measured with ``clock``, in s)."""
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(inner):
            call()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / inner
    t0 = clock()
    for _ in range(inner):
        call()
    return (clock() - t0) * 1e3 / inner


def _cuda_peak(call: Callable[[], None]) -> int:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    call()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


@dataclass
class _Variant:
    stage: int
    compiled: bool
    call: Callable[[], None]
    inner: int = 1
    compile_s: float | None = None
    samples: list[float] = field(default_factory=list)


def measure(
    stages: list[Stage],
    repeats: int = 20,
    warmup: int = 3,
    device: str | None = None,
    compile: bool = False,
    mode: str = "inference",
    progress: Callable[[int, int, str], None] | None = None,
) -> BenchResult:
    """Time every stage (eager, and compiled with ``compile``) by the module's protocol.

    ``device`` defaults to "cuda" when available, else "cpu". ``progress(done, total,
    label)`` is called as work advances. Raises ValueError for no stages, an unknown
    ``mode``, ``repeats`` < 1, or CUDA asked for where there is none.
    """
    if not stages:
        raise ValueError("no stages to measure")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, not {repeats}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise ValueError("--device cuda: CUDA is not available on this machine")
    variants: list[_Variant] = []
    for i, st in enumerate(stages):
        if st.aten:
            graphs = [(g.to(device), tuple(_to(x, device) for x in xs)) for g, xs in [(st.gm, st.inputs), *st.after]]
            for g, _ in graphs:
                g.recompile()
            variants.append(_Variant(i, False, aten_call(graphs)))
            if compile:
                comp = [(torch.compile(g, backend="inductor"), xs) for g, xs in graphs]
                variants.append(_Variant(i, True, aten_call(comp)))
            continue
        gm = st.gm.to(device)
        gm.recompile()
        ins = tuple(_to(x, device) for x in st.inputs)
        variants.append(_Variant(i, False, make_call(gm, ins, mode)))
        if compile:
            variants.append(_Variant(i, True, make_call(torch.compile(gm, backend="inductor"), ins, mode)))
    total = len(variants) * (1 + repeats)
    done = 0

    def tick(label: str) -> None:
        nonlocal done
        done += 1
        if progress:
            progress(done, total, label)

    for v in variants:  # warm-up (the compiled variants compile here) and calls per sample
        t0 = time.perf_counter()
        v.call()
        if cuda:
            torch.cuda.synchronize()
        if v.compiled:
            v.compile_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(warmup):
            v.call()
        if cuda:
            torch.cuda.synchronize()
        per_call = (time.perf_counter() - t0) / max(warmup, 1)
        v.inner = max(1, min(1000, int(0.002 / max(per_call, 1e-7))))
        tick(stages[v.stage].label + (" (compiling)" if v.compiled else ""))
    one_thread = not cuda and torch.get_num_threads() == 1
    clock = time.thread_time if one_thread else time.perf_counter
    for r in range(repeats):
        k = r % len(variants)
        for v in variants[k:] + variants[:k]:
            v.samples.append(_time_once(v.call, v.inner, cuda, clock))
            tick(stages[v.stage].label)
    peaks = {id(v): _cuda_peak(v.call) for v in variants} if cuda else {}
    out = _result(stages, variants, peaks, cuda, mode)
    if one_thread:
        out.method = "thread-cpu-time"
    return out


def _result(stages: list[Stage], variants: list[_Variant], peaks: dict, cuda: bool, mode: str) -> BenchResult:
    out = BenchResult(
        device=torch.cuda.get_device_name() if cuda else "cpu",
        method="cuda-events" if cuda else "wall-clock",
        mode=mode,
        threads=None if cuda else torch.get_num_threads(),
    )
    eager = {v.stage: v for v in variants if not v.compiled}
    comp = {v.stage: v for v in variants if v.compiled}
    base = statistics.median(eager[0].samples)
    cbase = statistics.median(comp[0].samples) if comp else None
    for i, st in enumerate(stages):
        s = eager[i].samples
        med = statistics.median(s)
        if cuda:
            peak, src = peaks[id(eager[i])], "cuda"
        else:
            peak = memory.peak_bytes(st.gm.graph)["peak_bytes"]
            src = "estimate" if mode == "inference" else "estimate-forward"
        t = StageTiming(
            st.label,
            st.nodes(),
            med,
            _pct(s, 0.1),
            _pct(s, 0.9),
            len(s),
            base / med,
            peak,
            src,
            steps=st.steps,
            kind=st.kind,
        )
        before = _previous_stage(stages, i)
        if before is not None:
            t.previous = stages[before].label
            t.vs_previous, t.vs_previous_p10, t.vs_previous_p90 = paired_ratio(eager[before].samples, s)
        if i in comp:
            c = comp[i].samples
            cm = statistics.median(c)
            t.compiled_median_ms, t.compiled_p10_ms, t.compiled_p90_ms = cm, _pct(c, 0.1), _pct(c, 0.9)
            t.compile_s, t.compiled_speedup = comp[i].compile_s, cbase / cm
            t.compiled_peak_bytes = peaks.get(id(comp[i]))
        out.stages.append(t)
    return out


def _previous_stage(stages: list[Stage], i: int) -> int | None:
    """The stage a pass stage's own effect is measured against: for a cumulative pass or
    ``prepack_weights`` the cumulative stage before it, for ``alone:<pass>`` the baseline;
    None for the others (baseline, upstream, reference)."""
    kind = stages[i].kind
    if kind == "alone":
        return 0 if stages[0].kind == "baseline" else None
    if kind == "post-pass":
        return next((j for j in range(i - 1, -1, -1) if stages[j].kind in ("post-baseline", "post-pass")), None)
    if kind not in ("pass", "prepack"):
        return None
    return next((j for j in range(i - 1, -1, -1) if stages[j].kind in ("baseline", "pass", "prepack")), None)


def stage_kernels(st: Stage, device: str, mode: str) -> dict:
    """What Inductor generates for one stage on ``device`` in ``mode``
    (:func:`optimus_lens.perf.kernels.count_kernels`) as plain data; ``{"error": ...}`` when
    the stage does not compile."""
    from optimus_lens.perf.kernels import count_kernels

    gm = st.gm.to(device)
    gm.recompile()
    ins = tuple(_to(x, device) for x in st.inputs)
    try:
        return count_kernels(make_call(torch.compile(gm, backend="inductor"), ins, mode)).to_json()
    except Exception as e:  # noqa: BLE001 - a stage Inductor cannot compile is a finding, not a crash
        return {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"}


def bench_pipeline(
    spec,
    passes: list[str] | None = None,
    repeats: int = 20,
    warmup: int = 3,
    compile: bool = False,
    device: str | None = None,
    inputs: tuple | None = None,
    capture_method: str = "dynamo",
    graph_index: int | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    mode: str = "inference",
    alone: bool = False,
    against_upstream: bool = False,
    reference: bool = True,
    threads: int | None = None,
    final_only: bool = False,
    pipeline=None,
    kernels: bool = False,
    stage: str = "pre-grad",
    post_pipeline=None,
) -> BenchResult:
    """Build the stages (:func:`optimus_lens.perf.stages.build_stages`) and time them (:func:`measure`): what
    ``optimus bench`` and the app's timing panel run. ``threads`` sets
    ``torch.set_num_threads`` for the run (restored after). ``capture_method`` and
    ``graph_index`` pick the same graph a run showed (graph breaks). With ``kernels``,
    each stage is also compiled with Inductor and what it generates is counted
    (:func:`stage_kernels`)."""
    old = torch.get_num_threads()
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be at least 1, not {threads}")
        torch.set_num_threads(threads)
    try:
        stages, facts = build_stages(
            spec,
            passes,
            mode,
            alone,
            against_upstream,
            reference,
            inputs,
            capture_method,
            graph_index,
            final_only,
            pipeline,
            stage,
            post_pipeline,
            device,
        )
        out = measure(stages, repeats, warmup, device, compile, mode, progress)
        if kernels:
            for st, t in zip(stages, out.stages):
                t.kernels = stage_kernels(st, device or ("cuda" if torch.cuda.is_available() else "cpu"), mode)
    finally:
        torch.set_num_threads(old)
    out.threads = threads or (None if out.method == "cuda-events" else old)
    out.unchanged, out.upstream_options, out.bytes_packed = (
        facts["unchanged"],
        facts["upstream_options"],
        facts["bytes_packed"],
    )
    out.unchanged += [f"post:{n}" for n in facts.get("post_unchanged", [])]
    out.post_upstream_options = facts.get("post_upstream_options")
    return out
