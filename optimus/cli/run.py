"""``optimus run MODEL``: capture a model, run the pipeline (one recorded step per match),
print the step table, optionally write the trace."""

from __future__ import annotations

import argparse
import sys

from optimus_lens.cli.errors import EXIT_OK, EXIT_VERIFY, BadInput, input_errors
from optimus_lens.cli.jsonout import add_json, json_output
from optimus_lens.cli.options import (
    GRADS,
    PASSES,
    PATTERN_FILE,
    SEARCH,
    SKIP,
    SOURCE,
    STAGE,
    TRACE_OUT,
    VERIFY,
    names_arg,
)
from optimus_lens.cli.text import samples_text, steps_table, verify_text

#: the epilog of ``optimus run --help``, replaced by the sample list when help is printed
SAMPLES_EPILOG = "(the sample models)"


class SamplesEpilog(argparse.RawDescriptionHelpFormatter):
    """Help with the sample list as its epilog, read only when help is printed (listing the
    samples imports torch, which every other use of the parser can do without)."""

    def add_text(self, text: str | None) -> None:
        super().add_text(samples_text() if text == SAMPLES_EPILOG else text)


def add_parsers(sub) -> None:
    """Add ``run`` to the subcommands ``sub``."""
    r = sub.add_parser(
        "run",
        help="capture a model and run the Optimus pipeline, one recorded step per match",
        epilog=SAMPLES_EPILOG,
        formatter_class=SamplesEpilog,
        parents=[SOURCE, STAGE, PASSES, SKIP, VERIFY, GRADS, TRACE_OUT, SEARCH, PATTERN_FILE],
    )
    add_json(r, "the run (steps, verification, node counts)")
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


def cmd_run(a: argparse.Namespace) -> int:
    """Print the step table, the node counts per pass, the estimates (``--estimate``) and the
    final verification, per graph with ``--stage post-grad|all`` (pre-grad, forward,
    backward); write the trace (``--trace``: one file, the ATen graphs in its ``graphs``).
    Exit 1 when a step of any graph failed verification or was rolled back (each
    rolled-back step is named on stderr) or a final graph fails."""
    from optimus_lens.frontend.patternfile import load_pattern_file, pipeline_with
    from optimus_lens.frontend.postgrad import stage_pipelines
    from optimus_lens.frontend.run import optimize
    from optimus_lens.passes import default_pipeline
    from optimus_lens.passes.post_grad import post_grad_pipeline

    if a.dynamic and a.stage != "pre-grad":
        raise BadInput(
            "--dynamic captures the pre-grad graph with symbolic sizes; the post-grad stage needs static ones"
        )
    with input_errors():
        pre, post = default_pipeline(search=a.search, profitable_only=a.profitable_only), post_grad_pipeline()
        passes = names_arg(a.passes)
        if a.pattern_file:
            pf = load_pattern_file(a.pattern_file)
            if a.stage == "post-grad":
                post, passes = pipeline_with(pf, passes, base=post), None
            else:
                pre, passes = pipeline_with(pf, passes, base=pre), None
        pre, post = stage_pipelines(a.stage, pre, post, passes, names_arg(a.skip))
        res = optimize(
            a.model,
            verify=a.verify,
            grads=a.grads,
            capture_method=a.capture,
            graph_index=a.graph,
            pipeline=pre,
            on_capture=lambda c: print(c.summary(), file=sys.stderr),
            dynamic=a.dynamic,
            on_error=a.on_error,
            stage=a.stage,
            mode=a.mode,
            post_grad_pipeline=post,
        )
    with json_output(a, "run") as emit:
        status = _report(a, res)
        emit(run_json(res.trace, status))
    return status


def step_json(s) -> dict:
    """One step in ``optimus run --json`` (docs/json.md)."""
    return {
        "index": s.index,
        "pass": s.pass_name,
        "pattern": s.pattern,
        "sites": s.sites,
        "created": s.created,
        "erased": s.erased,
        "verify": _verify_json(s.verify),
        "rolled_back": s.error is not None,
        "error": s.error,
        "ms": round((s.match_s + s.rewrite_s) * 1e3, 3),
    }


