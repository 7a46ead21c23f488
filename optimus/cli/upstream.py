"""PyTorch Inductor's own pre-grad passes: ``optimus observe`` records them step by step,
``optimus compare`` sets them beside ours on the same captured graph."""

from __future__ import annotations

import argparse

from optimus_lens.cli.errors import EXIT_OK, EXIT_VERIFY, PatternRaised, input_errors
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
        help="our passes vs PyTorch Inductor's on the same captured graph",
        parents=[SOURCE, UPSTREAM_OPTIONS],
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

    options = options_arg(a.options)
    with input_errors(TypeError):  # check_options: unknown pass, options of the wrong type
        options = default_options() if options is None else options
        check_options(options)
        model, inputs, name = load_model(a.model)
        captured = capture(model, inputs, method=a.capture, graph_index=a.graph)
    try:
        res = observe(name, options=options, verify=a.verify == "step", captured=captured)
    except Exception as e:  # noqa: BLE001 - upstream's passes raising is itself the finding
        from optimus_lens.inductor.watch import raised_text

        raise PatternRaised(f"PyTorch Inductor's pre-grad passes: {raised_text(e)}") from e
    t = res.trace
    print(
        f"PyTorch Inductor pre-grad passes (torch {t.capture.get('torch')}), pre_grad_fusion_options: "
        f"{', '.join(res.options) or 'none'}"
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
            print(
                f"  (step(s) {', '.join(str(x.index) for x in inherited)} fail the same way only because the graph "
                f"is still broken from step {s.index})"
            )
    if a.trace:
        n = t.save(a.trace)
        print(f"trace written to {a.trace} ({n:,} bytes)")
    return EXIT_VERIFY if t.failed_steps() or (t.final_verify and t.final_verify.ok is False) else EXIT_OK


def cmd_compare(a: argparse.Namespace) -> int:
    """Print the comparison (:func:`optimus_lens.debug.compare.comparison_text`); write both
    traces (``--trace``). Exit 1 when upstream has a defect or one of our steps failed."""
    from optimus_lens.debug.compare import compare_model, comparison_text

    options = options_arg(a.options)
    with input_errors(TypeError):
        c = compare_model(a.model, options, capture_method=a.capture, graph_index=a.graph)
    print(comparison_text(c))
    if a.trace:
        c.ours.save(f"{a.trace}.ours.json")
        c.upstream.save(f"{a.trace}.upstream.json")
        print(f"traces written to {a.trace}.ours.json and {a.trace}.upstream.json")
    return EXIT_VERIFY if c.upstream_defects or c.ours_failed else EXIT_OK
