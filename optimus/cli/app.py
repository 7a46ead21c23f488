"""``optimus app``: start the Streamlit app (``optimus_lens.app``), on this machine only unless
asked otherwise."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

from optimus_lens.cli.errors import BadInput

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def add_parsers(sub) -> None:
    """Add ``app`` to the subcommands ``sub``."""
    w = sub.add_parser("app", help="start the Streamlit app")
    w.add_argument("--port", type=int, default=8501)
    w.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default: 127.0.0.1, this machine only; the app runs user code)",
    )
    w.add_argument("--model", help="sample model selected first, e.g. sample:bert (default sample:recsys_towers)")
    w.add_argument("--headless", action="store_true")
    w.add_argument("--sweep", help="open this sweep directory (written by optimus sweep) on the Sweep page")
    w.set_defaults(fn=cmd_app)


def app_command(port: int = 8501, host: str = "127.0.0.1", headless: bool = False) -> list[str]:
    """The command line that starts the Streamlit app on ``host``:``port``.

    The app runs user code (the Python-factory box, pattern files), so it listens on the
    loopback address unless another ``host`` is asked for explicitly."""
    app = Path(str(resources.files("optimus_lens.app") / "main.py"))
    cmd = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(app),
        "--server.port",
        str(port),
        "--server.address",
        host,
        "--browser.gatherUsageStats",
        "false",
    ]
    if headless:
        cmd += ["--server.headless", "true"]
    return cmd


def cmd_app(a: argparse.Namespace) -> int:
    """Run the app until it stops; its exit status is ours. The first model and the sweep
    directory reach it as ``OPTIMUS_LENS_MODEL`` / ``OPTIMUS_LENS_SWEEP``. Raises BadInput for
    a ``--sweep`` directory without results.jsonl; warns on stderr for a host other than
    the loopback address."""
    env = dict(os.environ)
    if a.model:
        env["OPTIMUS_LENS_MODEL"] = a.model
    if a.sweep:
        if not os.path.isfile(os.path.join(a.sweep, "results.jsonl")):
            raise BadInput(
                f"{a.sweep} is not a sweep directory (no results.jsonl; `optimus sweep --out DIR` writes one)"
            )
        env["OPTIMUS_LENS_SWEEP"] = os.path.abspath(a.sweep)
    if a.host not in LOOPBACK:
        print(
            f"optimus: warning: the app listens on {a.host}:{a.port}; anyone who can reach it can run Python "
            "code on this machine (model factories, pattern files)",
            file=sys.stderr,
        )
    return subprocess.call(app_command(a.port, a.host, a.headless), env=env)