def run_json(t, status: int) -> dict:
    """The body of ``optimus run --json``: the run without its graphs (``--trace`` writes
    those); with ``--stage post-grad|all`` each ATen graph's steps in ``graphs``."""
    return {
        "model": t.model,
        **_graph_json(t),
        "graphs": [_graph_json(g) for g in t.graphs],
        "exit_status": status,
    }


def _verify_json(v) -> dict | None:
    """A VerifyResult in ``optimus run --json``; None when nothing was checked."""
    return None if v is None else {"ok": v.ok, "max_abs_err": v.max_abs_err, "checked": v.checked, "message": v.message}


def _graph_json(t) -> dict:
    return {
        "graph": t.graph,
        "nodes_before": t.nodes_before,
        "nodes_after": t.nodes_after,
        "capture": t.capture,
        "passes": {p["name"]: len(t.steps_of_pass(p["name"])) for p in t.passes if p.get("enabled", True)},
        "steps": [step_json(s) for s in t.steps],
        "final_verify": _verify_json(t.final_verify),
        "failed_steps": [s.index for s in t.failed_steps()],
    }


def _report(a: argparse.Namespace, res) -> int:
    """Print the run (the text of :func:`cmd_run`), graph by graph, and return its exit status."""
    run = res.trace
    for t in run.traces():
        if len(run.traces()) > 1:
            if t.graph == "pre-grad" and a.stage == "post-grad":
                print(f"pre-grad graph: {t.nodes_before} nodes, not rewritten (--stage post-grad)")
                continue
            kind = "Dynamo, pre-grad passes" if t.graph == "pre-grad" else "ATen, post-grad passes"
            print(f"\n== {t.graph} graph ({kind}) ==")
        _print_graph(t, a)
    if a.mode == "training" and a.stage != "pre-grad" and "backward" not in run.graph_names():
        print("note: no backward graph: nothing the model computes requires grad (no parameter or input does)")
    t = run
    if a.trace:
        n = t.save(a.trace)
        print(f"trace written to {a.trace} ({n:,} bytes)")
    several = len(t.traces()) > 1
    failed: list[str] = []
    for g in t.traces():
        where = f"{g.graph} " if several else ""
        for s in g.steps:
            if s.error:
                print(
                    f"optimus: {where}step {s.index} ({s.pattern} at {', '.join(s.sites[:4])}) was rolled back: "
                    f"{s.error['kind']}: {s.error['type']}: {s.error['message']} [{s.error['source']}]",
                    file=sys.stderr,
                )
        failed += [f"{where}{s.index}" for s in g.failed_steps()]
        if not g.failed_steps() and g.final_verify is not None and g.final_verify.ok is False:
            failed.append(f"the final {where}graph".replace("  ", " "))
    if failed:
        print(f"optimus: verification failed or rolled back at step(s) {', '.join(failed)}", file=sys.stderr)
        return EXIT_VERIFY
    return EXIT_OK


def _print_graph(t, a: argparse.Namespace) -> None:
    """One graph's step table, node counts per pass, estimates and final verification."""
    print(steps_table(t))
    print(
        f"\nnodes: {t.nodes_before} -> {t.nodes_after} in {len(t.steps)} step{'' if len(t.steps) == 1 else 's'} "
        f"({', '.join(f'{p}: {len(t.steps_of_pass(p))}' for p in dict.fromkeys(s.pass_name for s in t.steps)) or 'nothing matched'})"
    )
    if t.steps and a.estimate and t.graph == "pre-grad":
        from optimus_lens.passes.profit import pass_estimates

        print("estimated effect per call (optimus_lens.passes.profit; CPU eager constants):")
        for name, e in pass_estimates(t).items():
            print(f"  {name:28s} {e.text()}")
    if t.final_verify is not None and t.final_verify.ok is not None:
        print(f"verify ({a.verify}): {verify_text(t.final_verify)} {t.final_verify.message}".rstrip())
