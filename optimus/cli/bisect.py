"""``optimus bisect MODEL``: the first step whose graph no longer matches the original
(a binary search over the replayed steps)."""

from __future__ import annotations

import argparse

from optimus_lens.cli.errors import EXIT_OK, EXIT_VERIFY, input_errors
from optimus_lens.cli.options import GRADS, PASSES, SKIP, SOURCE, STAGE, TRACE_OUT, names_arg
from optimus_lens.cli.text import verify_text


def add_parsers(sub) -> None:
    """Add ``bisect`` to the subcommands ``sub``."""
    bi = sub.add_parser(
        "bisect",
        help="find the first step whose graph no longer matches the original (binary search over the replayed steps)",
        parents=[SOURCE, STAGE, PASSES, SKIP, GRADS, TRACE_OUT],
    )
    bi.add_argument(
        "--verify",
        choices=["off", "step"],
        default="off",
        help="off (default): run unverified, then check O(log steps) replayed graphs; "
        "step: verify every step while running and report the first failure",
    )
    bi.add_argument(
        "--pattern-file",
        action="append",
        default=[],
        help="a pattern file whose patterns run as one extra pass after the default pipeline "
        "(repeatable: one pass per file, in order; optimus_lens.compile's warning names the files it ran)",
    )
    bi.set_defaults(fn=cmd_bisect)


def cmd_bisect(a: argparse.Namespace) -> int:
    """Run the pipeline, then print the graphs checked and the first failing step (exit 1),
    or that every step matches (exit 0); with ``--trace``, the diff and repro commands next.
    With ``--stage post-grad|all`` every graph of the run (pre-grad, forward, backward) is
    searched on its own, each against its own original on its own inputs. ``--pattern-file``
    (repeatable): each file's patterns as a last pre-grad pass."""
    from optimus_lens.frontend.patternfile import load_pattern_file, pipeline_with
    from optimus_lens.frontend.postgrad import stage_pipelines
    from optimus_lens.frontend.run import optimize
    from optimus_lens.passes import default_pipeline
    from optimus_lens.passes.post_grad import post_grad_pipeline

    with input_errors():
        base = default_pipeline()
        for f in a.pattern_file:
            base = pipeline_with(load_pattern_file(f), base=base)
        pre, post = stage_pipelines(a.stage, base, post_grad_pipeline(), names_arg(a.passes), names_arg(a.skip))
        res = optimize(
            a.model,
            verify=a.verify,
            grads=a.grads,
            capture_method=a.capture,
            graph_index=a.graph,
            pipeline=pre,
            stage=a.stage,
            mode=a.mode,
            post_grad_pipeline=post,
        )
    run = res.trace
    if a.trace:
        run.save(a.trace)
    status = EXIT_OK
    for t in run.traces():
        if a.stage == "post-grad" and t.graph == "pre-grad":
            continue
        inputs = (
            res.captured.example_inputs
            if t.graph == "pre-grad"
            else res.post_grad.capture.graph(t.graph).example_inputs
        )  # type: ignore[union-attr]
        if len(run.traces()) > 1:
            print(f"== {t.graph} graph ==")
        status = max(status, _bisect_one(a, t, inputs, a.grads and t.graph == "pre-grad"))
    return status


def _bisect_one(a: argparse.Namespace, t, inputs: tuple, grads: bool) -> int:
    """Bisect one graph's steps and print the outcome; the exit status for it."""
    from optimus_lens.debug.bisect import bisect_trace, first_failing

    with input_errors():  # RebuildError: a step that cannot be replayed
        b = first_failing(t) if a.verify == "step" else bisect_trace(t, inputs, grads)
    if b.direct:
        print(f"{len(t.steps)} steps, each verified as it was applied")
    else:
        print(
            f"{b.steps} steps; checked {len(b.probes)} replayed graph(s) against the original (at most {b.max_probes}):"
        )
        for k, v in b.probes:
            print(f"  after step {k:4d}: {verify_text(v)} {v.message.splitlines()[0] if v.message else ''}".rstrip())
    if b.first_bad is None:
        print(b.message)
        return EXIT_OK
    s = t.step(b.first_bad)
    print(
        f"first failing step: {s.index} ({s.pass_name} / {s.pattern}) at {', '.join(s.sites[:8])}"
        + (" ..." if len(s.sites) > 8 else "")
    )
    if a.trace:
        pick = f" --graph {t.graph}" if t.graph != "pre-grad" or t.graphs else ""
        print(
            f"next: optimus diff {a.trace}{pick} --step {s.index}; "
            f"optimus repro {a.trace}{pick} --step {s.index} -o repro.py"
        )
    return EXIT_VERIFY
