"""``optimus sweep SPECS...``: every model x configuration in its own process (or as Ray
tasks), one row per run in DIR/results.jsonl, and DIR/summary.html rewritten after every
row (:mod:`optimus_lens.sweep`, :mod:`optimus_lens.viz.sweep_summary`)."""

from __future__ import annotations

import argparse
import sys

from optimus_lens.cli.errors import EXIT_OK, EXIT_VERIFY, BadInput
from optimus_lens.cli.jsonout import add_json, json_output
from optimus_lens.cli.options import MODEL_HELP, VERIFY
from optimus_lens.cli.text import hf_text

#: the exit status of an interrupted sweep (128 + SIGINT, as a shell reports it)
EXIT_INTERRUPTED = 130


def add_parsers(sub) -> None:
    """Add ``sweep`` to the subcommands ``sub``."""
    sw = sub.add_parser(
        "sweep",
        help="run every model x configuration, each in its own process (or as Ray "
        "tasks): one row per run in DIR/results.jsonl, DIR/summary.html, traces and reports",
        description="Run every model x configuration, each in its own process (or as Ray tasks). A run whose "
        "final graph fails verification is bisected to its first failing step.",
        parents=[VERIFY],
    )
    sw.add_argument("specs", nargs="*", help=MODEL_HELP + "; sample:* is every sample, hf:* every HF architecture")
    sw.add_argument("--models-file", help="more specs, one per line (# starts a comment)")
    sw.add_argument(
        "--configs",
        help='JSON list of configs: {"name", "passes", "skip", "pattern_files", '
        '"search": global|upstream, "profitable_only"} (default: one config, the default pipeline)',
    )
    sw.add_argument(
        "--observe-upstream",
        action="store_true",
        help="also record PyTorch's pre-grad passes on each capture and count the differences",
    )
    sw.add_argument("--bench", action="store_true", help="time the captured graph and ours (CPU, one thread)")
    sw.add_argument("--bench-repeats", type=int, default=10, help="timed rounds with --bench (default 10)")
    sw.add_argument(
        "--out",
        default="sweep-out",
        help="the sweep directory (default: sweep-out); a sweep "
        "restarted into it skips the runs already in its results.jsonl",
    )
    sw.add_argument("--workers", type=int, default=1, help="runs at a time (default 1; with --ray local, its CPUs)")
    sw.add_argument("--time-limit", type=float, default=600, help="seconds per run before it is killed (default 600)")
    sw.add_argument(
        "--memory-limit", type=float, default=8, help="GiB of address space per run (default 8; 0: no limit)"
    )
    sw.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run as Ray tasks: 'local' starts Ray here, or a cluster "
        "address ('auto', 'ray://host:10001'); needs pip install 'optimus-lens[sweep]'",
    )
    sw.add_argument(
        "--ray-wheel",
        help="ship the packages of this built Optimus Lens wheel to Ray workers instead of "
        "this checkout's folders (workers need torch installed)",
    )
    sw.add_argument("--no-reports", action="store_true", help="do not write each run's HTML report")
    sw.add_argument("--retry-failed", action="store_true", help="also re-run the runs whose row is error or failed")
    sw.add_argument("--quiet", action="store_true", help="no progress bar or per-run lines")
    sw.add_argument("--list-hf", action="store_true", help="list the hf:NAME architectures and exit")
    add_json(sw, "every run's row")
    sw.set_defaults(fn=cmd_sweep)


def cmd_sweep(a: argparse.Namespace) -> int:
    """Run the sweep and print one line per run that is not ok. Exit 0 when every run is
    ok, 1 when any is not, 130 when interrupted (the finished rows are kept); raises
    BadInput for bad specs, configs or limits, and for ``--ray`` without Ray."""
    from optimus_lens.sweep.configs import DEFAULT_CONFIG, SweepError, expand_specs, load_configs
    from optimus_lens.sweep.driver import sweep
    from optimus_lens.sweep.task import GiB, SweepOptions
    from optimus_lens.viz.sweep_summary import write_summary

    if a.list_hf:
        print(hf_text())
        return EXIT_OK
    if a.workers < 1 or a.time_limit <= 0 or a.memory_limit < 0 or a.bench_repeats < 1:
        raise BadInput("--workers, --time-limit and --bench-repeats must be positive, --memory-limit at least 0")
    try:
        models = expand_specs(a.specs, a.models_file)
        configs = load_configs(a.configs) if a.configs else [DEFAULT_CONFIG]
        options = SweepOptions(
            verify=a.verify,
            observe_upstream=a.observe_upstream,
            bench=a.bench,
            bench_repeats=a.bench_repeats,
            reports=not a.no_reports,
            time_limit_s=a.time_limit,
            memory_limit_bytes=int(a.memory_limit * GiB) or None,
        )
        print(
            f"sweep: {len(models)} model(s) x {len(configs)} config(s) into {a.out} "
            f"({'Ray at ' + a.ray if a.ray else f'{a.workers} local worker(s)'})",
            file=sys.stderr,
        )
        res = sweep(
            models,
            configs,
            options,
            a.out,
            workers=a.workers,
            ray_address=a.ray,
            ray_wheel=a.ray_wheel,
            retry_failed=a.retry_failed,
            progress=not a.quiet,
            on_rows=write_summary,
        )
    except (SweepError, ImportError) as e:
        raise BadInput(str(e)) from e
    except KeyboardInterrupt:
        print(
            f"\noptimus: sweep interrupted; the finished runs are in {a.out}/results.jsonl, and the same command "
            "resumes it",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    rows = [r for r in res.rows if r is not None]
    bad = [r for r in rows if r["status"] != "ok"]
    with json_output(a, "sweep") as emit:
        _print_rows(res, rows, bad)
        counts: dict[str, int] = {}
        for r in rows:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        emit(
            {
                "out": str(res.out_dir),
                "results": str(res.out_dir / "results.jsonl"),
                "summary": str(res.out_dir / "summary.html"),
                "skipped": res.skipped,
                "wall_s": res.wall_s,
                "status": counts,
                "rows": rows,
            }
        )
    return EXIT_VERIFY if bad else EXIT_OK


def _print_rows(res, rows: list[dict], bad: list[dict]) -> None:
    print(
        f"{len(rows)} runs ({res.skipped} already done, skipped) in {res.wall_s:.1f} s: "
        f"{len(rows) - len(bad)} ok, {len(bad)} not ok; results: {res.out_dir / 'results.jsonl'}, "
        f"summary: {res.out_dir / 'summary.html'}"
    )
    for r in bad:
        print(
            f"  {r['status']:13s} {r['key']}: "
            + (
                (r.get("error") or "").splitlines()
                or [f"first failing step {r['first_failing']['index']}" if r.get("first_failing") else ""]
            )[0][:200]
        )
