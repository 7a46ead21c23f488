"""PyTorch Inductor's own passes: ``optimus observe`` records them step by step,
``optimus compare`` sets them beside ours on the same captured graph. ``--stage post-grad``
does the same on the ATen graphs (forward, and backward with ``--mode training``) with
upstream's ``post_grad_passes``; ``--stage all`` observes the pre-grad passes, then the
post-grad passes on the ATen graphs of the program they rewrote."""

from __future__ import annotations

import argparse

from optimus_lens.cli.errors import EXIT_OK, EXIT_VERIFY, BadInput, PatternRaised, input_errors
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
        help="our passes vs PyTorch Inductor's on the same captured graph (--stage post-grad: on its ATen graphs)",
        parents=[SOURCE, STAGE, UPSTREAM_OPTIONS],
    )
    cp.add_argument("--trace", help="write both traces: TRACE.ours.json and TRACE.upstream.json")
    cp.set_defaults(fn=cmd_compare)


def cmd_observe(a: argparse.Namespace) -> int:
    """Print upstream's steps, the final verification and each upstream defect (a step that
    fails verification, and the steps that fail only because the graph is still broken).
    Exit 1 when a step or the result fails; raises PatternRaised when upstream's passes raise."""
    from optimus_lens.frontend.capture import capture
    from optimus_lens.frontend.run import load_model
    from optimus_lens.inductor.observe import check_options, default_options, observe

    if a.stage != "pre-grad":
        return _observe_post_grad(a)
    options = options_arg(a.options)
    with input_errors(TypeError):  # check_options: unknown pass, options of the wrong type
        options = default_options() if options is None else options
        check_options(options)
        model, inputs, name = load_model(a.model)
        captured = capture(model, inputs, method=a.capture, graph_index=a.graph)
    try:
        res = observe(name, options=options, verify=a.verify == "step", captured=captured)
    except Exception as e:  # noqa: BLE001 - upstream's passes raising is itself the finding
        raise PatternRaised(f"PyTorch Inductor's pre-grad passes raised {type(e).__name__}: {e}") from e
    t = res.trace
    print(
        f"PyTorch Inductor pre-grad passes (torch {t.capture.get('torch')}), pre_grad_fusion_options: "
        f"{', '.join(res.options) or 'none'}"
    )
    _print_observed(t)
    if a.trace:
        n = t.save(a.trace)
        print(f"trace written to {a.trace} ({n:,} bytes)")
    return EXIT_VERIFY if t.failed_steps() or (t.final_verify and t.final_verify.ok is False) else EXIT_OK


def _print_observed(t, where: str = "") -> None:
    """One observed graph: its steps, node counts, final verification and upstream defects."""
    print(steps_table(t))
    print(f"\nnodes: {t.nodes_before} -> {t.nodes_after} in {len(t.steps)} upstream steps")
    if t.final_verify is not None and t.final_verify.ok is not None:
        first = t.final_verify.message.splitlines()[0] if t.final_verify.message else ""
        print(f"verify: {verify_text(t.final_verify)} {first}".rstrip())
    for s, inherited in t.failure_runs():
        msg = s.verify.message.splitlines()[0] if s.verify.message else ""
        print(f"UPSTREAM DEFECT: {where}step {s.index} ({s.pass_name} / {s.pattern}) fails verification: {msg}")
        if inherited:
            print(
                f"  (step(s) {', '.join(str(x.index) for x in inherited)} fail the same way only because the graph "
                f"is still broken from step {s.index})"
            )


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
    """Print the comparison (:func:`optimus_lens.debug.compare.comparison_text`); write both
    traces (``--trace``). Exit 1 when upstream has a defect or one of our steps failed."""
    from optimus_lens.debug.compare import compare_model, compare_post_grad, comparison_text

    options = options_arg(a.options)
    if a.stage != "pre-grad":
        if a.stage == "all":
            raise BadInput(
                "compare --stage all: compare --stage pre-grad and --stage post-grad (one set of options each)"
            )
        with input_errors(TypeError):
            cs = compare_post_grad(a.model, options, a.mode, capture_method=a.capture, graph_index=a.graph)
        for c in cs:
            print(f"\n== {c.graph} graph (ATen) ==")
            print(comparison_text(c))
        if a.trace:
            for c in cs:
                c.ours.save(f"{a.trace}.{c.graph}.ours.json")
                c.upstream.save(f"{a.trace}.{c.graph}.upstream.json")
            print(f"traces written to {a.trace}.GRAPH.ours.json and {a.trace}.GRAPH.upstream.json")
        return EXIT_VERIFY if any(c.upstream_defects or c.ours_failed for c in cs) else EXIT_OK
    with input_errors(TypeError):
        c = compare_model(a.model, options, capture_method=a.capture, graph_index=a.graph)
    print(comparison_text(c))
    if a.trace:
        c.ours.save(f"{a.trace}.ours.json")
        c.upstream.save(f"{a.trace}.upstream.json")
        print(f"traces written to {a.trace}.ours.json and {a.trace}.upstream.json")
    return EXIT_VERIFY if c.upstream_defects or c.ours_failed else EXIT_OK
