"""``--json [PATH]``: a command's result as one JSON document, for scripts.

With a PATH the document goes to that file and the command prints what it always
prints; with no PATH (``--json`` alone, or ``--json -``) the document is the only thing
on stdout and everything else the command says goes to stderr. Every document starts
with ``"schema": {"name": "optimus.COMMAND", "version": N}``; ``docs/json.md`` documents
each schema. A version changes only when a field changes meaning or goes away; new
fields may appear in any version.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import Any

STDOUT = "-"

#: command -> the version of its JSON schema
VERSIONS = {
    "run": 1,
    "match": 1,
    "why": 1,
    "compare": 1,
    "check": 1,
    "passes": 1,
    "samples": 1,
    "sweep": 1,
    "log": 1,
    "bench": 1,
}


def add_json(parser: argparse.ArgumentParser, what: str) -> None:
    """Add ``--json [PATH]`` to ``parser``; ``what`` says what the document holds."""
    parser.add_argument(
        "--json",
        nargs="?",
        const=STDOUT,
        default=None,
        metavar="PATH",
        help=f"write {what} as JSON to PATH, or with no PATH to stdout (then nothing else goes to stdout); "
        "schema in docs/json.md",
    )


def document(command: str, body: dict) -> dict:
    """``body`` under the ``schema`` header of ``command``."""
    return {"schema": {"name": f"optimus.{command}", "version": VERSIONS[command]}, **body}


def _clean(x: Any) -> Any:
    """JSON-safe: NaN and infinities as strings, tuples as lists, other objects as text."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    return str(x)


@contextmanager
def json_output(a: argparse.Namespace, command: str) -> Iterator[Callable[[dict], None]]:
    """Inside the block the command prints as usual; the function it yields takes the
    document's body and writes it where ``--json`` says, after the block (nothing when
    ``--json`` was not given). With ``--json`` to stdout, the block's stdout goes to
    stderr."""
    where = getattr(a, "json", None)
    out = sys.stdout
    docs: list[dict] = []
    if where == STDOUT:
        with redirect_stdout(sys.stderr):
            yield docs.append
    else:
        yield docs.append
    if where is None or not docs:
        return
    text = json.dumps(_clean(document(command, docs[-1])), indent=1)
    if where == STDOUT:
        out.write(text + "\n")
        out.flush()
    else:
        Path(where).write_text(text + "\n")
        print(f"JSON written to {where}", file=sys.stderr)


def json_error(a: argparse.Namespace, kind: str, error: BaseException, status: int) -> None:
    """With ``--json`` to stdout, a command that ends in an error still writes one document
    there: its schema header and ``error`` (``kind``: ``bad-input`` or ``pattern-raised``,
    ``message``, ``exit_status``), so a script reading stdout gets JSON, not nothing."""
    command = getattr(a, "cmd", None)
    if getattr(a, "json", None) != STDOUT or command not in VERSIONS:
        return
    body = {"error": {"kind": kind, "message": str(error), "exit_status": status}}
    sys.stdout.write(json.dumps(_clean(document(command, body)), indent=1) + "\n")
    sys.stdout.flush()
