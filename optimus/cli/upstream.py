"""PyTorch Inductor's own pre-grad passes: ``optimus observe`` records them step by step,
``optimus compare`` sets them beside ours on the same captured graph."""

from __future__ import annotations

import argparse

from optimus_lens.cli.errors import EXIT_OK, EXIT_VERIFY, BadInput, PatternRaised, input_errors
from optimus_lens.cli.jsonout import add_json, json_output
from optimus_lens.cli.options import SOURCE, TRACE_OUT, UPSTREAM_OPTIONS, options_arg
from optimus_lens.cli.text import steps_table, verify_text


def add_parsers(sub) -> None:
    """Add ``observe`` and ``compare`` to the subcommands ``sub``."""
    ob = sub.add_parser(
        "observe",
        help="record PyTorch Inductor's own pre-grad passes step by step, each step verified",
        parents=[SOURCE, UPSTREAM_OPTIONS, TRACE_OUT],
    )
    ob.add_argument(
        "--verify",
        choices=["step", "off"],
        default="step",
        help="step (default): check every step where upstream leaves the graph sorted, and the result",
    )
    ob.set_defaults(fn=cmd_observe)
    cp = sub.add_parser(
        "compare",
        help="our passes vs PyTorch Inductor's on the same captured graph (MODEL), or any two runs "
        "(A B: traces or model specs): nodes matched, steps only in one, a one-line summary",
        parents=[SOURCE, UPSTREAM_OPTIONS],
    )
    cp.add_argument(
        "other",
        nargs="?",
        help="a second run: compare MODEL (a trace JSON or a model spec, run with our pipeline) with it; "
        "exit 1 when they differ",
    )
    cp.add_argument(
        "--trace",
        help="write both traces: TRACE.ours.json and TRACE.upstream.json (with two runs: TRACE.a.json, TRACE.b.json)",
    )
    cp.add_argument(
        "--report",
        metavar="PATH",
        help="write an offline HTML page: the comparison and both final graphs side by side on one layout",
    )
    add_json(cp, "the comparison")
    cp.set_defaults(fn=cmd_compare)


def cmd_observe(a: argparse.Namespace) -> int:
    """Print upstream's steps, the final verification and each upstream defect (a step that
    fails verification, and the steps that fail only because the graph is still broken).
    Exit 1 when a step or the result fails; raises PatternRaised when upstream's passes raise."""
    from optimus_lens.debug.compare import inherited_text
    from optimus_lens.frontend.capture import capture
    from optimus_lens.frontend.run import load_model
    from optimus_lens.inductor.log_replay import check_replay, logged_options
    from optimus_lens.inductor.observe import check_options, default_options, observe

    options = options_arg(a.options)
    with input_errors(TypeError):  # check_options: unknown pass, options of the wrong type
        model, inputs, name = load_model(a.model)
        captured = capture(model, inputs, method=a.capture, graph_index=a.graph)
        from_log = logged_options(captured.log) if options is None else None
        options = from_log if from_log is not None else (default_options() if options is None else options)
        check_options(options)
    try:
        res = observe(name, options=options, verify=a.verify == "step", captured=captured)
    except Exception as e:  # noqa: BLE001 - upstream's passes raising is itself the finding
        raise PatternRaised(f"PyTorch Inductor's pre-grad passes raised {type(e).__name__}: {e}") from e
    t = res.trace
    print(
        f"PyTorch Inductor pre-grad passes (torch {t.capture.get('torch')}), pre_grad_fusion_options: "
        f"{', '.join(res.options) or 'none'}" + (" (the logged compile's)" if from_log is not None else "")
    )
    print(steps_table(t))
    print(f"\nnodes: {t.nodes_before} -> {t.nodes_after} in {len(t.steps)} upstream steps")
    if t.final_verify is not None and t.final_verify.ok is not None:
        first = t.final_verify.message.splitlines()[0] if t.final_verify.message else ""
        print(f"verify: {verify_text(t.final_verify)} {first}".rstrip())
    for s, inherited in t.failure_runs():
        msg = s.verify.message.splitlines()[0] if s.verify.message else ""
        print(f"UPSTREAM DEFECT: step {s.index} ({s.pass_name} / {s.pattern}) fails verification: {msg}")
        if inherited:
            print(f"  {inherited_text([x.index for x in inherited], s.index)}")
    replay = check_replay(t)
    if replay is not None:
        print(replay.text())
        t.capture["log_replay"] = {"reproduced": replay.reproduced, "text": replay.text()}
    if a.trace:
        n = t.save(a.trace)
        print(f"trace written to {a.trace} ({n:,} bytes)")
    return EXIT_VERIFY if t.failed_steps() or (t.final_verify and t.final_verify.ok is False) else EXIT_OK


