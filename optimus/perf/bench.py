"""Per-pass timing and memory of a pipeline, measured side by side in one run.

Stages: ``baseline`` (the captured graph), then the graph after each enabled pass that
made a step (cumulative; passes without a step are listed as ``unchanged``, not timed),
then in inference ``prepack_weights`` (:mod:`optimus_lens.perf.prepack`). On request also each
pass alone (``alone:<pass>``), ``upstream`` (the captured graph after PyTorch Inductor's
own ``pre_grad_passes`` with the ``pre_grad_fusion_options`` equivalent to the enabled
passes, :func:`upstream_options`) and ``reference`` (a hand-fused model the sample
provides through an ``optimus_reference()`` method).

Protocol (the same on both devices):

* every variant (a stage eager, and with ``compile`` the stage under ``torch.compile``
  with Inductor; compile time is the first call's wall time, s) is warmed up;
* then the variants are timed round-robin, one sample of each per round, the starting
  variant rotating from round to round, so drift on a noisy machine hits all alike and
  every ratio comes from one run; each figure is a median with its 10th/90th percentile;
* a pass's own effect is the per-round ratio of the stage before it to its stage
  (:func:`paired_ratio`; ``alone:<pass>`` against the baseline), median and p10..p90; a
  pass whose ratio is below 1 even at its p90 (slower in at least 9 of 10 rounds; at
  least ``MIN_FLAG_ROUNDS`` rounds) is flagged as a slowdown (:meth:`BenchResult.slowdowns`; a ``!`` line in the table, a
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
from torch.fx import GraphModule

from optimus_lens.perf import memory

MODES = ("inference", "training")
NOISY_SPREAD = 2.0  # p90 / p10 above this marks a stage's timing as noise-dominated
# fewest rounds for a slowdown flag: with fewer, p90 is the slowest round or next to it, and
# pure noise would make every round of some pass slower too often (1 in 2^5 with 5 rounds)
MIN_FLAG_ROUNDS = 10


@dataclass
class StageTiming:
    """One stage: latency in ms (median, p10, p90 over ``repeats`` samples), speedup over
    the baseline (baseline median / this median), peak memory in bytes and where that
    figure comes from ("cuda" measured; "estimate" from liveness; "estimate-forward", in
    training, the forward graph's liveness without what autograd saves), and with
    ``compile`` the same figures under ``torch.compile`` (Inductor) plus compile time (s);
    ``compiled_speedup`` is the compiled baseline's median over this stage's compiled
    median. ``steps``: steps the stage's pass made; ``kind``: "baseline", "pass",
    "prepack", "alone", "upstream" or "reference". For a pass stage, ``previous`` names
    the stage its own effect is measured against and ``vs_previous`` (``_p10``, ``_p90``)
    is the per-round ratio of that stage's time to this one's (> 1: this pass made the
    graph faster; :func:`paired_ratio`)."""

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
    compiled_p10_ms: float | None = None
    compiled_p90_ms: float | None = None
    compiled_speedup: float | None = None
    compiled_peak_bytes: int | None = None
    steps: int = 0
    kind: str = "pass"
    previous: str | None = None
    vs_previous: float | None = None
    vs_previous_p10: float | None = None
    vs_previous_p90: float | None = None

    @property
    def noisy(self) -> bool:
        return self.p10_ms > 0 and self.p90_ms > NOISY_SPREAD * self.p10_ms

    @property
    def slowdown(self) -> bool:
        """The stage's own change is a slowdown beyond the measured noise: even the p90 of
        its per-round ratio to the stage before (:func:`paired_ratio`) is below 1, i.e. it
        was slower than that stage in at least 9 of 10 rounds. Never with fewer than
        ``MIN_FLAG_ROUNDS`` rounds."""
        return self.vs_previous_p90 is not None and self.vs_previous_p90 < 1.0 and self.repeats >= MIN_FLAG_ROUNDS

    def slowdown_text(self) -> str:
        """One line naming the stage, its ratio to the stage before and the ratio's p10–p90."""
        what = "alone, against the captured graph" if self.kind == "alone" else f"after {self.previous}"
        return (
            f"slowdown: {self.stage} runs at {self.vs_previous:.2f}x the speed of the graph before it "
            f"({what}; per-round ratio p10..p90 {self.vs_previous_p10:.2f}..{self.vs_previous_p90:.2f})"
        )

    def to_json(self) -> dict:
        """The stage as the JSON ``optimus bench --json`` writes (see :meth:`BenchResult.to_json`)."""
        out = {
            "name": self.stage,
            "kind": self.kind,
            "nodes": self.nodes,
            "steps": self.steps,
            "latency_ms_median": self.median_ms,
            "latency_ms_p10": self.p10_ms,
            "latency_ms_p90": self.p90_ms,
            "repeats": self.repeats,
            "speedup_vs_baseline": self.speedup,
            "peak_bytes": self.peak_bytes,
            "peak_source": self.peak_source,
        }
        if self.vs_previous is not None:
            out.update(
                {
                    "previous": self.previous,
                    "vs_previous": self.vs_previous,
                    "vs_previous_p10": self.vs_previous_p10,
                    "vs_previous_p90": self.vs_previous_p90,
                    "slowdown": self.slowdown,
                }
            )
        if self.compiled_median_ms is not None:
            out.update(
                {
                    "compiled_latency_ms_median": self.compiled_median_ms,
                    "compiled_latency_ms_p10": self.compiled_p10_ms,
                    "compiled_latency_ms_p90": self.compiled_p90_ms,
                    "compile_s": self.compile_s,
                    "compiled_speedup_vs_baseline": self.compiled_speedup,
                    "compiled_peak_bytes": self.compiled_peak_bytes,
                }
            )
        return out


@dataclass
class BenchResult:
    """A bench run: device name, timer ("cuda-events" | "wall-clock" | "thread-cpu-time"), the stages, and
    ``mode``, ``unchanged`` (enabled passes that made no step), ``threads`` (CPU threads),
    ``upstream_options`` (what the ``upstream`` stage ran), ``bytes_packed``."""

    device: str
    method: str
    stages: list[StageTiming] = field(default_factory=list)
    mode: str = "inference"
    unchanged: list[str] = field(default_factory=list)
    threads: int | None = None
    upstream_options: dict | None = None
    bytes_packed: int = 0

    def stage(self, name: str) -> StageTiming | None:
        return next((s for s in self.stages if s.stage == name), None)

    @property
    def ours(self) -> StageTiming | None:
        """The stage of our full pipeline: the last cumulative stage (prepack included)."""
        ours = [s for s in self.stages if s.kind in ("baseline", "pass", "prepack")]
        return ours[-1] if ours else None

    def ratios(self) -> dict[str, float]:
        """Speed ratios of our pipeline (eager; ``+compiled`` keys under Inductor):
        ``ours_vs_upstream`` (upstream median / ours) and ``ours_vs_reference``
        (reference median / ours: 1.0 is the hand-fused speed) where those stages exist."""
        out: dict[str, float] = {}
        ours = self.ours
        if ours is None:
            return out
        for other in ("upstream", "reference"):
            s = self.stage(other)
            if s is None:
                continue
            out[f"ours_vs_{other}"] = s.median_ms / ours.median_ms
            if s.compiled_median_ms and ours.compiled_median_ms:
                out[f"ours_vs_{other}_compiled"] = s.compiled_median_ms / ours.compiled_median_ms
        return out

    def noise_warning(self) -> str | None:
        """A sentence when some stage's p90 is above NOISY_SPREAD x its p10, else None."""
        noisy = [s.stage for s in self.stages if s.noisy]
        if not noisy:
            return None
        return (
            f"noisy: p90 > 2x p10 for {len(noisy)} of {len(self.stages)} stages ({', '.join(noisy[:4])}"
            f"{' ...' if len(noisy) > 4 else ''}); speedups within that spread are noise (more --repeats, "
            "one thread, or a quieter machine)"
        )

    def slowdowns(self) -> list[StageTiming]:
        """The passes (cumulative, ``prepack_weights`` and ``alone:`` stages) whose own
        measured effect is a slowdown beyond the noise (:attr:`StageTiming.slowdown`)."""
        return [s for s in self.stages if s.slowdown]

    def to_json(self) -> dict:
        """``{"device", "method", "mode", "threads", "stages": [...], "unchanged", "ratios",
        "upstream_options", "bytes_packed", "slowdowns"}``; each stage has ``name``,
        ``latency_ms_median`` / ``_p10`` / ``_p90``, ``peak_bytes``, ``speedup_vs_baseline``,
        for a pass stage ``previous``, ``vs_previous`` (median per-round ratio, > 1 faster)
        with ``_p10`` / ``_p90`` and ``slowdown``, and, when compiled, the ``compiled_*``
        figures and ``compile_s``. ``slowdowns`` lists the flagged stages' names."""
        return {
            "device": self.device,
            "method": self.method,
            "mode": self.mode,
            "threads": self.threads,
            "stages": [s.to_json() for s in self.stages],
            "unchanged": self.unchanged,
            "ratios": self.ratios(),
            "upstream_options": self.upstream_options,
            "bytes_packed": self.bytes_packed,
            "slowdowns": [s.stage for s in self.slowdowns()],
        }

    def table(self) -> str:
        """The result as a plain-text table (what ``optimus bench`` prints)."""
        compiled = any(s.compiled_median_ms is not None for s in self.stages)
        w = max([len("stage"), *(len(s.stage) for s in self.stages)])
        head = (
            f"{'stage':{w}s} {'nodes':>6s} {'median ms':>10s} {'p10..p90 ms':>17s} {'speedup':>8s} "
            f"{'vs prev (p10..p90)':>20s} {'peak MiB':>9s}"
        )
        if compiled:
            head += f" {'compiled ms':>11s} {'c.speedup':>9s} {'compile s':>9s}"
        rows = [head]
        for s in self.stages:
            prev = (
                ""
                if s.vs_previous is None
                else f"{s.vs_previous:.2f}x ({s.vs_previous_p10:.2f}..{s.vs_previous_p90:.2f})"
                + ("!" if s.slowdown else "")
            )
            row = (
                f"{s.stage:{w}s} {s.nodes:6d} {s.median_ms:10.3f} {s.p10_ms:8.3f}..{s.p90_ms:<8.3f} "
                f"{s.speedup:7.2f}x {prev:>20s} {s.peak_bytes / 2**20:9.2f}"
            )
            if compiled and s.compiled_median_ms is not None:
                row += f" {s.compiled_median_ms:11.3f} {s.compiled_speedup or 0:8.2f}x {s.compile_s or 0:9.1f}"
            rows.append(row)
        if self.unchanged:
            rows.append(f"no change (not timed): {', '.join(self.unchanged)}")
        for k, v in self.ratios().items():
            rows.append(f"{k.replace('_', ' ')}: {v:.2f}x")
        if self.bytes_packed:
            rows.append(f"pre-packed weights: {self.bytes_packed:,} bytes")
        rows += [f"! {s.slowdown_text()}" for s in self.slowdowns()]
        warn = self.noise_warning()
        if warn:
            rows.append(warn)
        threads = f", {self.threads} thread(s)" if self.threads else ""
        peak = (
            "measured"
            if self.method == "cuda-events"
            else "estimated from tensor liveness" + (" of the forward graph" if self.mode == "training" else "")
        )
        rows.append(f"device {self.device}{threads}, {self.mode}, {self.method}; peak memory {peak}")
        return "\n".join(rows)


@dataclass
class Stage:
    """A graph to time: ``label``, the GraphModule, its inputs (real tensors in
    placeholder order), ``kind`` (see :class:`StageTiming`) and ``steps``."""

    label: str
    gm: GraphModule
    inputs: tuple
    kind: str = "pass"
    steps: int = 0


# ------------------------------------------------------------------------ measuring


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
            len(st.gm.graph.nodes),
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
    if kind not in ("pass", "prepack"):
        return None
    return next((j for j in range(i - 1, -1, -1) if stages[j].kind in ("baseline", "pass", "prepack")), None)


# ------------------------------------------------------------------------ stages


def upstream_options(pass_names: list[str]) -> dict:
    """The ``pre_grad_fusion_options`` equivalent to our enabled passes ``pass_names``:
    each name upstream knows (:func:`optimus_lens.inductor.observe.known_pre_grad_passes`), a batch
    fusion with our search options for it (``min_fuse_set_size``,
    ``max_fuse_search_depth``), and for our ``split_cat_cleanup`` upstream's
    ``split_cat_pass`` and ``unbind_stack_pass``, which remove the same identity pairs."""
    from optimus_lens.core.pattern import REGISTRY
    from optimus_lens.inductor.observe import known_pre_grad_passes

    known = set(known_pre_grad_passes())
    opts: dict = {}
    for name in pass_names:
        if name == "split_cat_cleanup":
            opts.setdefault("split_cat_pass", {})
            opts.setdefault("unbind_stack_pass", {})
        elif name in known:
            p = REGISTRY.get(name)
            opts[name] = (
                {
                    "min_fuse_set_size": p.options.min_fuse_set_size,
                    "max_fuse_search_depth": p.options.max_fuse_search_depth,
                }
                if p is not None and p.kind == "batch"
                else {}
            )
    return opts


def _with_meta(gm: GraphModule, inputs: tuple) -> GraphModule:
    """Give nodes upstream created without an example value one, by fake propagation."""
    from optimus_lens.core import meta

    if all(meta.value(n) is not None for n in gm.graph.nodes if n.op not in ("output", "get_attr")):
        return gm
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    FakeTensorProp(gm, FakeTensorMode(allow_non_fake_inputs=True)).propagate(*inputs)
    return gm


def _trainable(inputs: tuple, n_user: int) -> tuple:
    """The reference's lifted weights (after the ``n_user`` user inputs) as leaf tensors that require grad."""
    return tuple(
        x
        if i < n_user or not isinstance(x, torch.Tensor) or not x.is_floating_point()
        else torch.nn.Parameter(x.detach().clone())
        for i, x in enumerate(inputs)
    )


def build_stages(
    spec,
    passes: list[str] | None = None,
    mode: str = "inference",
    alone: bool = False,
    against_upstream: bool = False,
    reference: bool = True,
    inputs: tuple | None = None,
    capture_method: str = "dynamo",
    graph_index: int | None = None,
    final_only: bool = False,
    pipeline=None,
) -> tuple[list[Stage], dict]:
    """Capture ``spec`` (a model spec, see :func:`optimus_lens.frontend.run.load_model`, or an nn.Module
    with ``inputs``) in ``mode``, run the pipeline keeping the graph after each pass, and
    return the stages to time plus facts for the result (``unchanged``,
    ``upstream_options``, ``bytes_packed``). See the module doc for the stages; with
    ``final_only`` the per-pass stages are left out but the last (the whole pipeline).
    ``pipeline`` replaces the default pipeline (e.g. with a pattern file's pass added by
    :func:`optimus_lens.frontend.patternfile.pipeline_with`). Raises ModelSpecError, CaptureError, KeyError
    (unknown pass), ValueError (mode)."""
    from optimus_lens.core.engine import Engine, RunOptions, copy_graph_module
    from optimus_lens.frontend.capture import capture
    from optimus_lens.frontend.run import model_and_inputs, optimize
    from optimus_lens.passes import default_pipeline
    from optimus_lens.perf.prepack import prepack

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    model, inputs, _ = model_and_inputs(spec, inputs)
    model.train(mode == "training")
    for p in model.parameters():
        p.requires_grad_(True)
    res = optimize(
        model,
        tuple(inputs),
        passes=passes,
        verify="off",
        record=False,
        keep_stages=True,
        capture_method=capture_method,
        graph_index=graph_index,
        pipeline=pipeline,
    )
    ins = res.captured.example_inputs
    per_pass: dict[str, int] = {}
    for s in res.trace.steps:
        per_pass[s.pass_name] = per_pass.get(s.pass_name, 0) + 1
    base = res.engine.stages[0][1]
    stages = [Stage("baseline", base, ins, "baseline")]
    stages += [Stage(name, gm, ins, "pass", per_pass[name]) for name, gm in res.engine.stages[1:] if name in per_pass]
    if final_only and len(stages) > 2:
        stages = [stages[0], Stage("pipeline", stages[-1].gm, ins, "pass", len(res.trace.steps))]
    enabled = [name for name, _ in res.engine.stages[1:]]
    facts: dict = {"unchanged": [n for n in enabled if n not in per_pass], "upstream_options": None, "bytes_packed": 0}
    if mode == "inference":
        packed = copy_graph_module(res.engine.gm)
        pk = prepack(packed, ins, guard=None)
        if pk.constants:
            stages.append(Stage("prepack_weights", packed, ins, "prepack", len(pk.constants)))
            facts["bytes_packed"] = pk.bytes_packed
    if alone:
        pipe = default_pipeline()
        for name in per_pass:
            eng = Engine(copy_graph_module(base), ins, pipe.only([name]), RunOptions(verify="off", record=False))
            eng.run()
            stages.append(Stage(f"alone:{name}", eng.gm, ins, "alone", len(eng.trace.steps)))
    if against_upstream:
        from optimus_lens.inductor.observe import run_upstream

        opts = upstream_options(enabled)
        up = run_upstream(base, ins, opts)
        stages.append(Stage("upstream", _with_meta(up.gm, ins), ins, "upstream", sum(up.fusions.values())))
        facts["upstream_options"] = opts
    make_ref = getattr(model, "optimus_reference", None)
    if reference and callable(make_ref):
        ref = make_ref()
        ref.train(mode == "training")
        n_user = len(inputs)
        c = capture(ref, tuple(inputs))
        rins = _trainable(c.example_inputs, n_user) if mode == "training" else c.example_inputs
        stages.append(Stage("reference", c.gm, rins, "reference"))
    return stages, facts


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
) -> BenchResult:
    """Build the stages (:func:`build_stages`) and time them (:func:`measure`): what
    ``optimus bench`` and the app's timing panel run. ``threads`` sets
    ``torch.set_num_threads`` for the run (restored after). ``capture_method`` and
    ``graph_index`` pick the same graph a run showed (graph breaks)."""
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
        )
        out = measure(stages, repeats, warmup, device, compile, mode, progress)
    finally:
        torch.set_num_threads(old)
    out.threads = threads or (None if out.method == "cuda-events" else old)
    out.unchanged, out.upstream_options, out.bytes_packed = (
        facts["unchanged"],
        facts["upstream_options"],
        facts["bytes_packed"],
    )
    return out
