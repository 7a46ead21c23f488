"""Sweeps: every model x configuration, each run isolated, one row per run.

    optimus sweep 'sample:*' 'hf:*' --configs configs.json --out sweeps/today --workers 2

A **configuration** (:class:`SweepConfig`) is a named pipeline setting: enabled passes,
passes switched off, pattern files added as last passes, the batch fusions' search
(``global`` / ``upstream``) and ``profitable_only``. A JSON list of them is read by
:func:`load_configs`; without one the sweep runs :data:`DEFAULT_CONFIG`.

A **run** (:class:`RunTask`, one model spec under one configuration) captures the
model, optionally records PyTorch's own pre-grad passes on the same capture
(``observe_upstream``), runs our pipeline with the sweep's verification, finds the first
failing step (from per-step checks, or by bisection when only the final graph fails),
optionally times the graph before and after (``bench``), saves the trace under
``DIR/traces/`` and writes its HTML report under ``DIR/reports/``. :func:`execute` turns
all of it into one plain-data row and never raises: a run that raises is a row with
status ``error``.

Every run has its own process (:func:`run_isolated`): a child of a forkserver that
imported torch once, with an address-space limit (``RLIMIT_AS``) and a wall-clock time
limit after which its process group is killed. A run that is killed or crashes is a
row with status ``failed`` and the reason, so one bad model never takes the sweep down.
Runs are spread over a local thread pool of ``workers`` slots (:func:`run_local`) or, with
``ray_address``, submitted as Ray tasks that each call :func:`run_isolated` on their
worker (:func:`run_ray`; Ray places them, nothing here schedules across machines),
their rows streamed back as they finish.

Rows are appended to ``DIR/results.jsonl`` by the driver alone as they arrive, keyed by
:func:`run_key`; a restarted sweep skips the keys already there
(``retry_failed`` re-runs those that errored or failed). ``DIR/summary.html`` is
rewritten after every row (:mod:`optimus_lens.sweep.summary`).

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

import json
import multiprocessing as mp
import multiprocessing.connection
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from hashlib import sha1
from importlib import resources
from pathlib import Path

#: ok: ran, nothing failed; verify_failed: a step or the final graph computes other
#: values; rolled_back: a pattern raised or left the graph invalid (its step was undone);
#: error: the run raised (bad spec, capture, upstream); failed: its process was killed,
#: crashed, hit the time or memory limit.
STATUSES = ("ok", "verify_failed", "rolled_back", "error", "failed")
#: fields that differ between two runs of the same work (times, where it ran)
TIMING_FIELDS = ("wall_s", "capture_s", "optimize_s", "latency", "host", "report_s")
CONFIG_KEYS = ("name", "passes", "skip", "pattern_files", "search", "profitable_only", "description")
GiB = 1 << 30


class SweepError(ValueError):
    """Bad sweep input: a configs or models file that cannot be read or is malformed,
    duplicate config names, an unknown pass, or no model at all."""


# ----------------------------------------------------------------------------- configs
@dataclass(frozen=True)
class SweepConfig:
    """A named pipeline setting. ``passes`` the enabled passes of the default pipeline
    (None: all; a pattern file's pass is named after its file), ``skip`` passes switched
    off, ``pattern_files`` files whose patterns run as extra last passes
    (:func:`optimus_lens.frontend.patternfile.pipeline_with`), ``search`` the batch fusions' search
    (None: each pattern's own, ``"global"``, ``"upstream"``), ``profitable_only`` skips
    fusions estimated to slow the graph down (:mod:`optimus_lens.passes.profit`)."""

    name: str = "default"
    passes: tuple[str, ...] | None = None
    skip: tuple[str, ...] = ()
    pattern_files: tuple[str, ...] = ()
    search: str | None = None
    profitable_only: bool = False
    description: str = ""

    @classmethod
    def from_json(cls, d: dict, where: str = "config") -> SweepConfig:
        """A config from its JSON object. Raises SweepError for unknown keys or wrong types."""
        if not isinstance(d, dict):
            raise SweepError(f"{where}: a config is a JSON object, not {type(d).__name__}")
        unknown = sorted(set(d) - set(CONFIG_KEYS))
        if unknown:
            raise SweepError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(CONFIG_KEYS)}")
        if not isinstance(d.get("name"), str) or not d["name"].strip():
            raise SweepError(f'{where}: every config needs a non-empty "name"')
        lists = {}
        for k in ("passes", "skip", "pattern_files"):
            v = d.get(k)
            if v is None:
                continue
            if not (isinstance(v, list) and all(isinstance(x, str) for x in v)):
                raise SweepError(f"{where} {d['name']!r}: {k} must be a list of strings")
            lists[k] = tuple(v)
        if d.get("search") not in (None, "global", "upstream"):
            raise SweepError(f'{where} {d["name"]!r}: search must be "global" or "upstream", not {d["search"]!r}')
        return cls(
            name=d["name"].strip(),
            search=d.get("search"),
            profitable_only=bool(d.get("profitable_only")),
            description=str(d.get("description", "")),
            **lists,
        )

    def to_json(self) -> dict:
        return {
            k: (list(v) if isinstance(v, tuple) else v)
            for k, v in asdict(self).items()
            if v not in (None, (), False, "") or k == "name"
        }

    def pipeline(self, cwd: str | None = None):
        """The :class:`optimus_lens.core.pipeline.Pipeline` this config runs; pattern files are read
        relative to ``cwd``. Raises KeyError (unknown pass) and PatternFileError."""
        from optimus_lens.frontend.patternfile import load_pattern_file, pipeline_with
        from optimus_lens.frontend.run import select_passes
        from optimus_lens.passes import default_pipeline

        pipe = default_pipeline(search=self.search, profitable_only=self.profitable_only)
        for f in self.pattern_files:
            pipe = pipeline_with(load_pattern_file(os.path.join(cwd or os.getcwd(), f)), base=pipe)
        if self.passes is not None or self.skip:
            pipe = pipe.only(
                select_passes(pipe.names(), list(self.passes) if self.passes is not None else None, list(self.skip))
            )
        return pipe


DEFAULT_CONFIG = SweepConfig("default", description="the default pipeline")


def load_configs(path: str | Path) -> list[SweepConfig]:
    """The configs of a JSON file: a list of config objects (or ``{"configs": [...]}``),
    each checked by building its pipeline. Raises SweepError naming the problem."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SweepError(f"cannot read configs {path}: {e}") from e
    if isinstance(data, dict) and "configs" in data:
        data = data["configs"]
    if not isinstance(data, list) or not data:
        raise SweepError(f"{path}: expected a non-empty JSON list of configs")
    configs = [SweepConfig.from_json(d, f"{path} entry {i}") for i, d in enumerate(data)]
    names = [c.name for c in configs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise SweepError(f"{path}: config names must be unique; repeated: {', '.join(dup)}")
    return configs


def check_configs(configs: list[SweepConfig], cwd: str | None = None) -> None:
    """Build every config's pipeline once, so a bad pass name or pattern file stops the
    sweep before any run. Raises SweepError."""
    from optimus_lens.frontend.patternfile import PatternFileError

    for c in configs:
        try:
            c.pipeline(cwd)
        except (KeyError, PatternFileError, ValueError) as e:
            raise SweepError(f"config {c.name!r}: {e.args[0] if isinstance(e, KeyError) else e}") from e


# ----------------------------------------------------------------------------- models
def expand_specs(specs: Iterable[str], models_file: str | None = None) -> list[str]:
    """The model specs of a sweep, in order, without repeats: ``specs`` then the lines of
    ``models_file`` (``#`` starts a comment). ``sample:*`` stands for every sample model
    and ``hf:*`` for every architecture of :mod:`optimus_lens.frontend.hf`. Raises SweepError for an
    unreadable models file, an unknown sample or HF architecture or a bad ``hf:`` size
    parameter (checked here, cheaply), or when no spec is left; other specs are loaded
    by their runs, where a failure is that run's row."""
    from optimus_lens.frontend.hf import HFSpecError, hf_list, parse_spec
    from optimus_lens.frontend.run import sample_list

    items = [s.strip() for s in specs]
    if models_file:
        try:
            text = Path(models_file).read_text()
        except OSError as e:
            raise SweepError(f"cannot read models file {models_file}: {e}") from e
        items += [line.split("#", 1)[0].strip() for line in text.splitlines()]
    out: list[str] = []
    for s in filter(None, items):
        if s == "sample:*":
            out += [f"sample:{n}" for n, _, _ in sample_list()]
        elif s == "hf:*":
            out += [spec for spec, _, _ in hf_list()]
        else:
            out.append(s)
    out = list(dict.fromkeys(out))
    samples = {n for n, _, _ in sample_list()}
    for s in out:
        if s.startswith("sample:") and s.removeprefix("sample:") not in samples:
            raise SweepError(f"unknown sample model {s!r}; `optimus samples` lists them")
        if s.startswith("hf:"):
            try:
                parse_spec(s)
            except HFSpecError as e:
                raise SweepError(str(e)) from e
    if not out:
        raise SweepError(
            "no model to sweep: give specs (sample:NAME, sample:*, hf:NAME, hf:*, pkg.mod:factory, "
            "file.py:factory, model.pt2) or --models-file"
        )
    return out


# ----------------------------------------------------------------------------- one run
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
    """``python -m optimus_lens.viz TRACE -o REPORT`` (``optimus report``; ``optimus`` never imports
    ``viz``) with this process's import path, within what is left of the time limit."""
    out = Path(task.out_dir)
    (out / "reports").mkdir(parents=True, exist_ok=True)
    rel = f"reports/{task.slug}.html"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    budget = max(5.0, task.options.time_limit_s - (row.get("capture_s") or 0) - (row.get("optimize_s") or 0) - 10)
    t = time.perf_counter()
    try:
        p = subprocess.run(
            [sys.executable, "-m", "optimus_lens.viz", str(out / row["trace"]), "-o", str(out / rel)],
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


# ----------------------------------------------------------------------------- isolation
_CTX_LOCK = threading.Lock()
_CTX: mp.context.BaseContext | None = None
_LIVE: set = set()  # child processes running now (killed on interrupt)
#: imported once by the fork server (Dynamo's and Inductor's modules cost seconds to import)
PRELOAD = [
    "torch",
    "torch._dynamo",
    "torch._inductor.fx_passes.pre_grad",
    "optimus_lens.frontend.run",
    "optimus_lens.passes",
    "optimus_lens.core.verify",
    "optimus_lens.frontend.capture",
    "optimus_lens.debug.bisect",
    "optimus_lens.debug.compare",
    "optimus_lens.perf.bench",
]


def _context():
    """The forkserver context children start from: torch, Dynamo, the engine (and
    ``transformers`` where installed) are imported once in the fork server, so a run
    starts in milliseconds, in a clean process."""
    global _CTX
    with _CTX_LOCK:
        if _CTX is None:
            import importlib.util

            ctx = mp.get_context("forkserver")
            ctx.set_forkserver_preload(PRELOAD + (["transformers"] if importlib.util.find_spec("transformers") else []))
            warm = ctx.Process(target=_noop, daemon=True)  # the server imports before its first fork:
            warm.start()  # wait for that here, not on a run's clock
            warm.join()
            _CTX = ctx
        return _CTX


def _noop() -> None:
    pass


def _child(task: RunTask, conn) -> None:
    os.setsid()  # its own process group: a time-out kills the report subprocess too
    lim = task.options.memory_limit_bytes
    if lim:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (lim if hard == resource.RLIM_INFINITY else min(lim, hard), hard))
    conn.send(execute(task))
    conn.close()


def _kill_group(p) -> None:
    for kill in (lambda: os.killpg(p.pid, signal.SIGKILL), p.kill):
        try:
            kill()
        except (ProcessLookupError, PermissionError, OSError):
            pass


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the run's process was killed by {name}" + (
            " (by hand, or by the kernel's out-of-memory killer)" if name == "SIGKILL" else ""
        )
    return f"the run's process exited with status {code} before reporting"


def run_isolated(task: RunTask) -> dict:
    """Run ``task`` in a child process (address-space limit ``memory_limit_bytes``, killed
    with its process group after ``time_limit_s``) and return its row; a child that dies
    or is killed gives a ``failed`` row with the reason. Never raises for the run's sake."""
    ctx = _context()
    recv, send = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_child, args=(task, send), name=f"optimus sweep {task.key}", daemon=True)
    t0 = time.monotonic()
    p.start()
    send.close()
    _LIVE.add(p)
    row, timed_out = None, False
    try:
        deadline = t0 + task.options.time_limit_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready = mp.connection.wait([recv, p.sentinel], timeout=left)
            if recv in ready or (p.sentinel in ready and recv.poll()):
                try:
                    row = recv.recv()
                except EOFError:
                    pass
                break
            if p.sentinel in ready:
                break
        if row is not None:
            p.join(10)
    finally:
        if p.is_alive() or row is None:
            _kill_group(p)
        p.join(10)
        _LIVE.discard(p)
        recv.close()
    if row is not None:
        return row
    wall = time.monotonic() - t0
    if timed_out:
        return failed_row(
            task, f"time limit of {task.options.time_limit_s:g} s reached; the run's process was killed", wall
        )
    return failed_row(task, _exit_reason(p.exitcode), wall)


def kill_live_runs() -> None:
    """Kill every run process this process started and that still runs (on interrupt)."""
    for p in list(_LIVE):
        _kill_group(p)


# ----------------------------------------------------------------------------- executors
def run_local(tasks: list[RunTask], workers: int, on_row: Callable[[dict], None]) -> None:
    """Run ``tasks`` ``workers`` at a time, each in its own process (:func:`run_isolated`),
    calling ``on_row`` in this thread as each finishes. On KeyboardInterrupt every live
    run is killed and the interrupt re-raised (finished rows are already reported)."""
    pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="optimus-sweep")
    futures = {pool.submit(run_isolated, t): t for t in tasks}
    try:
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                on_row(f.result())
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        kill_live_runs()
        raise
    pool.shutdown()


