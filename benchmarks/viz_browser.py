"""Next in the app, in headless chromium at 1280x800, on the 21k-node towers trace.

The trace of optimising a towers graph of about ``--nodes`` FX nodes (as
``benchmarks/viz_scale.py`` builds it) is opened in the app as a trace file; then Next
is pressed ``--steps`` times and each time the seconds from the click until the step's
heading shows and until both panes of the new step are drawn are printed (target: both
panes in <= 2 s). Needs playwright and Debian's chromium (``/usr/bin/chromium``).

    .venv/bin/python benchmarks/viz_browser.py --nodes 21000 --steps 4
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from viz_scale import towers_trace  # noqa: E402


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(trace_path: str, steps: int) -> list[dict]:
    """Open ``trace_path`` in a fresh app and press Next ``steps`` times; one dict per press:
    ``step``, ``heading_s`` and ``drawn_s`` (seconds from the click)."""
    from playwright.sync_api import sync_playwright

    port = _port()
    app = subprocess.Popen(
        [sys.executable, "-m", "optimus_lens", "app", "--headless", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    rows = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            for _ in range(60):
                try:
                    page.goto(f"http://127.0.0.1:{port}", timeout=5000)
                    break
                except Exception:  # noqa: BLE001 - the server is still starting
                    time.sleep(1)
            page.get_by_text("Trace file", exact=True).click(timeout=60_000)
            page.locator("input[type=file]").set_input_files(trace_path)
            page.get_by_text("Step 1:", exact=False).first.wait_for(timeout=300_000)
            page.locator(".lens .pane svg g.node").first.wait_for(timeout=120_000)
            for k in range(2, steps + 2):
                old = page.locator(".lens").first.inner_html()
                t0 = time.perf_counter()
                page.get_by_role("button", name="Next").click()
                page.get_by_text(f"Step {k}:", exact=False).first.wait_for(timeout=60_000)
                heading = time.perf_counter() - t0
                while True:
                    try:
                        lens = page.locator(".lens").first
                        if lens.inner_html(timeout=2000) != old and lens.locator(".pane svg g.node").count() > 0:
                            break
                    except Exception:  # noqa: BLE001 - the viewer is being remounted
                        pass
                    page.wait_for_timeout(20)
                rows.append({"step": k, "heading_s": round(heading, 2), "drawn_s": round(time.perf_counter() - t0, 2)})
            browser.close()
    finally:
        os.killpg(app.pid, signal.SIGTERM)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=21000)
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args(argv)
    trace = towers_trace(a.nodes)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "towers.trace.json")
        with open(path, "w") as f:
            json.dump(trace.to_json(), f)
        print(f"{trace.nodes_before} nodes, {len(trace.steps)} steps, trace {os.path.getsize(path) // 1024} KiB")
        for r in measure(path, a.steps):
            print(f"Next -> step {r['step']}: heading {r['heading_s']:.2f} s, both panes drawn {r['drawn_s']:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
