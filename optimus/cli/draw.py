"""The offline HTML files, drawn by ``optimus_lens.viz``: ``optimus report`` (every step of
a saved trace) and ``optimus lesson`` (a pattern's walkthrough, built by
``optimus_lens.teach``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from optimus_lens.cli.errors import EXIT_OK, BadInput
from optimus_lens.cli.options import OUTPUT, TRACE
from optimus_lens.cli.traces import graphs_note, load_trace, pick_graph


def add_parsers(sub) -> None:
    """Add ``report`` and ``lesson`` to the subcommands ``sub``; their messages start
    ``optimus report:`` / ``optimus lesson:``."""
    o = sub.add_parser(
        "report",
        help="write a self-contained HTML report of a saved trace (before/after and diff "
        "of every step, left/right keys between steps)",
        parents=[TRACE, OUTPUT],
    )
    o.add_argument("--hops", type=int, default=2, help="neighbourhood hops of big graphs' views (default 2)")
    o.set_defaults(fn=cmd_report, who="optimus report")
    le = sub.add_parser(
        "lesson",
        help="write a pattern's walkthrough (what it looks for, the search, the match, "
        "the graph after, what it bought, a why-not exercise) as one offline HTML file",
        parents=[OUTPUT],
    )
    le.add_argument("pattern", nargs="?", help="a predefined pattern (see `optimus passes`)")
    le.add_argument("--all", action="store_true", help="every predefined pattern: -o is a directory, DIR/PATTERN.html")
    le.add_argument("--repeats", type=int, default=7, help="latency samples per graph (default 7)")
    le.add_argument("--text-scale", type=float, default=1.0, help="text and zoom scale (1.7 suits a projector)")
    le.set_defaults(fn=cmd_lesson, who="optimus lesson")


def cmd_report(a: argparse.Namespace) -> int:
    """Write the HTML report of a saved trace (:func:`optimus_lens.viz.report.write_report`, its
    steps' pattern facts from :func:`optimus_lens.passes.pass_catalogue`) and print its size. A
    trace of several graphs is drawn one graph per report: ``--graph``, default the first
    graph with steps. Raises BadInput when the trace cannot be read, has no such graph, or
    the file cannot be written."""
    from optimus_lens.passes import pass_catalogue
    from optimus_lens.viz import ViewOptions
    from optimus_lens.viz.report import write_report

    run = load_trace(a.trace)
    trace = pick_graph(run, a.graph, first=True)
    try:
        size = write_report(trace, a.output, catalogue=pass_catalogue(), opts=ViewOptions(hops=a.hops))
    except OSError as e:
        raise BadInput(f"cannot write {a.output}: {e}") from e
    print(f"wrote {a.output}: {size / 1e6:.2f} MB, {len(trace.steps)} steps")
    note = graphs_note(run, trace)
    if note:
        print(note)
    return EXIT_OK


def cmd_lesson(a: argparse.Namespace) -> int:
    """Write one pattern's lesson to ``-o``, or (``--all``) every predefined pattern's to
    ``DIR/PATTERN.html``: each walkthrough built by :func:`optimus_lens.teach.walk.walkthrough`
    and drawn by :func:`optimus_lens.viz.lesson.write_lesson`. Raises BadInput for an unknown
    pattern (the known ones listed), neither or both of PATTERN and ``--all``, ``--repeats``
    below 1, or an output that cannot be written."""
    from optimus_lens.teach.lookup import TeachError, predefined
    from optimus_lens.teach.walk import walkthrough
    from optimus_lens.viz.lesson import write_lesson

    names = predefined()
    if a.all == bool(a.pattern) or (a.pattern and a.pattern not in names):
        what = f"unknown pattern {a.pattern!r}" if a.pattern and not a.all else "give one PATTERN or --all"
        raise BadInput(f"{what}; patterns: {', '.join(names)}")
    if a.repeats < 1:
        raise BadInput(f"--repeats must be at least 1, not {a.repeats}")
    try:
        if a.all:
            Path(a.output).mkdir(parents=True, exist_ok=True)
        for name in names if a.all else [a.pattern]:
            out = Path(a.output) / f"{name}.html" if a.all else Path(a.output)
            size = write_lesson(walkthrough(name, repeats=a.repeats), out, text_scale=a.text_scale)
            print(f"wrote {out}: {size / 1e3:.0f} kB")
    except TeachError as e:
        raise BadInput(str(e)) from e
    except OSError as e:
        raise BadInput(f"cannot write {a.output}: {e}") from e
    return EXIT_OK