def ray_runtime_env(wheel: str | None = None) -> dict:
    """The Ray runtime environment that brings this package to the workers
    (``py_modules``: folders Ray zips, uploads and puts on the workers' path): the
    package folders of a built Optimus Lens wheel when ``wheel`` is given (unpacked here;
    Ray's own ``.whl`` support would ``pip install`` the wheel's dependencies, torch
    included, on every node), else this installation's ``optimus_lens`` package
    folder. Either way the workers need the dependencies (torch, and
    transformers for ``hf:`` models) installed. Raises SweepError for a wheel that is not
    a readable zip with a package in it."""
    if wheel:
        return {"py_modules": _wheel_packages(wheel)}
    return {"py_modules": [str(resources.files("optimus_lens"))]}


def _wheel_packages(wheel: str) -> list[str]:
    import tempfile
    import zipfile

    dest = Path(tempfile.mkdtemp(prefix="optimus-wheel-"))
    try:
        with zipfile.ZipFile(wheel) as z:
            z.extractall(dest)
    except (OSError, zipfile.BadZipFile) as e:
        raise SweepError(f"cannot unpack wheel {wheel}: {e}") from e
    pkgs = [
        str(p)
        for p in sorted(dest.iterdir())
        if p.is_dir() and not p.name.endswith((".dist-info", ".data")) and (p / "__init__.py").is_file()
    ]
    if not pkgs:
        raise SweepError(f"wheel {wheel} holds no Python package")
    return pkgs


