"""The Pattern Lab's runner: user pattern code runs in a child ``optimus`` process with a
time limit, never in the app's own process, so a pattern that raises, loops or corrupts
the graph costs the user one message, not the app.

Streamlit-free so tests drive it directly. Each call writes the source to a temporary
pattern file, runs ``python -m optimus_lens match`` (preview) or ``run --pattern-file``
(apply) on the model spec, and returns a :class:`LabResult`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from optimus_lens.core.trace import Trace, TraceFormatError
from optimus_lens.frontend.patternfile import PatternInfo, Preview

#: default time limit of one lab action (s): capture, load, match or run together
TIME_LIMIT_S = 60.0
#: the stages a pattern file can be previewed and applied on (``optimus match --stage``)
STAGES = ("pre-grad", "post-grad")


@dataclass
class LabResult:
    """What a lab action gave: ``ok``; ``error`` (title, message) when not; the
    ``preview`` of a match, the ``trace`` (the matched graph with no steps for a preview,
    the recorded run for an apply); ``log`` is the child's printed output; ``seconds``
    its wall time (s). ``previews``: the preview of each graph matched (``"pre-grad"``, or
    post-grad ``"forward"`` and ``"backward"``), ``preview`` the first; ``patterns``: the
    Inductor patterns' own graphs (what each search function traced to); ``stage`` the
    stage it ran on."""

    ok: bool
    error: tuple[str, str] | None = None
    preview: Preview | None = None
    previews: dict[str, Preview] = field(default_factory=dict)
    patterns: list[PatternInfo] = field(default_factory=list)
    stage: str = "pre-grad"
    trace: Trace | None = None
    log: str = ""
    seconds: float = 0.0
    exit_code: int | None = None
    extra: dict = field(default_factory=dict)


def syntax_errors(source: str, filename: str = "pattern.py") -> list[dict]:
    """Parse ``source`` without running it: ``[]``, or one ``{"row", "column", "text"}``
    (0-based row and column, Ace-editor annotation form) for its syntax error."""
    try:
        compile(source, filename, "exec")
    except SyntaxError as e:
        return [
            {
                "row": max((e.lineno or 1) - 1, 0),
                "column": max((e.offset or 1) - 1, 0),
                "text": f"line {e.lineno}: {e.msg}",
                "type": "error",
            }
        ]
    return []


def default_stage(source: str) -> str:
    """The stage a source's patterns run on by default: ``post-grad`` for a file in Inductor's
    pattern language (a ``PatternMatcherPass`` runs on the ATen graphs, as Inductor's post-grad
    custom passes do), else ``pre-grad``. Read from the text, without running it."""
    return "post-grad" if "PatternMatcherPass" in source else "pre-grad"


def pass_name(name: str) -> str:
    """The pass (and file stem) a pattern named ``name`` runs as: ``name`` made a Python
    identifier (``my-pattern.py`` -> ``my_pattern``)."""
    stem = re.sub(r"\W", "_", Path(name).stem) or "my_pattern"
    return stem if not stem[0].isdigit() else f"p_{stem}"


def _run(args: list[str], source: str, name: str, time_limit_s: float, outputs: tuple[str, ...]) -> tuple:
    """Run ``python -m optimus_lens ARGS`` with the source as ``{tmp}/{name}.py``; the strings
    ``{file}`` and ``{out_<x>}`` in ``args`` are replaced by the file and output paths.
    Returns (exit code or None on timeout, combined output, output paths, seconds)."""
    import time

    tmp = Path(tempfile.mkdtemp(prefix="optimus_lab_"))
    path = tmp / f"{pass_name(name)}.py"
    path.write_text(source, encoding="utf-8")
    outs = {o: str(tmp / f"{o}.json") for o in outputs}
    argv = [a.replace("{file}", str(path)).format(**outs) if "{" in a else a for a in args]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    t0 = time.perf_counter()
    try:
        p = subprocess.run(
            [sys.executable, "-m", "optimus_lens", *argv],
            capture_output=True,
            text=True,
            timeout=time_limit_s,
            env=env,
            cwd=os.getcwd(),
        )
        code, log = p.returncode, (p.stdout + p.stderr)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        code, log = None, out
    return code, log, outs, time.perf_counter() - t0, path


def _failure(code: int | None, log: str, time_limit_s: float, what: str) -> tuple[str, str]:
    if code is None:
        return (
            f"{what} stopped after {time_limit_s:g} s",
            "The pattern ran past the lab's time limit (a loop that never ends?). It ran in a separate "
            "process, which was stopped; nothing in the app changed.",
        )
    lines = [ln for ln in log.strip().splitlines() if ln.startswith("optimus:")]
    message = "\n".join(ln.removeprefix("optimus: ") for ln in lines) or log.strip()[-2000:]
    title = {2: "The pattern file or the model could not be loaded", 3: "The pattern raised"}.get(
        code, f"{what} failed (exit status {code})"
    )
    return title, message


def preview(
    spec: str,
    source: str,
    name: str = "my_pattern",
    time_limit_s: float = TIME_LIMIT_S,
    stage: str = "pre-grad",
    mode: str = "inference",
) -> LabResult:
    """Every match and near miss of the source's patterns on ``spec``'s captured graph
    (``stage`` pre-grad) or its ATen graphs (post-grad: forward, and backward with ``mode``
    training), the graphs unchanged, and those graphs as a step-less trace for drawing (the
    first graph's Trace, the others in its ``graphs``)."""
    args = ["match", spec, "--pattern-file", "{file}", "--json", "{out_match}", "--trace", "{out_graph}"]
    code, log, outs, secs, _ = _run(
        [*args, "--misses", "0", "--stage", stage, "--mode", mode],
        source,
        name,
        time_limit_s,
        ("out_match", "out_graph"),
    )
    if code != 0:
        return LabResult(
            False, _failure(code, log, time_limit_s, "Preview"), log=log, seconds=secs, exit_code=code, stage=stage
        )
    try:
        data = json.loads(Path(outs["out_match"]).read_text())
        # pre-grad: one graph's matches at the top level; post-grad: one entry per ATen graph
        per_graph = data["graphs"] if "graphs" in data else {"pre-grad": data}
        previews = {g: Preview.from_json(d) for g, d in per_graph.items()}
        patterns = [PatternInfo.from_json(p) for p in data.get("patterns", [])]
        trace = Trace.load(outs["out_graph"])
    except (OSError, ValueError, KeyError, TypeError, TraceFormatError) as e:
        return LabResult(False, ("Preview output unreadable", str(e)), log=log, seconds=secs, exit_code=code)
    first = next(iter(previews.values()), None)
    return LabResult(
        True,
        preview=first,
        previews=previews,
        patterns=patterns,
        stage=stage,
        trace=trace,
        log=log,
        seconds=secs,
        exit_code=code,
    )


def apply(
    spec: str,
    source: str,
    name: str = "my_pattern",
    verify: str = "step",
    alone: bool = True,
    time_limit_s: float = TIME_LIMIT_S,
    passes: list[str] | None = None,
    capture: str = "dynamo",
    grads: bool = False,
    graph_index: int | None = None,
    stage: str = "pre-grad",
    mode: str = "inference",
) -> LabResult:
    """Run the source's patterns as a pass and return the recorded trace: ``passes`` names
    the passes to enable (the file's pass among them, :func:`pass_name`; an Inductor file's
    stem stands for all its ``PatternMatcherPass`` es); without it, ``alone`` runs only that
    pass, else it runs after the default pipeline. ``verify``, ``capture``, ``grads``,
    ``graph_index``, ``stage`` and ``mode`` are ``optimus run``'s ``--verify``, ``--capture``,
    ``--grads``, ``--graph``, ``--stage`` and ``--mode`` (post-grad: the steps are in the
    trace's ATen graphs, ``trace.graphs``). Exit status 1 (a step failed verification) still
    returns the trace, with ``ok`` False."""
    stem = pass_name(name)
    args = ["run", spec, "--pattern-file", "{file}", "--verify", verify, "--trace", "{out_trace}", "--capture", capture]
    args += ["--stage", stage, "--mode", mode]
    if passes is not None:
        args += ["--passes", ",".join(passes)]
    elif alone:
        args += ["--passes", stem]
    if grads:
        args.append("--grads")
    if graph_index is not None:
        args += ["--graph", str(graph_index)]
    code, log, outs, secs, _ = _run(args, source, name, time_limit_s, ("out_trace",))
    trace = None
    if code in (0, 1) and Path(outs["out_trace"]).exists():
        try:
            trace = Trace.load(outs["out_trace"])
        except TraceFormatError as e:
            return LabResult(False, ("Run output unreadable", str(e)), log=log, seconds=secs, exit_code=code)
    if code == 0:
        return LabResult(True, trace=trace, log=log, seconds=secs, exit_code=code, stage=stage)
    if code == 1 and trace is not None:
        failed = (
            ", ".join(f"{s.index}" + ("" if s.graph == "pre-grad" else f" ({s.graph})") for s in trace.all_failed())
            or "the final graph"
        )
        return LabResult(
            False,
            ("Verification failed", f"the rewritten graph differs from the original at step(s) {failed}"),
            trace=trace,
            log=log,
            seconds=secs,
            exit_code=code,
            stage=stage,
        )
    return LabResult(
        False, _failure(code, log, time_limit_s, "Apply"), log=log, seconds=secs, exit_code=code, stage=stage
    )


def why(
    spec: str,
    source: str,
    name: str,
    node: str,
    step: int | None = None,
    passes: list[str] | None = None,
    capture: str = "dynamo",
    graph_index: int | None = None,
    time_limit_s: float = TIME_LIMIT_S,
    stage: str = "pre-grad",
    mode: str = "inference",
) -> LabResult:
    """Every pattern's answer for ``node`` of the graph before ``step`` (None: the captured
    graph) in a dry run with the source's patterns as a pass (``optimus why --pattern-file
    ... --json``), in the child process: ``passes`` the enabled passes (None: all, the file's
    included; an Inductor file's stem stands for all its passes). ``stage`` post-grad: ``node``
    of an ATen graph (``GRAPH:NODE``, ``backward:mm_3``; ``step`` counts that graph's steps) in
    the post-grad pipeline's dry run, ``mode`` training for the backward graph (``optimus why
    --stage --mode``). The :class:`optimus_lens.debug.why.WhyReport` is in ``extra["why"]``; a
    node that is not there or a step out of range is an ``error`` with exit status 2."""
    from optimus_lens.debug.why import WhyReport

    args = ["why", spec, node, "--pattern-file", "{file}", "--capture", capture, "--json", "{out_why}"]
    args += ["--stage", stage, "--mode", mode]
    if step is not None:
        args += ["--step", str(step)]
    if passes is not None:
        args += ["--passes", ",".join(passes)]
    if graph_index is not None:
        args += ["--graph", str(graph_index)]
    code, log, outs, secs, _ = _run(args, source, name, time_limit_s, ("out_why",))
    if code != 0:
        return LabResult(False, _failure(code, log, time_limit_s, "Why not"), log=log, seconds=secs, exit_code=code)
    try:
        report = WhyReport.from_json(json.loads(Path(outs["out_why"]).read_text()))
    except (OSError, ValueError, KeyError, TypeError) as e:
        return LabResult(False, ("Why-not output unreadable", str(e)), log=log, seconds=secs, exit_code=code)
    return LabResult(True, log=log, seconds=secs, exit_code=code, extra={"why": report})


def bench(
    spec: str,
    source: str,
    name: str = "my_pattern",
    repeats: int = 30,
    time_limit_s: float = 3 * TIME_LIMIT_S,
    stage: str = "pre-grad",
    mode: str = "inference",
) -> LabResult:
    """Time the captured graph against the graph after the source's pass (``optimus bench
    --pattern-file ... --passes NAME``, one thread), in the child process; ``stage`` post-grad
    times the ATen graph before and after the file's passes (stages ``post:baseline``,
    ``post:PASS``), ``mode`` training forward and backward (``--stage``, ``--mode``). The stages'
    JSON is in ``extra["bench"]`` (see :meth:`optimus_lens.perf.timings.BenchResult.to_json`)."""
    stem = pass_name(name)
    code, log, outs, secs, _ = _run(
        [
            "bench",
            spec,
            "--stage",
            stage,
            "--mode",
            mode,
            "--pattern-file",
            "{file}",
            "--passes",
            stem,
            "--threads",
            "1",
            "--repeats",
            str(repeats),
            "--no-reference",
            "--json",
            "{out_bench}",
        ],
        source,
        name,
        time_limit_s,
        ("out_bench",),
    )
    if code != 0:
        return LabResult(False, _failure(code, log, time_limit_s, "Timing"), log=log, seconds=secs, exit_code=code)
    try:
        data = json.loads(Path(outs["out_bench"]).read_text())
    except (OSError, ValueError) as e:
        return LabResult(False, ("Timing output unreadable", str(e)), log=log, seconds=secs, exit_code=code)
    return LabResult(True, log=log, seconds=secs, exit_code=code, extra={"bench": data})
