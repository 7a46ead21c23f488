"""One run of a sweep: a model spec under one configuration (:class:`RunTask`), done in this
process by :func:`execute` into one plain-data row.

A run captures the model, optionally records PyTorch's own pre-grad passes on the same
capture (``observe_upstream``), runs our pipeline with the sweep's verification, finds the
first failing step (from per-step checks, or by bisection when only the final graph
fails), optionally times the graph before and after (``bench``), saves the trace under
``DIR/traces/`` and writes its HTML report under ``DIR/reports/``. :func:`execute` never
raises: a run that raises is a row with status ``error``.

Row fields (``status`` one of :data:`STATUSES`): ``key``, ``model``, ``config``,
``status``, ``error``, ``nodes_before``, ``nodes_after``, ``graphs``, ``graph_breaks``,
``steps``, ``steps_per_pattern`` ({pattern: steps}), ``rolled_back``, ``verify``
("ok" / "FAIL" / "off" / "not checked"), ``max_abs_err``, ``first_failing`` ({index,
pass, pattern, sites} or None), ``upstream`` ({nodes_after, steps, only_ours,
only_upstream, defects, passes_differing} or None), ``latency`` ({baseline_ms, ours_ms,
speedup, ...} or None), ``trace``, ``upstream_trace`` and ``report`` (paths relative to
DIR, or None), ``report_error``, and the timing fields :data:`TIMING_FIELDS`.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from hashlib import sha1
from pathlib import Path

from optimus_lens.sweep.configs import SweepConfig

#: ok: ran, nothing failed; verify_failed: a step or the final graph computes other
#: values; rolled_back: a pattern raised or left the graph invalid (its step was undone);
#: error: the run raised (bad spec, capture, upstream); failed: its process was killed,
#: crashed, hit the time or memory limit.
STATUSES = ("ok", "verify_failed", "rolled_back", "error", "failed")
#: fields that differ between two runs of the same work (times, where it ran)
TIMING_FIELDS = ("wall_s", "capture_s", "optimize_s", "latency", "host", "report_s")
GiB = 1 << 30


@dataclass(frozen=True)
class SweepOptions:
    """What every run does. ``verify``: "step" | "end" | "off"; ``observe_upstream``:
    also record PyTorch's pre-grad passes on the capture and compare; ``bench``: time the
    captured graph and ours (CPU, one thread, ``bench_repeats`` rounds); ``reports``:
    write each run's HTML report; ``time_limit_s`` (s) and ``memory_limit_bytes``
    (address space, None: unlimited) bound each run's process; ``threads``: torch CPU
    threads per run (1 keeps parallel runs from competing and numbers reproducible)."""

    verify: str = "end"
    observe_upstream: bool = False
    bench: bool = False
    bench_repeats: int = 10
    reports: bool = True
    time_limit_s: float = 600.0
    memory_limit_bytes: int | None = 8 * GiB
    threads: int = 1


def run_key(model: str, config: str) -> str:
    """The key a run is stored under in results.jsonl: model spec and config name."""
    return f"{model} @ {config}"


def _slug(key: str) -> str:
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", key.replace(" @ ", "__")).strip("_")[:80]
    return f"{base}-{sha1(key.encode()).hexdigest()[:8]}"


@dataclass(frozen=True)
class RunTask:
    """One run, as plain picklable data: ``model`` as the user wrote it, ``config``,
    ``options``, the sweep's absolute ``out_dir`` and the ``cwd`` that relative model
    files and pattern files are resolved from."""

    model: str
    config: SweepConfig
    options: SweepOptions
    out_dir: str
    cwd: str

    @property
    def key(self) -> str:
        return run_key(self.model, self.config.name)

    @property
    def slug(self) -> str:
        return _slug(self.key)

    @property
    def load_spec(self) -> str:
        """The spec to load: a file spec (``x.py:f``, ``x.pt2``) made absolute against ``cwd``."""
        m = self.model
        if m.endswith(".pt2"):
            return os.path.join(self.cwd, m)
        head, sep, attr = m.rpartition(":")
        if sep and head.endswith(".py"):
            return f"{os.path.join(self.cwd, head)}:{attr}"
        return m


def _base_row(task: RunTask) -> dict:
    return {
        "key": task.key,
        "model": task.model,
        "config": task.config.name,
        "status": None,
        "error": None,
        "nodes_before": None,
        "nodes_after": None,
        "graphs": None,
        "graph_breaks": None,
        "steps": None,
        "steps_per_pattern": {},
        "rolled_back": None,
        "verify": None,
        "max_abs_err": None,
        "first_failing": None,
        "upstream": None,
        "latency": None,
        "trace": None,
        "upstream_trace": None,
        "report": None,
        "report_error": None,
        "wall_s": None,
        "capture_s": None,
        "optimize_s": None,
        "report_s": None,
        "host": socket.gethostname(),
    }


def failed_row(task: RunTask, reason: str, wall_s: float | None = None) -> dict:
    """The row of a run whose process died or never reported: status ``failed``."""
    row = _base_row(task)
    row.update(status="failed", error=reason, wall_s=None if wall_s is None else round(wall_s, 3))
    return row


def _is_memory_error(e: BaseException) -> bool:
    return isinstance(e, MemoryError) or "can't allocate memory" in str(e) or "std::bad_alloc" in str(e)


def execute(task: RunTask) -> dict:
    """Do one run in this process and return its row (see the module doc); never raises.

    A MemoryError (or torch's allocator refusing) becomes status ``failed`` with the
    memory limit as reason; any other exception status ``error`` with its type and
    message."""
    t0 = time.perf_counter()
    row = _base_row(task)
    try:
        _run(task, row)
    except Exception as e:  # noqa: BLE001 - every failure of a run is its row
        msg = f"{type(e).__name__}: {e}".strip()[:4000]
        if _is_memory_error(e):
            lim = task.options.memory_limit_bytes
            row.update(status="failed", error=f"memory limit{f' ({lim / GiB:g} GiB)' if lim else ''} reached: {msg}")
        else:
            row.update(status="error", error=msg)
    row["wall_s"] = round(time.perf_counter() - t0, 3)
    return row


def _verify_text(v) -> tuple[str, float | None]:
    if v is None or v.ok is None:
        return ("off" if v is None else "not checked"), None
    return ("ok" if v.ok else "FAIL"), v.max_abs_err


def _run(task: RunTask, row: dict) -> None:
    import torch

    from optimus_lens.frontend.capture import capture
    from optimus_lens.frontend.run import load_model, optimize
    from optimus_lens.inductor.observe import observe
    from optimus_lens.perf.stages import upstream_options

    opts, out = task.options, Path(task.out_dir)
    torch.set_num_threads(opts.threads)
    pipe = task.config.pipeline(task.cwd)
    model, inputs, name = load_model(task.load_spec)
    t = time.perf_counter()
    captured = capture(model, inputs)
    row.update(
        capture_s=round(time.perf_counter() - t, 3), graphs=len(captured.graphs), graph_breaks=len(captured.breaks)
    )
    up, up_error = None, None
    if opts.observe_upstream:  # on a copy: captured.gm stays the captured graph
        try:
            up = observe(
                task.model,
                options=upstream_options([p.name for p in pipe.enabled()]),
                verify=opts.verify != "off",
                captured=captured,
            )
        except Exception as e:  # noqa: BLE001 - upstream raising outside its rules is a finding, not our failure
            up_error = f"PyTorch's pre-grad passes raised {type(e).__name__}: {e}"[:2000]
    t = time.perf_counter()
    res = optimize(task.model, verify=opts.verify, pipeline=pipe, captured=captured)
    row["optimize_s"] = round(time.perf_counter() - t, 3)
    tr = res.trace
    row.update(
        nodes_before=tr.nodes_before,
        nodes_after=tr.nodes_after,
        steps=len(tr.steps),
        steps_per_pattern=dict(sorted(Counter(s.pattern for s in tr.steps if not s.error).items())),
        rolled_back=sum(1 for s in tr.steps if s.error),
    )
    row["verify"], row["max_abs_err"] = _verify_text(tr.final_verify)
    row["first_failing"] = _first_failing(tr, captured.example_inputs, opts.verify)
    final_bad = tr.final_verify is not None and tr.final_verify.ok is False
    if final_bad or any(s.verify is not None and s.verify.ok is False for s in tr.steps):
        row["status"] = "verify_failed"
    else:
        row["status"] = "rolled_back" if row["rolled_back"] else "ok"
    (out / "traces").mkdir(parents=True, exist_ok=True)
    row["trace"] = f"traces/{task.slug}.json"
    tr.save(out / row["trace"])
    if up is not None:
        row["upstream"] = _upstream_fields(tr, up)
        row["upstream_trace"] = f"traces/{task.slug}.upstream.json"
        up.trace.save(out / row["upstream_trace"])
    elif up_error:
        row["upstream"] = {"error": up_error}
    if opts.bench:
        try:
            row["latency"] = _latency(task, pipe)
        except Exception as e:  # noqa: BLE001 - a graph that cannot be timed keeps its other findings
            if _is_memory_error(e):
                raise
            row["latency"] = {"error": f"{type(e).__name__}: {e}"[:2000]}
    if opts.reports:
        _write_report(task, row)


def _first_failing(tr, example_inputs: tuple, verify: str) -> dict | None:
    """The first step that failed verification or was rolled back: read from per-step
    checks, or (``verify="end"`` with a failing final graph) found by bisection."""
    from optimus_lens.debug.bisect import bisect_trace
    from optimus_lens.debug.rebuild import RebuildError

    failed = tr.failed_steps()
    index = failed[0].index if failed else None
    if verify == "end" and tr.final_verify is not None and tr.final_verify.ok is False:
        try:
            b = bisect_trace(tr, example_inputs)
        except RebuildError:
            b = None
        if b is not None and b.first_bad is not None:
            index = b.first_bad if index is None else min(index, b.first_bad)
    if index is None:
        return None
    s = tr.step(index)
    return {
        "index": s.index,
        "pass": s.pass_name,
        "pattern": s.pattern,
        "sites": s.sites[:8],
        "rolled_back": s.error is not None,
    }


def _upstream_fields(ours, up) -> dict:
    from optimus_lens.debug.compare import compare_traces, group_rows

    c = compare_traces(ours, up.trace, up.options)
    return {
        "nodes_after": up.trace.nodes_after,
        "steps": len(up.trace.steps),
        "only_ours": len(c.only_ours),
        "only_upstream": len(c.only_upstream),
        "defects": len(c.upstream_defects),
        "passes_differing": [r["pass"] for r in group_rows(c) if not r["same groups"]],
    }


def _latency(task: RunTask, pipe) -> dict:
    """Baseline (captured graph) vs our pipeline, eager on CPU with one thread, medians in
    ms and ``speedup`` = baseline / ours; ``ours_vs_upstream`` / ``ours_vs_reference``
    where those stages exist (:meth:`optimus_lens.perf.timings.BenchResult.ratios`)."""
    from optimus_lens.perf.bench import bench_pipeline

    r = bench_pipeline(
        task.load_spec,
        repeats=task.options.bench_repeats,
        warmup=1,
        device="cpu",
        against_upstream=task.options.observe_upstream,
        threads=task.options.threads,
        final_only=True,
        pipeline=pipe,
    )
    base, ours = r.stage("baseline"), r.ours
    if base is None or ours is None:  # bench_pipeline always times both; a guard for the type checker
        raise RuntimeError("the bench result has no baseline or pipeline stage")
    out = {
        "baseline_ms": round(base.median_ms, 4),
        "ours_ms": round(ours.median_ms, 4),
        "speedup": round(base.median_ms / ours.median_ms, 4),
    }
    out.update({k: round(v, 4) for k, v in r.ratios().items()})
    return out


def _write_report(task: RunTask, row: dict) -> None:
    """``optimus report TRACE -o REPORT``, run as ``python -m optimus_lens`` with this process's
    import path, within what is left of the time limit: the sweep does not import ``viz``,
    which draws the report, and a drawing that takes too long is stopped with its process."""
    out = Path(task.out_dir)
    (out / "reports").mkdir(parents=True, exist_ok=True)
    rel = f"reports/{task.slug}.html"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    budget = max(5.0, task.options.time_limit_s - (row.get("capture_s") or 0) - (row.get("optimize_s") or 0) - 10)
    t = time.perf_counter()
    try:
        p = subprocess.run(
            [sys.executable, "-m", "optimus_lens", "report", str(out / row["trace"]), "-o", str(out / rel)],
            env=env,
            capture_output=True,
            text=True,
            timeout=budget,
            cwd=task.out_dir,
        )
        if p.returncode == 0:
            row["report"] = rel
        else:
            row["report_error"] = (p.stderr.strip().splitlines() or [f"exit status {p.returncode}"])[-1][:500]
    except subprocess.TimeoutExpired:
        row["report_error"] = f"the report took longer than {budget:.0f} s"
    row["report_s"] = round(time.perf_counter() - t, 3)
