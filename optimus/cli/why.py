"""``optimus why MODEL NODE``: for one node, what each pattern does with it in a dry run of
the pipeline (fuses at step N with ..., or the reason it does not)."""

from __future__ import annotations

import argparse

from optimus_lens.cli.errors import EXIT_OK, input_errors
from optimus_lens.cli.jsonout import add_json, json_output
from optimus_lens.cli.options import PASSES, PATTERN_FILE, SEARCH, SOURCE, STAGE, names_arg


def add_parsers(sub) -> None:
    """Add ``why`` to the subcommands ``sub``."""
    y = sub.add_parser(
        "why",
        help="for one node, what each pattern does with it in a dry run of the pipeline "
        "(fuses at step N with ..., or the reason it does not)",
        parents=[SOURCE, STAGE, PASSES, SEARCH, PATTERN_FILE],
    )
    y.add_argument(
        "node",
        help="FX node name, e.g. linear_3; with --stage post-grad|all a node of an ATen graph, "
        "GRAPH:NODE (backward:mm_3) where the name is in both graphs",
    )
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
    ``--stage post-grad|all`` the post-grad pipeline's, on the ATen graph holding the node
    (:func:`optimus_lens.frontend.postgrad.graph_for_node`).
    ``--json`` also as JSON (:meth:`optimus_lens.debug.why.WhyReport.to_json`)."""
    from optimus_lens.debug.why import DryRun
    from optimus_lens.frontend.capture import capture
    from optimus_lens.frontend.run import load_model
    from optimus_lens.passes import default_pipeline

    if a.stage != "pre-grad":
        return _why_post_grad(a)
    with input_errors():  # WhyError: no such node or step
        model, inputs, _ = load_model(a.model)
        gm = capture(model, inputs, method=a.capture, graph_index=a.graph).gm
        pipe = _enabled(a, default_pipeline(search=a.search))
        report = DryRun(gm, pipe, a.step).explain(a.node, names_arg(a.pattern))
    with json_output(a, "why") as emit:
        print(report.text())
        emit({"model": a.model, **report.to_json()})
    return EXIT_OK


def _why_post_grad(a: argparse.Namespace) -> int:
    """``why --stage post-grad|all``: the post-grad pipeline's dry run on one ATen graph."""
    from optimus_lens.debug.why import DryRun
    from optimus_lens.frontend.capture import capture
    from optimus_lens.frontend.postgrad import aten_graphs_of, graph_for_node
    from optimus_lens.frontend.run import load_model
    from optimus_lens.passes.post_grad import post_grad_pipeline

    with input_errors():  # WhyError, AtenCaptureError, a name in both graphs (KeyError)
        model, inputs, _ = load_model(a.model)
        if a.mode == "training":
            model.train()
        c = capture(model, inputs, method=a.capture, graph_index=a.graph)
        aten = aten_graphs_of(c.gm, c.example_inputs, a.stage, a.mode)
        graph, node = graph_for_node(aten, a.node)
        pipe = _enabled(a, post_grad_pipeline())
        report = DryRun(aten.graph(graph).gm, pipe, a.step).explain(node, names_arg(a.pattern))
    with json_output(a, "why") as emit:
        print(f"{graph} graph (ATen, post-grad passes):")
        print(report.text())
        emit({"model": a.model, "graph": graph, **report.to_json()})
    return EXIT_OK


def _enabled(a: argparse.Namespace, pipe):
    """``pipe`` with ``--pattern-file``'s passes at the end, then only the ``--passes`` named (all
    without it): the file's stem stands for all the passes of an Inductor-language file, as in
    ``optimus run`` (:func:`optimus_lens.frontend.patternfile.pipeline_with`). Raises KeyError for
    an unknown name."""
    from optimus_lens.frontend.patternfile import load_pattern_file, pipeline_with

    passes = names_arg(a.passes)
    if a.pattern_file:
        return pipeline_with(load_pattern_file(a.pattern_file), passes, base=pipe)
    return pipe.only(passes) if passes is not None else pipe
