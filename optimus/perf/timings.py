"""What a bench run times and what it measures: a :class:`Stage` (one graph with its inputs),
a :class:`StageTiming` per stage and the :class:`BenchResult` of the run, as the table
``optimus bench`` prints and the JSON ``optimus bench --json`` writes.

The protocol that fills them is :mod:`optimus_lens.perf.bench`; the stages of a pipeline
come from :mod:`optimus_lens.perf.stages`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch.fx import GraphModule

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
    "prepack" (``prepack_weights`` in inference, ``packed`` in training), "alone",
    "upstream" or "reference", and for the post-grad stages (the ATen forward and backward
    graphs run eagerly) "post-baseline", "post-pass", "post-inductor" (upstream's
    ``post_grad_passes`` with no Optimus options) or "post-upstream" (with the equivalent
    options). For a pass stage, ``previous`` names
    the stage its own effect is measured against and ``vs_previous`` (``_p10``, ``_p90``)
    is the per-round ratio of that stage's time to this one's (> 1: this pass made the
    graph faster; :func:`optimus_lens.perf.bench.paired_ratio`)."""

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
    #: with ``kernels``: what Inductor generates for the stage
    #: (:meth:`optimus_lens.perf.kernels.KernelCount.to_json`), or ``{"error": ...}``
    kernels: dict | None = None

    @property
    def noisy(self) -> bool:
        return self.p10_ms > 0 and self.p90_ms > NOISY_SPREAD * self.p10_ms

    @property
    def slowdown(self) -> bool:
        """The stage's own change is a slowdown beyond the measured noise: even the p90 of
        its per-round ratio to the stage before (:func:`optimus_lens.perf.bench.paired_ratio`) is below 1, i.e. it
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
        if self.kernels is not None:
            out["kernels"] = self.kernels
        return out

    def kernels_text(self) -> str:
        """What Inductor generated for the stage in words (kernels, launches, extern calls
        with their names); empty when not counted."""
        return "" if self.kernels is None else _kernel_text(self.kernels)

    def kernels_cell(self) -> str:
        """The kernels column: ``generated kernels + extern calls`` (``5+2``), ``-`` if not counted."""
        k = self.kernels
        if k is None:
            return "-"
        if "error" in k:
            return "error"
        return f"{k['kernels']}+{k['extern_calls']}"


@dataclass
class BenchResult:
    """A bench run: device name, timer ("cuda-events" | "wall-clock" | "thread-cpu-time"), the stages, and
    ``mode``, ``unchanged`` (enabled passes that made no step), ``threads`` (CPU threads),
    ``upstream_options`` (what the ``upstream`` stage ran), ``bytes_packed`` (pre-packed
    constants in inference, packed parameters in training; bytes)."""

    device: str
    method: str
    stages: list[StageTiming] = field(default_factory=list)
    mode: str = "inference"
    unchanged: list[str] = field(default_factory=list)
    threads: int | None = None
    upstream_options: dict | None = None
    bytes_packed: int = 0
    post_upstream_options: dict | None = None

    def stage(self, name: str) -> StageTiming | None:
        return next((s for s in self.stages if s.stage == name), None)

    @property
    def ours(self) -> StageTiming | None:
        """The stage of our full pipeline: the last cumulative stage (prepack included)."""
        ours = [s for s in self.stages if s.kind in ("baseline", "pass", "prepack")]
        return ours[-1] if ours else None

    @property
    def ours_post(self) -> StageTiming | None:
        """Our last post-grad stage (the ATen graphs after every post-grad pass), or None."""
        ours = [s for s in self.stages if s.kind in ("post-baseline", "post-pass")]
        return ours[-1] if ours else None

    def ratios(self) -> dict[str, float]:
        """Speed ratios of our pipeline (eager; ``+compiled`` keys under Inductor):
        ``ours_vs_upstream`` (upstream median / ours) and ``ours_vs_reference``
        (reference median / ours: 1.0 is the hand-fused speed) where those stages exist."""
        out: dict[str, float] = {}
        post, up = self.ours_post, next((s for s in self.stages if s.kind == "post-upstream"), None)
        if post is not None and up is not None:
            out["post_grad_ours_vs_upstream"] = up.median_ms / post.median_ms
            if up.compiled_median_ms and post.compiled_median_ms:
                out["post_grad_ours_vs_upstream_compiled"] = up.compiled_median_ms / post.compiled_median_ms
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
            "post_upstream_options": self.post_upstream_options,
            "bytes_packed": self.bytes_packed,
            "slowdowns": [s.stage for s in self.slowdowns()],
        }

    def table(self) -> str:
        """The result as a plain-text table (what ``optimus bench`` prints)."""
        compiled = any(s.compiled_median_ms is not None for s in self.stages)
        kernels = any(s.kernels is not None for s in self.stages)
        w = max([len("stage"), *(len(s.stage) for s in self.stages)])
        head = (
            f"{'stage':{w}s} {'nodes':>6s} {'median ms':>10s} {'p10..p90 ms':>17s} {'speedup':>8s} "
            f"{'vs prev (p10..p90)':>20s} {'peak MiB':>9s}"
        )
        if kernels:
            head += f" {'kernels+ext':>11s}"
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
            if kernels:
                row += f" {s.kernels_cell():>11s}"
            if compiled and s.compiled_median_ms is not None:
                row += f" {s.compiled_median_ms:11.3f} {s.compiled_speedup or 0:8.2f}x {s.compile_s or 0:9.1f}"
            rows.append(row)
        if kernels:
            rows.append("kernels+ext: kernels Inductor generated + extern (library) calls per call of the graph:")
            rows += [f"  {s.stage}: {s.kernels_text()}" for s in self.stages if s.kernels is not None]
        if self.unchanged:
            rows.append(f"no change (not timed): {', '.join(self.unchanged)}")
        for k, v in self.ratios().items():
            rows.append(f"{k.replace('_', ' ')}: {v:.2f}x")
        if self.bytes_packed:
            what = "packed parameters" if self.mode == "training" else "pre-packed weights"
            rows.append(f"{what}: {self.bytes_packed:,} bytes")
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


def _kernel_text(k: dict) -> str:
    if "error" in k:
        return f"not counted: {k['error']}"
    names = ", ".join(k["kernel_names"][:6]) + (
        f", ... {len(k['kernel_names']) - 6} more" if len(k["kernel_names"]) > 6 else ""
    )
    ext = ", ".join(f"{n} x{c}" for n, c in k["extern"].items())
    return (
        f"{k['kernels']} kernel(s), {k['launches']} launch(es)"
        + (f" ({names})" if names else "")
        + f"; {k['extern_calls']} extern call(s)"
        + (f": {ext}" if ext else "")
    )


@dataclass
class Stage:
    """A graph to time: ``label``, the GraphModule, its inputs (real tensors in
    placeholder order), ``kind`` (see :class:`StageTiming`) and ``steps``.

    An ATen stage (kinds in ``ATEN_KINDS``: the post-grad graphs) is a forward graph
    (``gm``, ``inputs``) and the graphs run after it in one timed call, ``after`` (the
    backward graph with its recorded saved activations and tangents): each is called as it
    is, under ``torch.no_grad``, whatever the mode (AOTAutograd's graphs carry no autograd)."""

    label: str
    gm: GraphModule
    inputs: tuple
    kind: str = "pass"
    steps: int = 0
    after: list[tuple[GraphModule, tuple]] = field(default_factory=list)

    @property
    def aten(self) -> bool:
        return self.kind in ATEN_KINDS

    def nodes(self) -> int:
        """Nodes of every graph of the stage."""
        return len(self.gm.graph.nodes) + sum(len(g.graph.nodes) for g, _ in self.after)


#: the kinds of ATen stages: the captured ATen graphs, after each post-grad pass, after
#: upstream's post_grad_passes with no Optimus options, and with the equivalent ones
ATEN_KINDS = ("post-baseline", "post-pass", "post-inductor", "post-upstream")
