"""PyTorch Inductor's own passes: ``optimus observe`` records them step by step,
``optimus compare`` sets them beside ours on the same captured graph. ``--stage post-grad``
does the same on the ATen graphs (forward, and backward with ``--mode training``) with
upstream's ``post_grad_passes``; ``--stage all`` observes the pre-grad passes, then the
post-grad passes on the ATen graphs of the program they rewrote."""

from __future__ import annotations

import argparse

from optimus_lens.cli.errors import EXIT_OK, EXIT_VERIFY, BadInput, PatternRaised, input_errors
from optimus_lens.cli.jsonout import add_json, json_output
from optimus_lens.cli.options import SOURCE, STAGE, TRACE_OUT, UPSTREAM_OPTIONS, options_arg
from optimus_lens.cli.text import steps_table, verify_text


def add_parsers(sub) -> None:
    """Add ``observe`` and ``compare`` to the subcommands ``sub``."""
    ob = sub.add_parser(
        "observe",
        help="record PyTorch Inductor's own pre-grad (or, --stage post-grad, post-grad) passes step by step, "
        "each step verified",
        parents=[SOURCE, STAGE, UPSTREAM_OPTIONS, TRACE_OUT],
    )
    ob.add_argument(
        "--post-grad-options",
        help="with --stage all: post_grad_fusion_options as JSON (--options is then the pre-grad dict; "
        "default: upstream's equivalent of our post-grad pipeline)",
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
        "(A B: traces or model specs): nodes matched, steps only in one, a one-line summary; --stage post-grad: "
        "on the ATen graphs",
        parents=[SOURCE, STAGE, UPSTREAM_OPTIONS],
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
    from optimus_lens.frontend.capture import capture
    from optimus_lens.frontend.run import load_model
    from optimus_lens.inductor.log_replay import check_replay, logged_options
    from optimus_lens.inductor.observe import check_options, default_options, observe

    if a.stage != "pre-grad":
        return _observe_post_grad(a)
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
        from optimus_lens.inductor.watch import raised_text

        raise PatternRaised(f"PyTorch Inductor's pre-grad passes: {raised_text(e)}") from e
    t = res.trace
    print(
        f"PyTorch Inductor pre-grad passes (torch {t.capture.get('torch')}), pre_grad_fusion_options: "
        f"{', '.join(res.options) or 'none'}" + (" (the logged compile's)" if from_log is not None else "")
    )
    _print_observed(t)
    replay = check_replay(t)
    if replay is not None:
        print(replay.text())
        t.capture["log_replay"] = {"reproduced": replay.reproduced, "text": replay.text()}
    if a.trace:
        n = t.save(a.trace)
        print(f"trace written to {a.trace} ({n:,} bytes)")
    return EXIT_VERIFY if t.failed_steps() or (t.final_verify and t.final_verify.ok is False) else EXIT_OK


def _print_observed(t, where: str = "") -> None:
    """One observed graph: its steps, node counts, final verification and upstream defects."""
    from optimus_lens.debug.compare import inherited_text

    print(steps_table(t))
    print(f"\nnodes: {t.nodes_before} -> {t.nodes_after} in {len(t.steps)} upstream steps")
    if t.final_verify is not None and t.final_verify.ok is not None:
        first = t.final_verify.message.splitlines()[0] if t.final_verify.message else ""
        print(f"verify: {verify_text(t.final_verify)} {first}".rstrip())
    for s, inherited in t.failure_runs():
        msg = s.verify.message.splitlines()[0] if s.verify.message else ""
        print(f"UPSTREAM DEFECT: {where}step {s.index} ({s.pass_name} / {s.pattern}) fails verification: {msg}")
        if inherited:
            print(f"  {inherited_text([x.index for x in inherited], s.index)}")


def _observe_post_grad(a: argparse.Namespace) -> int:
    """``observe --stage post-grad|all``: upstream's post-grad passes on each ATen graph (with
    ``all``, on the ATen graphs of the program upstream's pre-grad passes rewrote), printed
    graph by graph; the trace holds the ATen graphs in ``graphs``. Exit 1 when a step or a
    result of any graph fails."""
    from optimus_lens.frontend.capture import capture
    from optimus_lens.frontend.run import load_model
    from optimus_lens.inductor.observe import check_options, default_options, observe, run_upstream
    from optimus_lens.inductor.observe_post import check_post_grad_options, default_post_grad_options, observe_post_grad

    pre_options = options_arg(a.options) if a.stage == "all" else None
    post_options = options_arg(a.post_grad_options if a.stage == "all" else a.options)
    with input_errors(TypeError):
        post_options = default_post_grad_options() if post_options is None else post_options
        check_post_grad_options(post_options)
        if a.stage == "all":
            pre_options = default_options() if pre_options is None else pre_options
            check_options(pre_options)
        model, inputs, name = load_model(a.model)
        if a.mode == "training":
            model.train()
        captured = capture(model, inputs, method=a.capture, graph_index=a.graph)
    try:
        pre = observe(name, options=pre_options, captured=captured) if a.stage == "all" else None
        program = run_upstream(captured.gm, captured.example_inputs, pre_options).gm if pre is not None else None
        with input_errors(TypeError):
            res = observe_post_grad(name, options=post_options, mode=a.mode, captured=captured, pre_grad_gm=program)
    except Exception as e:  # noqa: BLE001 - upstream's passes raising outside their rules is itself the finding
        if isinstance(e, (BadInput, PatternRaised)):
            raise
        raise PatternRaised(f"PyTorch Inductor's passes raised {type(e).__name__}: {e}") from e
    t = res.trace
    if pre is not None:
        t = pre.trace
        t.graphs = res.trace.graphs
        print(f"PyTorch Inductor pre-grad passes, pre_grad_fusion_options: {', '.join(pre_options or {}) or 'none'}")
        _print_observed(t, "pre-grad ")
    print(
        f"PyTorch Inductor post_grad_passes (torch {res.trace.capture.get('torch', '')}), "
        f"post_grad_fusion_options: {', '.join(res.options) or 'none'} ({a.mode})".replace("(torch )", "")
    )
    for note in res.notes:
        print(f"note: {note}")
    for g in t.graphs:
        print(f"\n== {g.graph} graph (ATen) ==")
        counters = ", ".join(f"{k} {v}" for k, v in sorted(g.capture.get("counters", {}).items()))
        _print_observed(g, f"{g.graph} ")
        if counters:
            print(f"upstream counters: {counters}")
    if a.trace:
        n = t.save(a.trace)
        print(f"trace written to {a.trace} ({n:,} bytes)")
    bad = t.all_failed() or [g for g in t.traces() if g.final_verify is not None and g.final_verify.ok is False]
    return EXIT_VERIFY if bad else EXIT_OK


def cmd_compare(a: argparse.Namespace) -> int:
    """Print the comparison (:func:`optimus_lens.debug.compare.comparison_text`) and its
    summary line; write both traces (``--trace``) and the JSON (``--json``). Exit 1 when
    upstream has a defect or one of our steps failed. With a second run (``other``):
    :func:`compare_two`."""
    from optimus_lens.debug.compare import compare_model, compare_runs, comparison_text, group_rows

    if a.other is not None:
        if a.stage != "pre-grad":
            raise BadInput("compare A B compares two runs as they are; --stage is for compare MODEL")
        return compare_two(a)
    options = options_arg(a.options)
    if a.stage != "pre-grad":
        return _compare_post_grad(a, options)
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


def _compare_post_grad(a: argparse.Namespace, options: dict | None) -> int:
    """``compare MODEL --stage post-grad``: ours vs upstream's ``post_grad_passes`` on each ATen
    graph (:func:`optimus_lens.debug.compare.compare_post_grad`). Exit 1 when upstream has a
    defect or one of our steps failed."""
    from optimus_lens.debug.compare import compare_post_grad, compare_runs, comparison_text, group_rows

    if a.stage == "all":
        raise BadInput("compare --stage all: compare --stage pre-grad and --stage post-grad (one set of options each)")
    with input_errors(TypeError):
        cs = compare_post_grad(a.model, options, a.mode, capture_method=a.capture, graph_index=a.graph)
    with json_output(a, "compare") as emit:
        graphs = []
        for c in cs:
            print(f"\n== {c.graph} graph (ATen) ==")
            print(comparison_text(c))
            runs = compare_runs(c.ours, c.upstream, "ours", "upstream")
            print(runs.summary())
            graphs.append({"graph": c.graph, **runs.to_json(), "groups": group_rows(c)})
        if a.trace:
            for c in cs:
                c.ours.save(f"{a.trace}.{c.graph}.ours.json")
                c.upstream.save(f"{a.trace}.{c.graph}.upstream.json")
            print(f"traces written to {a.trace}.GRAPH.ours.json and {a.trace}.GRAPH.upstream.json")
        emit({"stage": a.stage, "mode": a.mode, "graphs": graphs})
    return EXIT_VERIFY if any(c.upstream_defects or c.ours_failed for c in cs) else EXIT_OK


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
        for tag, t in (("A", ta), ("B", tb)):  # the comparison is of the pre-grad graphs only
            if t.graphs:
                names = ", ".join(f"{g.graph} ({len(g.steps)} steps)" for g in t.graphs)
                print(f"note: {tag} also holds the ATen graphs {names}; only the pre-grad graphs are compared")
        _report(a, r)
        if a.trace:
            for t, ran, tag in ((ta, ran_a, "a"), (tb, ran_b, "b")):
                if ran:
                    t.save(f"{a.trace}.{tag}.json")
                    print(f"trace written to {a.trace}.{tag}.json")
        emit(r.to_json())
    return EXIT_OK if r.identical and not r.failed_a and not r.failed_b else EXIT_VERIFY
