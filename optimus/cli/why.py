"""``optimus why MODEL NODE``: for one node, what each pattern does with it in a dry run of
the pipeline (fuses at step N with ..., or the reason it does not)."""

from __future__ import annotations

import argparse

from optimus_lens.cli.errors import EXIT_OK, input_errors
from optimus_lens.cli.jsonout import add_json, json_output
from optimus_lens.cli.options import PASSES, PATTERN_FILE, SEARCH, SOURCE, names_arg


def add_parsers(sub) -> None:
    """Add ``why`` to the subcommands ``sub``."""
    y = sub.add_parser(
        "why",
        help="for one node, what each pattern does with it in a dry run of the pipeline "
        "(fuses at step N with ..., or the reason it does not)",
        parents=[SOURCE, PASSES, SEARCH, PATTERN_FILE],
    )
    y.add_argument("node", help="FX node name, e.g. linear_3")
    y.add_argument(
        "--step",
        type=int,
        default=None,
        help="explain the node in the graph before step N of the run (default: the captured graph)",
    )
    y.add_argument("--pattern", help="comma-separated pattern names to answer for (default: every pattern)")
    add_json(y, "every pattern's verdict for the node")
    y.set_defaults(fn=cmd_why)


def cmd_why(a: argparse.Namespace) -> int:
    """Print the dry run's answer for the node (:class:`optimus_lens.debug.why.DryRun`); with
    ``--json`` also as JSON (:meth:`optimus_lens.debug.why.WhyReport.to_json`)."""
    from optimus_lens.debug.why import DryRun
    from optimus_lens.frontend.capture import capture
    from optimus_lens.frontend.patternfile import load_pattern_file, pipeline_with
    from optimus_lens.frontend.run import load_model
    from optimus_lens.passes import default_pipeline

    with input_errors():  # WhyError: no such node or step
        model, inputs, _ = load_model(a.model)
        gm = capture(model, inputs, method=a.capture, graph_index=a.graph).gm
        pipe = default_pipeline(search=a.search)
        if a.pattern_file:
            pipe = pipeline_with(load_pattern_file(a.pattern_file), base=pipe)
        if a.passes:
            pipe = pipe.only(names_arg(a.passes))
        report = DryRun(gm, pipe, a.step).explain(a.node, names_arg(a.pattern))
    with json_output(a, "why") as emit:
        print(report.text())
        emit({"model": a.model, **report.to_json()})
    return EXIT_OK
