"""``optimus check MODEL --expect 'batch_linear>=2' ...``: assert in CI what the passes do.

Runs the pipeline (or, with ``--upstream``, PyTorch's own pre-grad passes) on the model,
counts steps per pattern and checks each expectation
(:mod:`optimus_lens.debug.expect`). Exit 0 when every expectation holds and nothing
failed verification, 1 otherwise (one line per failure on stderr), 2 for bad input
(unknown model, pass or pattern name, an expectation that cannot be read).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from optimus_lens.cli.errors import EXIT_OK, EXIT_VERIFY, BadInput, PatternRaised, input_errors
from optimus_lens.cli.jsonout import add_json, json_output
from optimus_lens.cli.options import (
    PASSES,
    PATTERN_FILE,
    SEARCH,
    SKIP,
    SOURCE,
    UPSTREAM_OPTIONS,
    names_arg,
    options_arg,
)


def add_parsers(sub) -> None:
    """Add ``check`` to the subcommands ``sub``."""
    c = sub.add_parser(
        "check",
        help="run the passes on a model and check how often patterns fire (for CI): exit 0 when every "
        "--expect holds, 1 when one fails, 2 for bad input",
        parents=[SOURCE, PASSES, SKIP, SEARCH, PATTERN_FILE, UPSTREAM_OPTIONS],
    )
    c.add_argument(
        "--expect",
        action="append",
        default=[],
        metavar="PATTERN(>=|<=|=|!=|>|<)N",
        help="steps of a pattern (or pass) compared with N, e.g. 'batch_linear>=2' or 'remove_split_cat=0'; repeatable",
    )
    c.add_argument(
        "--verify",
        choices=["step", "end", "off"],
        default="end",
        help="verify every step, the final graph (default) or nothing; a failure fails the check",
    )
    c.add_argument(
        "--upstream",
        action="store_true",
        help="check PyTorch Inductor's own pre-grad passes (with --options) instead of ours",
    )
    c.add_argument("--junit", metavar="PATH", help="also write the result as JUnit XML here")
    add_json(c, "the expectations and their counts")
    c.set_defaults(fn=cmd_check)


def _trace(a: argparse.Namespace):
    """The run to check: ours (with --passes/--skip/--search/--pattern-file) or upstream's."""
    from optimus_lens.frontend.patternfile import load_pattern_file, pipeline_with
    from optimus_lens.frontend.run import optimize
    from optimus_lens.passes import default_pipeline

    if a.upstream:
        from optimus_lens.frontend.capture import capture
        from optimus_lens.frontend.run import load_model
        from optimus_lens.inductor.observe import check_options, default_options, observe

        options = options_arg(a.options)
        options = default_options() if options is None else options
        check_options(options)
        model, inputs, name = load_model(a.model)
        captured = capture(model, inputs, method=a.capture, graph_index=a.graph)
        try:
            return observe(name, options=options, verify=a.verify != "off", captured=captured).trace
        except Exception as e:  # noqa: BLE001 - upstream's passes raising is itself the finding
            raise PatternRaised(f"PyTorch Inductor's pre-grad passes raised {type(e).__name__}: {e}") from e
    pipeline = default_pipeline(search=a.search)
    passes = names_arg(a.passes)
    if a.pattern_file:
        pipeline, passes = pipeline_with(load_pattern_file(a.pattern_file), passes, base=pipeline), None
    return optimize(
        a.model,
        passes=passes,
        skip=names_arg(a.skip),
        verify=a.verify,
        capture_method=a.capture,
        graph_index=a.graph,
        pipeline=pipeline,
    ).trace


def cmd_check(a: argparse.Namespace) -> int:
    """Check the expectations; print one line per expectation (stdout) and one per failure
    (stderr); write ``--junit`` / ``--json``. Exit 0 all hold, 1 one fails."""
    from optimus_lens.debug.expect import ExpectationError, check_trace, junit_xml, parse_expectation

    if not a.expect:
        raise BadInput("check needs at least one --expect 'PATTERN>=N'")
    with input_errors(TypeError, ExpectationError):
        expectations = [parse_expectation(t) for t in a.expect]
        trace = _trace(a)
        result = check_trace(trace, expectations, a.verify)
    with json_output(a, "check") as emit:
        for o in result.outcomes:
            print(
                f"{'ok  ' if o.ok else 'FAIL'} {o.expectation.text}: {o.count} step(s) of {o.counted} {o.expectation.name}"
            )
        v = trace.final_verify
        if a.verify != "off":
            print(
                f"{'FAIL' if result.verify_failures else 'ok  '} verify ({a.verify})" + (f": {v.checked}" if v else "")
            )
        for line in result.failure_lines():
            print(f"optimus check: {line}", file=sys.stderr)
        if a.junit:
            Path(a.junit).write_text(junit_xml(result))
            print(f"JUnit XML written to {a.junit}", file=sys.stderr)
        emit(
            {
                **result.to_json(),
                "upstream": a.upstream,
                "nodes_before": trace.nodes_before,
                "nodes_after": trace.nodes_after,
            }
        )
    return EXIT_OK if result.ok else EXIT_VERIFY