def run_ray(
    tasks: list[RunTask], address: str, on_row: Callable[[dict], None], workers: int = 1, wheel: str | None = None
) -> None:
    """Submit ``tasks`` as Ray tasks (one CPU each) that call :func:`run_isolated` on their
    worker, calling ``on_row`` with each row as it finishes (``ray.wait``). ``address`` is
    ``"local"`` (start a Ray instance on this machine with ``workers`` CPUs) or a cluster
    address (``"auto"``, ``"ray://host:10001"``). The package travels in the runtime
    environment (:func:`ray_runtime_env`). A task whose worker dies is a ``failed`` row.
    Raises ImportError (with the install command) when Ray is missing."""
    try:
        import ray
    except ImportError as e:
        raise ImportError("--ray needs Ray: pip install 'optimus-lens[sweep]'") from e
    env = ray_runtime_env(wheel)
    if address == "local":
        ray.init(
            address="local", num_cpus=max(1, workers), include_dashboard=False, log_to_driver=False, runtime_env=env
        )
    else:
        ray.init(address=address, log_to_driver=False, runtime_env=env)
    try:
        remote = ray.remote(num_cpus=1, max_retries=0)(run_isolated)
        refs = {remote.remote(t): t for t in tasks}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                try:
                    row = ray.get(ref)
                except Exception as e:  # noqa: BLE001 - a lost worker loses only its run
                    row = failed_row(refs[ref], f"the Ray task failed: {type(e).__name__}: {str(e)[:2000]}")
                on_row(row)
    except BaseException:
        for ref in refs:
            ray.cancel(ref, force=True)
        raise
    finally:
        ray.shutdown()