def cmd_compare(a: argparse.Namespace) -> int:
    """Print the comparison (:func:`optimus_lens.debug.compare.comparison_text`) and its
    summary line; write both traces (``--trace``) and the JSON (``--json``). Exit 1 when
    upstream has a defect or one of our steps failed. With a second run (``other``):
    :func:`compare_two`."""
    from optimus_lens.debug.compare import compare_model, compare_runs, comparison_text, group_rows

    if a.other is not None:
        return compare_two(a)
    options = options_arg(a.options)
    with input_errors(TypeError):
        c = compare_model(a.model, options, capture_method=a.capture, graph_index=a.graph)
    runs = compare_runs(c.ours, c.upstream, "ours", "upstream")
    with json_output(a, "compare") as emit:
        print(comparison_text(c))
        print(runs.summary())
        _report(a, runs)
        if a.trace:
            c.ours.save(f"{a.trace}.ours.json")
            c.upstream.save(f"{a.trace}.upstream.json")
            print(f"traces written to {a.trace}.ours.json and {a.trace}.upstream.json")
        emit(
            {
                **runs.to_json(),
                "options": c.options,
                "groups": group_rows(c),
                "upstream_defects": [s.index for s in c.upstream_defects],
            }
        )
    return EXIT_VERIFY if c.upstream_defects or c.ours_failed else EXIT_OK


def _report(a: argparse.Namespace, r) -> None:
    """``--report PATH``: the comparison and both final graphs on one layout
    (:func:`optimus_lens.viz.runs.write_runs_html`). Raises BadInput when it cannot be
    drawn or written."""
    if not a.report:
        return
    from optimus_lens.viz.layout import RenderError
    from optimus_lens.viz.runs import write_runs_html

    try:
        n = write_runs_html(
            a.report,
            r.a.graph_at(len(r.a.steps)),
            r.b.graph_at(len(r.b.steps)),
            r.final,
            r.text(),
            r.a_label,
            r.b_label,
        )
    except (OSError, RenderError) as e:
        raise BadInput(f"cannot write {a.report}: {e}") from e
    print(f"report written to {a.report} ({n / 1e6:.2f} MB)")


def _run_of(spec: str, a: argparse.Namespace):
    """A side of ``compare A B``: a trace file, or a model spec run with our pipeline (every
    step verified). Raises BadInput for an unreadable trace or a bad spec."""
    import os

    from optimus_lens.core.trace import Trace, TraceFormatError
    from optimus_lens.frontend.run import optimize

    if spec.endswith(".json") or (os.path.isfile(spec) and not spec.endswith((".py", ".pt2"))):
        try:
            return Trace.load(spec), False
        except (OSError, TraceFormatError) as e:
            raise BadInput(f"cannot read trace {spec}: {e}") from e
    with input_errors():
        return optimize(spec, verify="step", capture_method=a.capture, graph_index=a.graph).trace, True


def compare_two(a: argparse.Namespace) -> int:
    """``optimus compare A B``: print the report of two runs
    (:meth:`optimus_lens.debug.compare.RunComparison.text`; its last line the one-line
    summary). Exit 0 when they made the same steps and end in the same graph node for node
    and no step failed, else 1."""
    from optimus_lens.debug.compare import compare_runs

    ta, ran_a = _run_of(a.model, a)
    tb, ran_b = _run_of(a.other, a)
    r = compare_runs(ta, tb, a.model, a.other)
    with json_output(a, "compare") as emit:
        print(r.text())
        _report(a, r)
        if a.trace:
            for t, ran, tag in ((ta, ran_a, "a"), (tb, ran_b, "b")):
                if ran:
                    t.save(f"{a.trace}.{tag}.json")
                    print(f"trace written to {a.trace}.{tag}.json")
        emit(r.to_json())
    return EXIT_OK if r.identical and not r.failed_a and not r.failed_b else EXIT_VERIFY
