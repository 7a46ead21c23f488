"""The ``optimus`` command.

    optimus run MODEL [--passes a,b] [--skip c,d] [--verify step|end|off] [--grads] [--trace out.json]
                [--search global|upstream] [--profitable-only] [--estimate] [--pattern-file F] [--dynamic]
                [--stage pre-grad|post-grad|all] [--mode inference|training]
    optimus samples
    optimus passes
    optimus log PATH [--replay]
    optimus check MODEL --expect 'PATTERN>=N' ... [--verify step|end|off] [--junit out.xml]
    optimus match MODEL --pattern-file F [--misses N] [--json out.json] [--trace out.json] [--draw out.html] [--stage S] [--mode M]
    optimus bench MODEL [--device cpu|cuda] [--mode inference|training] [--compile] [--kernels] [--against-upstream]
                  [--alone] [--passes a,b] [--repeats N] [--threads N] [--json out.json] [--stage S]
    optimus show TRACE.json [--graph pre-grad|forward|backward]
    optimus repro TRACE.json [--step N] [--graph G] [-o repro.py]
    optimus diff TRACE.json [--step N] [--graph G]
    optimus inspect TRACE.json NODE [--step N] [--graph G]
    optimus why MODEL [GRAPH:]NODE [--step N] [--pattern P] [--search global|upstream] [--stage S] [--mode M]
    optimus bisect MODEL [--verify off|step] [--trace out.json] [--stage S] [--mode M]
    optimus observe MODEL [--options JSON] [--verify step|off] [--trace out.json] [--stage S] [--mode M]
    optimus compare MODEL [--options JSON] [--stage pre-grad|post-grad] [--mode M]
    optimus compare A B [--report out.html]       (two traces or model specs: any two runs)
    optimus report TRACE.json -o report.html [--graph G]
    optimus lesson PATTERN -o lesson.html | --all -o DIR
    optimus app [--port N] [--sweep DIR]
    optimus sweep SPECS... [--models-file F] [--configs F.json] [--verify step|end|off] [--observe-upstream]
                  [--bench] [--out DIR] [--workers N] [--ray ADDRESS] [--list-hf]

MODEL is ``sample:NAME`` (``optimus run sample:recsys_towers``; ``optimus samples`` lists
them), ``package.module:factory`` or ``path/to/file.py:factory`` (a callable returning
``(model, example_inputs)``, resolved from the current directory), or a ``.pt2`` file
saved by ``torch.export.save``, or ``hf:NAME`` (a HuggingFace architecture built offline with
random weights; ``optimus sweep --list-hf``), or ``log:PATH[#SELECTOR]`` (a graph of a
``TORCH_TRACE`` / ``TORCH_COMPILE_DEBUG`` compile log; ``optimus log PATH`` lists them).
``--json [PATH]`` on run, match, why, compare, check, passes, samples, sweep, log and bench
writes the command's result as JSON (docs/json.md).
Exit status: 0 ok; 1 a step failed verification; 2 bad input (unknown model or pass,
untraceable model, unreadable trace); 3 a pattern (or an observed upstream pass) raised.

Each command (or family) is one module of this package, its parser beside its code; the
options several share are the parent parsers of :mod:`optimus_lens.cli.options`.
"""

from __future__ import annotations

import argparse
import os
import sys

from optimus_lens.cli import app, bench, bisect, catalogue, check, draw, log, match, run, sweep, traces, upstream, why
from optimus_lens.cli.errors import EXIT_INPUT, EXIT_PATTERN, BadInput, PatternRaised
from optimus_lens.cli.jsonout import json_error


def build_parser() -> argparse.ArgumentParser:
    """The ``optimus`` parser: one subcommand per command, each with ``fn`` (the command,
    ``Namespace -> exit status``) and ``who`` (how its messages start) as defaults."""
    ap = argparse.ArgumentParser(prog="optimus", description=__doc__.split("\n\n")[0])
    ap.set_defaults(who="optimus")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for family in (run, catalogue, log, match, check, bench, traces, why, bisect, upstream, draw, app, sweep):
        family.add_parsers(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Run ``optimus ARGV`` (default: ``sys.argv[1:]``) and return its exit status. Bad input
    (:class:`BadInput`) and a pattern that raised (:class:`PatternRaised`) are one line on
    stderr and exit 2 / 3."""
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except BadInput as e:
        print(f"{args.who}: {e}", file=sys.stderr)
        json_error(args, "bad-input", e, EXIT_INPUT)
        return EXIT_INPUT
    except PatternRaised as e:
        print(f"{args.who}: {e}", file=sys.stderr)
        json_error(args, "pattern-raised", e, EXIT_PATTERN)
        return EXIT_PATTERN
    except BrokenPipeError:  # the reader left (`optimus passes | head`): stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the flush at exit does not raise again
        return 0