# ----------------------------------------------------------------------------- results
class Results:
    """``DIR/results.jsonl``: one JSON row per line, appended by the driver only. A key
    that appears more than once (a retried run) counts with its last row."""

    def __init__(self, out_dir: str | Path):
        self.path = Path(out_dir) / "results.jsonl"

    def rows(self) -> dict[str, dict]:
        """key -> last row; a line that is not JSON (a write cut short) is skipped."""
        out: dict[str, dict] = {}
        if not self.path.exists():
            return out
        for line in self.path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and "key" in row:
                out[row["key"]] = row
        return out

    def append(self, row: dict) -> None:
        """Append ``row`` as one line (after a newline, where a write was cut short) and sync."""
        with self.path.open("a+b") as f:
            f.seek(0, os.SEEK_END)
            cut = f.tell() > 0 and (f.seek(-1, os.SEEK_END), f.read(1))[1] != b"\n"
            f.write((("\n" if cut else "") + json.dumps(row, sort_keys=True) + "\n").encode())
            f.flush()
            os.fsync(f.fileno())


def comparable(row: dict) -> dict:
    """``row`` less :data:`TIMING_FIELDS`: what two runs of the same work agree on."""
    return {k: v for k, v in row.items() if k not in TIMING_FIELDS}


@dataclass
class SweepOutcome:
    """A finished (or interrupted) sweep: the rows of its runs in model x config order
    (None for a run with no row yet), how many were skipped as already done, and the
    sweep's wall time (s)."""

    rows: list[dict | None]
    skipped: int
    wall_s: float
    out_dir: Path
    counts: dict = field(default_factory=dict)


