"""The ``optimus`` command.

    optimus run MODEL [--passes a,b] [--skip c,d] [--verify step|end|off] [--grads] [--trace out.json]
                [--search global|upstream] [--profitable-only] [--estimate]
    optimus samples
    optimus passes
    optimus bench MODEL [--device cpu|cuda] [--mode inference|training] [--compile] [--against-upstream]
                  [--alone] [--passes a,b] [--repeats N] [--threads N] [--json out.json]
    optimus show TRACE.json
    optimus repro TRACE.json [--step N] [-o repro.py]
    optimus diff TRACE.json [--step N]
    optimus bisect MODEL [--verify off|step] [--trace out.json]
    optimus observe MODEL [--options JSON] [--verify step|off] [--trace out.json]
    optimus compare MODEL [--options JSON]
    optimus inspect TRACE.json NODE [--step N]
    optimus why MODEL NODE [--step N] [--pattern P] [--search global|upstream]
    optimus sweep SPECS... [--models-file F] [--configs F.json] [--verify step|end|off] [--observe-upstream]
                  [--bench] [--out DIR] [--workers N] [--ray ADDRESS] [--list-hf]
    optimus app [--port N] [--sweep DIR]

MODEL is ``sample:NAME`` (``optimus run sample:recsys_towers``; ``optimus samples`` lists
them), ``package.module:factory`` or ``path/to/file.py:factory`` (a callable returning
``(model, example_inputs)``, resolved from the current directory), or a ``.pt2`` file
saved by ``torch.export.save``, or ``hf:NAME`` (a HuggingFace architecture built offline with
random weights; ``optimus sweep --list-hf``).
Exit status: 0 ok; 1 a step failed verification; 2 bad input (unknown model or pass,
untraceable model, unreadable trace); 3 a pattern (or an observed upstream pass) raised.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

EXIT_VERIFY, EXIT_INPUT, EXIT_PATTERN = 1, 2, 3


def _fmt_verify(v) -> str:
    if v is None or v.ok is None:
        return "-" if v is None else v.checked
    if v.ok:
        return f"ok {v.max_abs_err:.1e}" if v.max_abs_err is not None else "ok"
    return "FAIL" + (f" {v.max_abs_err:.1e}" if v.max_abs_err is not None else "")


def steps_table(trace) -> str:
    """The steps of a trace as a plain-text table: index, pass, pattern, sites, created,
    erased, verify (ok / FAIL and the largest absolute error), ms (match + rewrite).
    Columns are as wide as their longest name."""
    wp = max([len("pass"), *(len(s.pass_name) for s in trace.steps)])
    wq = max([len("pattern"), *(len(s.pattern) for s in trace.steps)])
    head = (
        f"{'#':>4s}  {'pass':{wp}s} {'pattern':{wq}s} {'sites':>5s} {'created':>7s} {'erased':>6s}  "
        f"{'verify, max err':15s} {'ms':>7s}"
    )
    rows = [head, "-" * len(head)]
    for s in trace.steps:
        rows.append(
            f"{s.index:4d}  {s.pass_name:{wp}s} {s.pattern:{wq}s} {len(s.sites):5d} {len(s.created):7d} "
            f"{len(s.erased):6d}  {'rolled back' if s.error else _fmt_verify(s.verify):15s} "
            f"{(s.match_s + s.rewrite_s) * 1e3:7.2f}"
        )
    return "\n".join(rows)


def _passes_arg(text: str | None) -> list[str] | None:
    return [p.strip() for p in text.split(",") if p.strip()] if text else None


def _guarded(fn):
    """``(fn(), 0)``; or, after a message on stderr, ``(None, EXIT_INPUT)`` for bad input
    (unknown model, spec or pass, uncapturable model, unreadable pattern file, bad option)
    and ``(None, EXIT_PATTERN)`` for a pattern that raised."""
    from optimus_lens.core.engine import PatternError
    from optimus_lens.frontend.capture import CaptureError
    from optimus_lens.frontend.patternfile import PatternFileError
    from optimus_lens.frontend.run import ModelSpecError

    try:
        return fn(), 0
    except (ModelSpecError, CaptureError, PatternFileError, KeyError, ValueError) as e:
        print(f"optimus: {e.args[0] if isinstance(e, KeyError) else e}", file=sys.stderr)
        return None, EXIT_INPUT
    except PatternError as e:
        print(f"optimus: {e}", file=sys.stderr)
        return None, EXIT_PATTERN


def cmd_run(a) -> int:
    from optimus_lens.frontend.patternfile import load_pattern_file, pipeline_with
    from optimus_lens.frontend.run import optimize
    from optimus_lens.passes import default_pipeline

    def go():
        pipeline = default_pipeline(search=a.search, profitable_only=a.profitable_only)
        passes = _passes_arg(a.passes)
        if a.pattern_file:
            pipeline, passes = pipeline_with(load_pattern_file(a.pattern_file), passes, base=pipeline), None
        return optimize(
            a.model,
            passes=passes,
            skip=_passes_arg(a.skip),
            verify=a.verify,
            grads=a.grads,
            capture_method=a.capture,
            graph_index=a.graph,
            pipeline=pipeline,
            on_capture=lambda c: print(c.summary(), file=sys.stderr),
            dynamic=a.dynamic,
            on_error=a.on_error,
        )

    res, code = _guarded(go)
    if code:
        return code
    t = res.trace
    print(steps_table(t))
    print(
        f"\nnodes: {t.nodes_before} -> {t.nodes_after} in {len(t.steps)} steps "
        f"({', '.join(f'{p}: {len(t.steps_of_pass(p))}' for p in dict.fromkeys(s.pass_name for s in t.steps)) or 'nothing matched'})"
    )
    if t.steps and a.estimate:
        from optimus_lens.passes.profit import pass_estimates

        print("estimated effect per call (optimus_lens.passes.profit; CPU eager constants):")
        for name, e in pass_estimates(t).items():
            print(f"  {name:28s} {e.text()}")
    if t.final_verify is not None and t.final_verify.ok is not None:
        print(f"verify ({a.verify}): {_fmt_verify(t.final_verify)} {t.final_verify.message}".rstrip())
    if a.trace:
        n = t.save(a.trace)
        print(f"trace written to {a.trace} ({n:,} bytes)")
    failed = t.failed_steps() or ([] if not t.final_verify or t.final_verify.ok is not False else [None])
    for s in t.steps:
        if s.error:
            print(
                f"optimus: step {s.index} ({s.pattern} at {', '.join(s.sites[:4])}) was rolled back: "
                f"{s.error['kind']}: {s.error['type']}: {s.error['message']} [{s.error['source']}]",
                file=sys.stderr,
            )
    if failed:
        which = ", ".join(str(s.index) for s in failed if s is not None) or "the final graph"
        print(f"optimus: verification failed or rolled back at step(s) {which}", file=sys.stderr)
        return EXIT_VERIFY
    return 0


MODEL_HELP = (
    "sample:NAME (`optimus samples`), package.module:factory or path/to/file.py:factory "
    "(resolved from the current directory; the factory returns (model, example_inputs)), "
    "path/to/model.pt2 (saved by torch.export.save), or hf:NAME (`optimus sweep --list-hf`)"
)


def samples_text() -> str:
    """The sample models as an indented list: name, kind, description."""
    from optimus_lens.frontend.run import sample_list

    rows = sample_list()
    w = max(len(n) for n, _, _ in rows)
    return (
        "sample models (MODEL sample:NAME):\n"
        + "\n".join(f"  {n:{w}s}  {k:9s}  {d}" for n, k, d in rows)
        + "\n"
        + hf_text(short=True)
    )


def hf_text(short: bool = False) -> str:
    """The HuggingFace architectures of ``hf:NAME`` (:mod:`optimus_lens.frontend.hf`): one line, or a table."""
    from optimus_lens.frontend.hf import PARAMS, hf_list

    rows = hf_list()
    if short:
        return (
            f"HF architectures (MODEL hf:NAME, built offline with random weights; `optimus sweep --list-hf`): "
            f"{', '.join(s.removeprefix('hf:') for s, _, _ in rows)}"
        )
    w = max(len(s) for s, _, _ in rows)
    return (
        "HF transformers architectures, built offline from small configs with random weights\n"
        "(full size: hf:NAME?layers=12&hidden=768; parameters "
        + ", ".join(PARAMS)
        + "):\n"
        + "\n".join(f"  {s:{w}s}  {f:28s}  inputs: {k}" for s, f, k in rows)
    )


def cmd_samples(a) -> int:
    print(samples_text())
    return 0


def cmd_passes(a) -> int:
    from optimus_lens.passes import default_pipeline, pass_catalogue

    pipe = default_pipeline()
    in_pass = {p.name: q.name for q in pipe.passes for p in q.patterns}
    for p in pass_catalogue():
        where = (
            f"in pass {in_pass[p['name']]}"
            if p["name"] in in_pass
            else "not in the default pipeline (upstream_pipeline options only)"
        )
        print(f"{p['name']}  [{p['kind']} pattern, {where}]  {p['source']}")
        print(f"    {p['description']}")
        for c in p["preconditions"]:
            print(f"    - {c}")
        if p["upstream"]:
            print(f"    upstream: {p['upstream']}")
    return 0


def cmd_bench(a) -> int:
    from optimus_lens.frontend.patternfile import load_pattern_file, pipeline_with
    from optimus_lens.perf.bench import bench_pipeline

    if a.repeats < 1 or a.warmup < 0 or (a.threads is not None and a.threads < 1):
        print("optimus: --repeats and --threads must be at least 1, --warmup at least 0", file=sys.stderr)
        return EXIT_INPUT
    if a.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("optimus: --device cuda: CUDA is not available on this machine", file=sys.stderr)
            return EXIT_INPUT

    def progress(done: int, total: int, label: str) -> None:
        if a.progress:
            print(f"\r{done}/{total} {label[:60]:60s}", end="" if done < total else "\n", file=sys.stderr)

    def go():
        pipeline = pipeline_with(load_pattern_file(a.pattern_file)) if a.pattern_file else None
        return bench_pipeline(
            a.model,
            passes=_passes_arg(a.passes),
            repeats=a.repeats,
            warmup=a.warmup,
            compile=a.compile,
            device=a.device,
            mode=a.mode,
            alone=a.alone,
            against_upstream=a.against_upstream,
            reference=not a.no_reference,
            threads=a.threads,
            graph_index=a.graph,
            progress=progress,
            final_only=a.final_only,
            pipeline=pipeline,
        )

    r, code = _guarded(go)
    if code:
        return code
    print(r.table())
    print(
        f"graph timed: {f'graph {a.graph} (0-based)' if a.graph is not None else 'the one with the most nodes'} "
        "of the captured model (optimus run prints its graph breaks)"
    )
    if a.json:
        Path(a.json).write_text(json.dumps(r.to_json(), indent=1))
        print(f"result written to {a.json}")
    return 0


def cmd_show(a) -> int:
    from optimus_lens.core.trace import Trace, TraceFormatError

    try:
        t = Trace.load(a.trace)
    except (OSError, TraceFormatError) as e:
        print(f"optimus: cannot read {a.trace}: {e}", file=sys.stderr)
        return EXIT_INPUT
    print(f"model {t.model}: {t.nodes_before} -> {t.nodes_after} nodes")
    print(steps_table(t))
    return 0


def cmd_why(a) -> int:
    from optimus_lens.core.engine import PatternError
    from optimus_lens.debug.why import DryRun, WhyError
    from optimus_lens.frontend.capture import CaptureError, capture
    from optimus_lens.frontend.patternfile import PatternFileError, load_pattern_file, pipeline_with
    from optimus_lens.frontend.run import ModelSpecError, load_model
    from optimus_lens.passes import default_pipeline

    try:
        model, inputs, _ = load_model(a.model)
        gm = capture(model, inputs, method=a.capture, graph_index=a.graph).gm
        pipe = default_pipeline(search=a.search)
        if a.pattern_file:
            pipe = pipeline_with(load_pattern_file(a.pattern_file), base=pipe)
        if a.passes:
            pipe = pipe.only(_passes_arg(a.passes))
        report = DryRun(gm, pipe, a.step).explain(a.node, _passes_arg(a.pattern))
    except (ModelSpecError, CaptureError, WhyError, PatternFileError, KeyError, ValueError) as e:
        print(f"optimus: {e.args[0] if isinstance(e, KeyError) else e}", file=sys.stderr)
        return EXIT_INPUT
    except PatternError as e:
        print(f"optimus: {e}", file=sys.stderr)
        return EXIT_PATTERN
    print(report.text())
    return 0


def _load_trace(path: str):
    from optimus_lens.core.trace import Trace, TraceFormatError

    try:
        return Trace.load(path)
    except (OSError, TraceFormatError) as e:
        print(f"optimus: cannot read {path}: {e}", file=sys.stderr)
        return None


def _step_index(t, step: int | None) -> int | None:
    """``step`` checked against the trace (default: the first failing step, else the
    last); None (after a message) when there is no such step."""
    if step is None:
        failed = t.failed_steps()
        step = failed[0].index if failed else len(t.steps)
    if not 1 <= step <= len(t.steps):
        print(f"optimus: there is no step {step}; the trace has {len(t.steps)}", file=sys.stderr)
        return None
    return step


def _trace_and_step(a):
    """The trace ``a.trace`` and the step ``a.step`` checked against it (default: the first
    failing step, else the last); ``(trace or None, None)`` after a message when either is bad."""
    t = _load_trace(a.trace)
    return t, (None if t is None else _step_index(t, a.step))


def cmd_repro(a) -> int:
    from optimus_lens.debug.rebuild import RebuildError
    from optimus_lens.debug.repro import ReproError, repro_script

    t, index = _trace_and_step(a)
    if index is None:
        return EXIT_INPUT
    try:
        text = repro_script(t, index)
    except (ReproError, RebuildError) as e:
        print(f"optimus: {e}", file=sys.stderr)
        return EXIT_INPUT
    if a.output in (None, "-"):
        sys.stdout.write(text)
    else:
        Path(a.output).write_text(text)
        s = t.step(index)
        print(
            f"repro of step {index} ({s.pass_name} / {s.pattern}) written to {a.output}; run it with: python {a.output}"
        )
    return 0


def cmd_diff(a) -> int:
    from optimus_lens.debug.codediff import code_diff, diff_text
    from optimus_lens.debug.rebuild import RebuildError

    t, index = _trace_and_step(a)
    if index is None:
        return EXIT_INPUT
    try:
        lines = code_diff(t, index, context=a.context)
    except RebuildError as e:
        print(f"optimus: {e}", file=sys.stderr)
        return EXIT_INPUT
    s = t.step(index)
    color = a.color == "always" or (a.color == "auto" and sys.stdout.isatty())
    sys.stdout.write(diff_text(lines, f"step {index} ({s.pass_name} / {s.pattern})", color=color))
    return 0


def cmd_bisect(a) -> int:
    from optimus_lens.debug.bisect import bisect_trace, first_failing
    from optimus_lens.debug.rebuild import RebuildError
    from optimus_lens.frontend.run import optimize

    res, code = _guarded(
        lambda: optimize(
            a.model,
            passes=_passes_arg(a.passes),
            skip=_passes_arg(a.skip),
            verify=a.verify,
            grads=a.grads,
            capture_method=a.capture,
            graph_index=a.graph,
        )
    )
    if code:
        return code
    t = res.trace
    if a.trace:
        t.save(a.trace)
    try:
        b = first_failing(t) if a.verify == "step" else bisect_trace(t, res.captured.example_inputs, a.grads)
    except RebuildError as e:
        print(f"optimus: {e}", file=sys.stderr)
        return EXIT_INPUT
    if b.direct:
        print(f"{len(t.steps)} steps, each verified as it was applied")
    else:
        print(
            f"{b.steps} steps; checked {len(b.probes)} replayed graph(s) against the original (at most {b.max_probes}):"
        )
        for k, v in b.probes:
            print(f"  after step {k:4d}: {_fmt_verify(v)} {v.message.splitlines()[0] if v.message else ''}".rstrip())
    if b.first_bad is None:
        print(b.message)
        return 0
    s = t.step(b.first_bad)
    print(
        f"first failing step: {s.index} ({s.pass_name} / {s.pattern}) at {', '.join(s.sites[:8])}"
        + (" ..." if len(s.sites) > 8 else "")
    )
    if a.trace:
        print(f"next: optimus diff {a.trace} --step {s.index}; optimus repro {a.trace} --step {s.index} -o repro.py")
    return EXIT_VERIFY


def _options_arg(text: str | None) -> dict | None:
    """``--options`` JSON text -> dict (None: upstream's equivalent of our pipeline).
    Raises ValueError for text that is not a JSON object."""
    if text is None:
        return None
    try:
        opts = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--options is not JSON: {e}") from e
    if not isinstance(opts, dict):
        raise ValueError(f"--options must be a JSON object {{pass name: options}}, not {type(opts).__name__}")
    return opts


def _bad_input():
    from optimus_lens.frontend.capture import CaptureError
    from optimus_lens.frontend.run import ModelSpecError

    return (ModelSpecError, CaptureError, KeyError, TypeError, ValueError)


def cmd_observe(a) -> int:
    from optimus_lens.frontend.capture import CaptureError, capture
    from optimus_lens.frontend.run import ModelSpecError, load_model, observe
    from optimus_lens.inductor.observe import check_options, default_options

    try:
        options = _options_arg(a.options)
        options = default_options() if options is None else options
        check_options(options)
        model, inputs, name = load_model(a.model)
        captured = capture(model, inputs, method=a.capture, graph_index=a.graph)
    except (ModelSpecError, CaptureError, KeyError, TypeError, ValueError) as e:
        print(f"optimus: {e.args[0] if isinstance(e, KeyError) else e}", file=sys.stderr)
        return EXIT_INPUT
    try:
        res = observe(name, options=options, verify=a.verify == "step", captured=captured)
    except Exception as e:  # noqa: BLE001 - upstream's passes raising is itself the finding
        print(f"optimus: PyTorch Inductor's pre-grad passes raised {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_PATTERN
    t = res.trace
    print(
        f"PyTorch Inductor pre-grad passes (torch {t.capture.get('torch')}), pre_grad_fusion_options: "
        f"{', '.join(res.options) or 'none'}"
    )
    print(steps_table(t))
    print(f"\nnodes: {t.nodes_before} -> {t.nodes_after} in {len(t.steps)} upstream steps")
    if t.final_verify is not None and t.final_verify.ok is not None:
        first = t.final_verify.message.splitlines()[0] if t.final_verify.message else ""
        print(f"verify: {_fmt_verify(t.final_verify)} {first}".rstrip())
    for s, inherited in t.failure_runs():
        msg = s.verify.message.splitlines()[0] if s.verify.message else ""
        print(f"UPSTREAM DEFECT: step {s.index} ({s.pass_name} / {s.pattern}) fails verification: {msg}")
        if inherited:
            print(
                f"  (step(s) {', '.join(str(x.index) for x in inherited)} fail the same way only because the graph "
                f"is still broken from step {s.index})"
            )
    if a.trace:
        n = t.save(a.trace)
        print(f"trace written to {a.trace} ({n:,} bytes)")
    return EXIT_VERIFY if t.failed_steps() or (t.final_verify and t.final_verify.ok is False) else 0


def cmd_compare(a) -> int:
    from optimus_lens.core.engine import PatternError
    from optimus_lens.debug.compare import compare_model, comparison_text

    try:
        c = compare_model(a.model, _options_arg(a.options), capture_method=a.capture, graph_index=a.graph)
    except _bad_input() as e:
        print(f"optimus: {e.args[0] if isinstance(e, KeyError) else e}", file=sys.stderr)
        return EXIT_INPUT
    except PatternError as e:
        print(f"optimus: {e}", file=sys.stderr)
        return EXIT_PATTERN
    print(comparison_text(c))
    if a.trace:
        c.ours.save(f"{a.trace}.ours.json")
        c.upstream.save(f"{a.trace}.upstream.json")
        print(f"traces written to {a.trace}.ours.json and {a.trace}.upstream.json")
    return EXIT_VERIFY if c.upstream_defects or c.ours_failed else 0


def cmd_inspect(a) -> int:
    from optimus_lens.debug.inspect_node import NodeNotFound, node_info, node_info_text

    t = _load_trace(a.trace)
    if t is None:
        return EXIT_INPUT
    try:
        info = node_info(t, a.node, a.step)
    except (NodeNotFound, IndexError) as e:
        print(f"optimus: {e.args[0]}", file=sys.stderr)
        return EXIT_INPUT
    print(node_info_text(info))
    return 0


def app_command(port: int = 8501, host: str = "127.0.0.1", headless: bool = False) -> list[str]:
    """The command line that starts the Streamlit app on ``host``:``port``.

    The app runs user code (the Python-factory box, pattern files), so it listens on the
    loopback address unless another ``host`` is asked for explicitly."""
    app = Path(str(resources.files("optimus_lens.app") / "main.py"))
    cmd = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(app),
        "--server.port",
        str(port),
        "--server.address",
        host,
        "--browser.gatherUsageStats",
        "false",
    ]
    if headless:
        cmd += ["--server.headless", "true"]
    return cmd


def cmd_match(a) -> int:
    from optimus_lens.frontend.capture import CaptureError, capture
    from optimus_lens.frontend.patternfile import PatternFileError, PatternPreviewError, load_pattern_file, preview
    from optimus_lens.frontend.run import ModelSpecError, load_model

    try:
        pf = load_pattern_file(a.pattern_file)
        model, inputs, _ = load_model(a.model)
        gm = capture(model, inputs, method=a.capture, graph_index=a.graph).gm
    except (ModelSpecError, CaptureError, PatternFileError) as e:
        print(f"optimus: {e}", file=sys.stderr)
        return EXIT_INPUT
    try:
        found = preview(gm, pf.patterns)
    except PatternPreviewError as e:
        print(f"optimus: {e}", file=sys.stderr)
        return EXIT_PATTERN
    for p in pf.patterns:
        mine = [m for m in found.matches if m.pattern == p.name]
        near = [m for m in found.near_misses if m.pattern == p.name]
        print(f"{p.name}  ({p.source}): {len(mine)} match(es), {len(near)} near miss(es)")
        for m in mine:
            print(f"  match at {m.anchor}: {', '.join(m.sites)}")
        for m in near[: a.misses]:
            print(f"  no match at {m.node}: {m.reason}")
        if len(near) > a.misses:
            print(f"  ... {len(near) - a.misses} more near misses (--misses N shows more)")
    print(f"\n{len(found.matches)} match(es) in {len(gm.graph.nodes)} nodes; the graph is unchanged")
    if a.json:
        Path(a.json).write_text(json.dumps(found.to_json(), indent=1))
    if a.trace:
        from optimus_lens.core.record import snapshot_graph
        from optimus_lens.core.trace import Trace

        Trace(model=a.model, initial_graph=snapshot_graph(gm.graph)).save(a.trace)
    return 0


def cmd_sweep(a) -> int:
    """Every model x config in its own process; rows into DIR/results.jsonl, DIR/summary.html
    (:mod:`optimus_lens.sweep.runs`). Exit 0 when every run is ok, 1 when any is not, 2 for bad input."""
    from optimus_lens.sweep.runs import DEFAULT_CONFIG, GiB, SweepError, SweepOptions, expand_specs, load_configs, sweep

    if a.list_hf:
        print(hf_text())
        return 0
    if a.workers < 1 or a.time_limit <= 0 or a.memory_limit < 0 or a.bench_repeats < 1:
        print(
            "optimus: --workers, --time-limit and --bench-repeats must be positive, --memory-limit at least 0",
            file=sys.stderr,
        )
        return EXIT_INPUT
    try:
        models = expand_specs(a.specs, a.models_file)
        configs = load_configs(a.configs) if a.configs else [DEFAULT_CONFIG]
        options = SweepOptions(
            verify=a.verify,
            observe_upstream=a.observe_upstream,
            bench=a.bench,
            bench_repeats=a.bench_repeats,
            reports=not a.no_reports,
            time_limit_s=a.time_limit,
            memory_limit_bytes=int(a.memory_limit * GiB) or None,
        )
        print(
            f"sweep: {len(models)} model(s) x {len(configs)} config(s) into {a.out} "
            f"({'Ray at ' + a.ray if a.ray else f'{a.workers} local worker(s)'})",
            file=sys.stderr,
        )
        res = sweep(
            models,
            configs,
            options,
            a.out,
            workers=a.workers,
            ray_address=a.ray,
            ray_wheel=a.ray_wheel,
            retry_failed=a.retry_failed,
            progress=not a.quiet,
        )
    except (SweepError, ImportError) as e:
        print(f"optimus: {e}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        print(
            f"\noptimus: sweep interrupted; the finished runs are in {a.out}/results.jsonl, and the same command "
            "resumes it",
            file=sys.stderr,
        )
        return 130
    rows = [r for r in res.rows if r is not None]
    bad = [r for r in rows if r["status"] != "ok"]
    print(
        f"{len(rows)} runs ({res.skipped} already done, skipped) in {res.wall_s:.1f} s: "
        f"{len(rows) - len(bad)} ok, {len(bad)} not ok; results: {res.out_dir / 'results.jsonl'}, "
        f"summary: {res.out_dir / 'summary.html'}"
    )
    for r in bad:
        print(
            f"  {r['status']:13s} {r['key']}: "
            + (
                (r.get("error") or "").splitlines()
                or [f"first failing step {r['first_failing']['index']}" if r.get("first_failing") else ""]
            )[0][:200]
        )
    return EXIT_VERIFY if bad else 0


def _add_sweep_parser(sub) -> None:
    sw = sub.add_parser(
        "sweep",
        help="run every model x configuration, each in its own process (or as Ray "
        "tasks): one row per run in DIR/results.jsonl, DIR/summary.html, traces and reports",
    )
    sw.add_argument("specs", nargs="*", help=MODEL_HELP + "; sample:* is every sample, hf:* every HF architecture")
    sw.add_argument("--models-file", help="more specs, one per line (# starts a comment)")
    sw.add_argument(
        "--configs",
        help='JSON list of configs: {"name", "passes", "skip", "pattern_files", '
        '"search": global|upstream, "profitable_only"} (default: one config, the default pipeline)',
    )
    sw.add_argument(
        "--verify",
        choices=["step", "end", "off"],
        default="end",
        help="check every step, the final graph (default; a failing graph is bisected), or nothing",
    )
    sw.add_argument(
        "--observe-upstream",
        action="store_true",
        help="also record PyTorch's pre-grad passes on each capture and count the differences",
    )
    sw.add_argument("--bench", action="store_true", help="time the captured graph and ours (CPU, one thread)")
    sw.add_argument("--bench-repeats", type=int, default=10, help="timed rounds with --bench (default 10)")
    sw.add_argument(
        "--out",
        default="sweep-out",
        help="the sweep directory (default: sweep-out); a sweep "
        "restarted into it skips the runs already in its results.jsonl",
    )
    sw.add_argument("--workers", type=int, default=1, help="runs at a time (default 1; with --ray local, its CPUs)")
    sw.add_argument("--time-limit", type=float, default=600, help="seconds per run before it is killed (default 600)")
    sw.add_argument(
        "--memory-limit", type=float, default=8, help="GiB of address space per run (default 8; 0: no limit)"
    )
    sw.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run as Ray tasks: 'local' starts Ray here, or a cluster "
        "address ('auto', 'ray://host:10001'); needs pip install 'optimus-lens[sweep]'",
    )
    sw.add_argument(
        "--ray-wheel",
        help="ship the packages of this built Optimus Lens wheel to Ray workers instead of "
        "this checkout's folders (workers need torch installed)",
    )
    sw.add_argument("--no-reports", action="store_true", help="do not write each run's HTML report")
    sw.add_argument("--retry-failed", action="store_true", help="also re-run the runs whose row is error or failed")
    sw.add_argument("--quiet", action="store_true", help="no progress bar or per-run lines")
    sw.add_argument("--list-hf", action="store_true", help="list the hf:NAME architectures and exit")
    sw.set_defaults(fn=cmd_sweep)


def cmd_app(a) -> int:
    env = dict(os.environ)
    if a.model:
        env["OPTIMUS_LENS_MODEL"] = a.model
    if a.sweep:
        if not os.path.isfile(os.path.join(a.sweep, "results.jsonl")):
            print(
                f"optimus: {a.sweep} is not a sweep directory (no results.jsonl; `optimus sweep --out DIR` writes one)",
                file=sys.stderr,
            )
            return EXIT_INPUT
        env["OPTIMUS_LENS_SWEEP"] = os.path.abspath(a.sweep)
    if a.host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"optimus: warning: the app listens on {a.host}:{a.port}; anyone who can reach it can run Python "
            "code on this machine (model factories, pattern files)",
            file=sys.stderr,
        )
    return subprocess.call(app_command(a.port, a.host, a.headless), env=env)


def cmd_report(a) -> int:
    """Write the HTML report of a saved trace. The drawing lives in ``viz`` (which ``optimus``
    does not import), so this runs ``python -m optimus_lens.viz``; its exit status (2: bad input) is ours."""
    cmd = [sys.executable, "-m", "optimus_lens.viz", a.trace, "-o", a.output, "--hops", str(a.hops)]
    return subprocess.call(cmd, cwd=os.getcwd())


def cmd_lesson(a) -> int:
    """Write a pattern's walkthrough as an offline HTML lesson (``--all``: one per pattern).
    The drawing lives in ``viz``, so this runs ``python -m optimus_lens.viz.lesson``; an unknown pattern
    is refused here first (exit 2, the known ones listed)."""
    from optimus_lens.teach.lookup import predefined

    names = predefined()
    if a.all == bool(a.pattern) or (a.pattern and a.pattern not in names):
        what = f"unknown pattern {a.pattern!r}" if a.pattern and not a.all else "give one PATTERN or --all"
        print(f"optimus lesson: {what}; patterns: {', '.join(names)}", file=sys.stderr)
        return EXIT_INPUT
    cmd = [
        sys.executable,
        "-m",
        "optimus_lens.viz.lesson",
        *([a.pattern] if a.pattern else ["--all"]),
        "-o",
        a.output,
        "--repeats",
        str(a.repeats),
        "--text-scale",
        str(a.text_scale),
    ]
    return subprocess.call(cmd, cwd=os.getcwd())


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="optimus", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser(
        "run",
        help="capture a model and run the Optimus pipeline, one recorded step per match",
        epilog=samples_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument("model", help=MODEL_HELP)
    r.add_argument("--passes", help="comma-separated pass names to enable (`optimus passes` lists them; default: all)")
    r.add_argument("--skip", help="comma-separated pass names to switch off (applied after --passes)")
    r.add_argument(
        "--verify",
        choices=["step", "end", "off"],
        default="end",
        help="compare outputs with the original model after every step, once at the end (default), or never",
    )
    r.add_argument("--grads", action="store_true", help="also compare gradients")
    r.add_argument("--trace", help="write the trace JSON here")
    r.add_argument("--capture", choices=["dynamo", "symbolic"], default="dynamo")
    r.add_argument("--graph", type=int, default=None, help="with graph breaks: which graph (0-based)")
    r.add_argument(
        "--search",
        choices=["global", "upstream"],
        default=None,
        help="how batch fusions find groups: global (default; every independent group of one key) "
        "or upstream (PyTorch's bounded search, for parity)",
    )
    r.add_argument(
        "--profitable-only",
        action="store_true",
        help="skip fusions whose estimated effect per call is a slowdown (optimus_lens.passes.profit)",
    )
    r.add_argument(
        "--estimate",
        action="store_true",
        help="print each pass's estimated effect per call (kernels saved, bytes copied)",
    )
    r.add_argument(
        "--pattern-file",
        help="a pattern file (pattern/replacement functions or PATTERNS): its patterns "
        "run as one extra pass, named after the file, after the default pipeline (alone with --passes NAME)",
    )
    r.add_argument(
        "--dynamic",
        action="store_true",
        help="capture with dynamic shapes (Dynamo); verification also runs a second input shape",
    )
    r.add_argument(
        "--on-error",
        choices=["skip", "stop"],
        default="skip",
        dest="on_error",
        help="a step that raises or leaves the graph invalid is rolled back; then go on without "
        "that pattern at that site (default) or stop",
    )
    r.set_defaults(fn=cmd_run)
    m = sub.add_parser("samples", help="list the sample models (MODEL sample:NAME)")
    m.set_defaults(fn=cmd_samples)
    m = sub.add_parser("match", help="preview where a pattern file's patterns match a model's graph, changing nothing")
    m.add_argument("model", help="sample:NAME or package.module:factory")
    m.add_argument("--pattern-file", required=True, help="the pattern file (see docs/pattern-lab.md)")
    m.add_argument("--capture", choices=["dynamo", "symbolic"], default="dynamo")
    m.add_argument("--graph", type=int, default=None, help="with graph breaks: which graph (0-based)")
    m.add_argument("--misses", type=int, default=10, help="near misses to print per pattern (default: 10)")
    m.add_argument("--json", help="write the matches and near misses as JSON here")
    m.add_argument("--trace", help="write the graph the patterns were matched on as a trace with no steps")
    m.set_defaults(fn=cmd_match)
    p = sub.add_parser("passes", help="list the patterns with description, preconditions and source")
    p.set_defaults(fn=cmd_passes)
    b = sub.add_parser(
        "bench",
        help="time and size the graph after each pass, side by side in one run (CUDA events on GPU, wall clock on CPU)",
    )
    b.add_argument("model", help="sample:NAME or package.module:factory")
    b.add_argument("--passes", help="comma-separated pass names to enable (default: all)")
    b.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when available")
    b.add_argument(
        "--mode",
        choices=["inference", "training"],
        default="inference",
        help="inference: forward under no_grad, weights pre-packed (default); training: forward + "
        "backward, weights stacked per call",
    )
    b.add_argument("--compile", action="store_true", help="also time each stage under torch.compile (Inductor)")
    b.add_argument(
        "--against-upstream",
        action="store_true",
        help="add stage 'upstream': PyTorch's pre-grad passes with the equivalent pre_grad_fusion_options",
    )
    b.add_argument("--alone", action="store_true", help="also time each pass applied alone")
    b.add_argument(
        "--final-only",
        action="store_true",
        help="time the baseline and the whole pipeline only, not the graph after each pass",
    )
    b.add_argument("--no-reference", action="store_true", help="skip the model's hand-fused reference")
    b.add_argument("--repeats", type=int, default=20, help="timed rounds after warm-up (default: 20)")
    b.add_argument("--warmup", type=int, default=3, help="warm-up calls per variant (default: 3)")
    b.add_argument("--threads", type=int, default=None, help="torch CPU threads for the run (default: as is)")
    b.add_argument("--progress", action="store_true", help="show progress on stderr")
    b.add_argument("--json", help="write the result as JSON here")
    b.add_argument("--pattern-file", help="add a pattern file's patterns as a last pass (see run --pattern-file)")
    b.add_argument(
        "--graph",
        type=int,
        default=None,
        help="with graph breaks: which graph to time (0-based; default: the one with the most nodes)",
    )
    b.set_defaults(fn=cmd_bench)
    s = sub.add_parser("show", help="print the steps of a saved trace")
    s.add_argument("trace")
    s.set_defaults(fn=cmd_show)
    y = sub.add_parser(
        "why",
        help="for one node, what each pattern does with it in a dry run of the pipeline "
        "(fuses at step N with ..., or the reason it does not)",
    )
    y.add_argument("model")
    y.add_argument("node", help="FX node name, e.g. linear_3")
    y.add_argument(
        "--step",
        type=int,
        default=None,
        help="explain the node in the graph before step N of the run (default: the captured graph)",
    )
    y.add_argument("--pattern", help="comma-separated pattern names to answer for (default: every pattern)")
    y.add_argument("--pattern-file", help="also answer for this pattern file's patterns (run as a last pass)")
    y.add_argument("--passes", help="comma-separated pass names to enable (default: all)")
    y.add_argument(
        "--search",
        choices=["global", "upstream"],
        default=None,
        help="batch fusions' search (default: global; upstream: PyTorch's bounded search)",
    )
    y.add_argument("--capture", choices=["dynamo", "symbolic"], default="dynamo")
    y.add_argument("--graph", type=int, default=None, help="with graph breaks: which graph (0-based)")
    y.set_defaults(fn=cmd_why)
    o = sub.add_parser(
        "report",
        help="write a self-contained HTML report of a saved trace (before/after and diff "
        "of every step, left/right keys between steps)",
    )
    o.add_argument("trace", help="trace JSON written by `optimus run --trace` or the app")
    o.add_argument("-o", "--output", required=True, help="the HTML file to write")
    o.add_argument("--hops", type=int, default=2, help="neighbourhood hops of big graphs' views (default 2)")
    o.set_defaults(fn=cmd_report)
    rp = sub.add_parser(
        "repro", help="write a standalone script that replays one step of a trace and checks it (no model code needed)"
    )
    rp.add_argument("trace", help="trace JSON written by run --trace or observe --trace")
    rp.add_argument("--step", type=int, help="step index (default: the first failing step, else the last)")
    rp.add_argument("-o", "--output", help="write the script here (default: stdout)")
    rp.set_defaults(fn=cmd_repro)
    df = sub.add_parser(
        "diff",
        help="the GraphModule code before vs after one step, as a unified diff "
        "(> marks the lines of the step's sites and created nodes)",
    )
    df.add_argument("trace")
    df.add_argument("--step", type=int, help="step index (default: the first failing step, else the last)")
    df.add_argument("--context", type=int, default=3, help="unchanged lines around each change (default: 3)")
    df.add_argument("--color", choices=["auto", "always", "never"], default="auto")
    df.set_defaults(fn=cmd_diff)
    bi = sub.add_parser(
        "bisect",
        help="find the first step whose graph no longer matches the original (binary search over the replayed steps)",
    )
    bi.add_argument("model", help=MODEL_HELP)
    bi.add_argument("--passes", help="comma-separated pass names to enable (default: all)")
    bi.add_argument("--skip", help="comma-separated pass names to switch off")
    bi.add_argument(
        "--verify",
        choices=["off", "step"],
        default="off",
        help="off (default): run unverified, then check O(log steps) replayed graphs; "
        "step: verify every step while running and report the first failure",
    )
    bi.add_argument("--grads", action="store_true", help="also compare gradients")
    bi.add_argument("--trace", help="write the trace JSON here (for diff and repro)")
    bi.add_argument("--capture", choices=["dynamo", "symbolic"], default="dynamo")
    bi.add_argument("--graph", type=int, default=None, help="with graph breaks: which graph (0-based)")
    bi.set_defaults(fn=cmd_bisect)
    ob = sub.add_parser(
        "observe", help="record PyTorch Inductor's own pre-grad passes step by step, each step verified"
    )
    ob.add_argument("model", help=MODEL_HELP)
    ob.add_argument(
        "--options",
        help="pre_grad_fusion_options as JSON, e.g. '{\"batch_layernorm\": {}}' "
        "(default: upstream's equivalent of our default pipeline)",
    )
    ob.add_argument(
        "--verify",
        choices=["step", "off"],
        default="step",
        help="step (default): check every step where upstream leaves the graph sorted, and the result",
    )
    ob.add_argument("--trace", help="write the trace JSON here (show, diff, repro and the app read it)")
    ob.add_argument("--capture", choices=["dynamo", "symbolic"], default="dynamo")
    ob.add_argument("--graph", type=int, default=None, help="with graph breaks: which graph (0-based)")
    ob.set_defaults(fn=cmd_observe)
    cp = sub.add_parser("compare", help="our passes vs PyTorch Inductor's on the same captured graph")
    cp.add_argument("model", help=MODEL_HELP)
    cp.add_argument(
        "--options",
        help="pre_grad_fusion_options as JSON for both runs (default: our default pipeline vs upstream's equivalent)",
    )
    cp.add_argument("--trace", help="write both traces: TRACE.ours.json and TRACE.upstream.json")
    cp.add_argument("--capture", choices=["dynamo", "symbolic"], default="dynamo")
    cp.add_argument("--graph", type=int, default=None, help="with graph breaks: which graph (0-based)")
    cp.set_defaults(fn=cmd_compare)
    ins = sub.add_parser(
        "inspect",
        help="one node of a trace: op, args, shape, strides, dtype, module, inputs, "
        "users, source, and where it came from and went across the steps",
    )
    ins.add_argument("trace")
    ins.add_argument("node", help="FX node name, e.g. layer_norm_3")
    ins.add_argument(
        "--step",
        type=int,
        help="the graph after this many steps (default: the last graph holding the node; 0 is the captured graph)",
    )
    ins.set_defaults(fn=cmd_inspect)
    le = sub.add_parser(
        "lesson",
        help="write a pattern's walkthrough (what it looks for, the search, the match, "
        "the graph after, what it bought, a why-not exercise) as one offline HTML file",
    )
    le.add_argument("pattern", nargs="?", help="a predefined pattern (see `optimus passes`)")
    le.add_argument("--all", action="store_true", help="every predefined pattern: -o is a directory, DIR/PATTERN.html")
    le.add_argument("-o", "--output", required=True, help="the HTML file (a directory with --all)")
    le.add_argument("--repeats", type=int, default=7, help="latency samples per graph (default 7)")
    le.add_argument("--text-scale", type=float, default=1.0, help="text and zoom scale (1.7 suits a projector)")
    le.set_defaults(fn=cmd_lesson)
    w = sub.add_parser("app", help="start the Streamlit app")
    w.add_argument("--port", type=int, default=8501)
    w.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default: 127.0.0.1, this machine only; the app runs user code)",
    )
    w.add_argument("--model", help="sample model selected first, e.g. sample:bert (default sample:recsys_towers)")
    w.add_argument("--headless", action="store_true")
    w.add_argument("--sweep", help="open this sweep directory (written by optimus sweep) on the Sweep page")
    w.set_defaults(fn=cmd_app)
    _add_sweep_parser(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except BrokenPipeError:  # the reader left (`optimus passes | head`): stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the flush at exit does not raise again
        return 0


if __name__ == "__main__":
    sys.exit(main())
