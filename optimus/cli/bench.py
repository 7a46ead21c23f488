"""``optimus bench MODEL``: time and size the graph after each pass, side by side in one run."""

from __future__ import annotations

import argparse
import sys

from optimus_lens.cli.errors import EXIT_OK, BadInput, input_errors
from optimus_lens.cli.jsonout import add_json, json_output
from optimus_lens.cli.options import MODEL, PASSES, PATTERN_FILE, STAGE_ONLY, names_arg


def add_parsers(sub) -> None:
    """Add ``bench`` to the subcommands ``sub``."""
    b = sub.add_parser(
        "bench",
        help="time and size the graph after each pass, side by side in one run (CUDA events on GPU, wall clock on CPU)",
        parents=[MODEL, STAGE_ONLY, PASSES, PATTERN_FILE],
    )
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
        "--kernels",
        action="store_true",
        help="compile each stage with Inductor and count the kernels it generates and the extern "
        "(library) calls it makes, with their names",
    )
    b.add_argument(
        "--against-upstream",
        action="store_true",
        help="add stage 'upstream': PyTorch's pre-grad passes with the equivalent pre_grad_fusion_options "
        "(with --stage post-grad|all also post:inductor, upstream's post_grad_passes with no Optimus options, "
        "and post:upstream, with the options equivalent to ours)",
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
    add_json(b, "the result")
    b.add_argument(
        "--graph",
        type=int,
        default=None,
        help="with graph breaks: which graph to time (0-based; default: the one with the most nodes)",
    )
    b.set_defaults(fn=cmd_bench)


def cmd_bench(a: argparse.Namespace) -> int:
    """Print the bench table (:meth:`optimus_lens.perf.timings.BenchResult.table`) and which graph
    was timed; write the result as JSON (``--json``). Raises BadInput for counts out of range
    or ``--device cuda`` without CUDA."""
    from optimus_lens.frontend.patternfile import load_pattern_file, pipeline_with
    from optimus_lens.frontend.postgrad import stage_pipelines
    from optimus_lens.passes import default_pipeline
    from optimus_lens.passes.post_grad import post_grad_pipeline
    from optimus_lens.perf.bench import bench_pipeline

    if a.repeats < 1 or a.warmup < 0 or (a.threads is not None and a.threads < 1):
        raise BadInput("--repeats and --threads must be at least 1, --warmup at least 0")
    if a.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise BadInput("--device cuda: CUDA is not available on this machine")

    def progress(done: int, total: int, label: str) -> None:
        if a.progress:
            print(f"\r{done}/{total} {label[:60]:60s}", end="" if done < total else "\n", file=sys.stderr)

    with input_errors():
        pre, post, passes = default_pipeline(), post_grad_pipeline(), names_arg(a.passes)
        if a.pattern_file:  # the file's passes where optimus run puts them: post-grad on that stage
            pf = load_pattern_file(a.pattern_file)
            if a.stage == "post-grad":
                post, passes = pipeline_with(pf, passes, base=post), None
            else:
                pre, passes = pipeline_with(pf, passes, base=pre), None
        pre, post = stage_pipelines(a.stage, pre, post, passes)
        r = bench_pipeline(
            a.model,
            passes=None,
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
            pipeline=pre,
            stage=a.stage,
            post_pipeline=post,
            kernels=a.kernels,
        )
    with json_output(a, "bench") as emit:
        print(r.table())
        print(
            f"graph timed: {f'graph {a.graph} (0-based)' if a.graph is not None else 'the one with the most nodes'} "
            "of the captured model (optimus run prints its graph breaks)"
        )
        emit({"model": a.model, **r.to_json()})
    return EXIT_OK