def _line(row: dict) -> str:
    s = row["status"]
    if s in ("error", "failed"):
        return f"{row['key']}: {s}: {(row['error'] or '').splitlines()[0][:160]}"
    ff = row.get("first_failing")
    return (
        f"{row['key']}: {s} {row['nodes_before']} -> {row['nodes_after']} nodes, {row['steps']} steps, verify "
        f"{row['verify']}"
        + (f", first failing step {ff['index']} ({ff['pattern']})" if ff else "")
        + f" [{row['wall_s']:.1f} s]"
    )


def sweep(
    models: list[str],
    configs: list[SweepConfig],
    options: SweepOptions,
    out_dir: str | Path,
    workers: int = 1,
    ray_address: str | None = None,
    ray_wheel: str | None = None,
    retry_failed: bool = False,
    progress: bool = True,
) -> SweepOutcome:
    """Run every model x config not already in ``out_dir/results.jsonl`` (with
    ``retry_failed`` also those whose row is ``error`` / ``failed``), locally on
    ``workers`` processes or as Ray tasks (``ray_address``), appending each row as it
    arrives and rewriting ``summary.html``. A progress bar (tqdm, on stderr) counts
    done / failed / remaining, and one line per finished run is printed. Raises
    SweepError for bad configs; ImportError when Ray is asked for and missing."""
    from tqdm import tqdm

    from optimus_lens.sweep.summary import write_summary

    t0 = time.perf_counter()
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cwd = os.getcwd()
    check_configs(configs, cwd)
    all_configs = _save_configs(out, configs)
    results = Results(out)
    have = results.rows()
    tasks = [RunTask(m, c, options, str(out), cwd) for m in models for c in configs]
    redo = ("error", "failed") if retry_failed else ()
    todo = [t for t in tasks if t.key not in have or have[t.key].get("status") in redo]
    skipped = len(tasks) - len(todo)
    todo_keys = {t.key for t in todo}
    done_rows = {t.key: have[t.key] for t in tasks if t.key in have and t.key not in todo_keys}

    def counts() -> dict:
        c = Counter(r["status"] for r in done_rows.values())
        return {
            "ok": c["ok"],
            "not ok": sum(v for k, v in c.items() if k != "ok"),
            "remaining": len(tasks) - len(done_rows),
        }

    tty = sys.stderr.isatty()
    bar = tqdm(
        total=len(tasks),
        initial=skipped,
        unit="run",
        desc="sweep",
        file=sys.stderr,
        disable=not (progress and tty),
        dynamic_ncols=True,
    )
    bar.set_postfix(counts())

    def on_row(row: dict) -> None:
        results.append(row)
        done_rows[row["key"]] = row
        have[row["key"]] = row
        write_summary(out, list(have.values()), all_configs)
        c = counts()
        bar.set_postfix(c, refresh=False)
        bar.update(1)
        if progress:  # on a terminal above the bar; in a log, with the counts
            prefix = "" if tty else f"[{len(done_rows)}/{len(tasks)}: {c['ok']} ok, {c['not ok']} not ok] "
            bar.write(prefix + _line(row), file=sys.stderr)

    write_summary(out, list(have.values()), all_configs)
    try:
        if not todo:
            pass
        elif ray_address:
            run_ray(todo, ray_address, on_row, workers, ray_wheel)
        else:
            run_local(todo, workers, on_row)
    finally:
        bar.close()
    return SweepOutcome([done_rows.get(t.key) for t in tasks], skipped, time.perf_counter() - t0, out, counts())


def _save_configs(out: Path, configs: list[SweepConfig]) -> list[dict]:
    """Write ``DIR/configs.json``: every config any sweep into DIR ran, by name (the
    latest wins); returns its list."""
    path = out / "configs.json"
    try:
        known = {c["name"]: c for c in json.loads(path.read_text())}
    except (OSError, ValueError, TypeError, KeyError):
        known = {}
    known.update({c.name: c.to_json() for c in configs})
    path.write_text(json.dumps(list(known.values()), indent=1) + "\n")
    return list(known.values())


def load_sweep(out_dir: str | Path) -> tuple[list[dict], list[dict]]:
    """(rows, configs) of a sweep directory, rows in results.jsonl order (last row per
    key). Raises SweepError when ``out_dir`` holds no results.jsonl."""
    out = Path(out_dir)
    if not (out / "results.jsonl").is_file():
        raise SweepError(f"{out} is not a sweep directory: no results.jsonl in it")
    try:
        configs = json.loads((out / "configs.json").read_text())
    except (OSError, ValueError):
        configs = []
    return list(Results(out).rows().values()), configs
