"""Does every step's picture show the step? The full sweep behind tests/test_browser_fit.py.

For every sample model with at most ``--limit`` captured nodes (2,000: above that, graphs too
big for any fit list what is off-screen), the HTML report of all its steps
(:func:`optimus_lens.viz.report.write_report`) is opened in headless chromium at 1280x800 and
every step is checked in the before | after view and in the diff view: each site and created
node of the step (or the "×k" node it is folded into) drawn inside its pane and the window,
its label at least 9 px tall on screen (``tests/fitcheck.py`` reads this from the page's
geometry, the way ``step_fit.py REPORT.html --trace TRACE.json`` does).

Prints one line per sample, ``NAME: fit K/N (pair) K/N (diff)``, one line per step that does
not fit, and the totals; ``--json PATH`` writes the per-sample figures. Needs playwright and
Debian's chromium (``/usr/bin/chromium``); about 5 minutes on 2 busy cores.

    .venv/bin/python benchmarks/step_fit.py [--only NAME ...] [--limit 2000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fitcheck import report_fits  # noqa: E402

from optimus_lens import sample_models  # noqa: E402
from optimus_lens.frontend.run import optimize  # noqa: E402
from optimus_lens.viz.report import write_report  # noqa: E402

CHROMIUM = "/usr/bin/chromium"


def sweep(names: list[str], limit: int, out_dir: Path) -> dict[str, dict]:
    """name -> {nodes, steps, pair, diff (steps that fit), bad: {"step view": failures}, seconds}
    for each of ``names`` with steps and at most ``limit`` captured nodes."""
    from playwright.sync_api import sync_playwright

    results: dict[str, dict] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        for name in names:
            t0 = time.perf_counter()
            try:
                trace = optimize(f"sample:{name}", verify="off").trace
            except Exception as e:  # noqa: BLE001 - a sample that cannot be captured here (e.g. no transformers)
                print(f"{name}: skipped ({type(e).__name__}: {str(e)[:80]})", flush=True)
                continue
            if not trace.steps or len(trace.initial_graph) > limit:
                continue
            path = out_dir / f"{name}.html"
            write_report(trace, path)
            fits = report_fits(page, path, trace)
            n = len(trace.steps)
            r = {
                "nodes": len(trace.initial_graph),
                "steps": n,
                "pair": sum(1 for (i, v), f in fits.items() if v == "pair" and not f),
                "diff": sum(1 for (i, v), f in fits.items() if v == "diff" and not f),
                "bad": {f"step {i} {v}": f for (i, v), f in fits.items() if f},
                "seconds": round(time.perf_counter() - t0, 1),
            }
            results[name] = r
            print(f"{name}: fit {r['pair']}/{n} (pair) {r['diff']}/{n} (diff)  [{r['seconds']} s]", flush=True)
            for k, f in r["bad"].items():
                print(f"    {k}: {'; '.join(f)}", flush=True)
        browser.close()
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", help="sample names (default: all)")
    ap.add_argument("--limit", type=int, default=2000, help="largest captured graph checked (nodes)")
    ap.add_argument("--json", help="write the per-sample figures here")
    a = ap.parse_args()
    names = a.only or sample_models.names()
    with tempfile.TemporaryDirectory() as tmp:
        res = sweep(names, a.limit, Path(tmp))
    steps = sum(r["steps"] for r in res.values())
    pair = sum(r["pair"] for r in res.values())
    diff = sum(r["diff"] for r in res.values())
    print(f"total: {len(res)} samples, fit {pair}/{steps} steps (pair), {diff}/{steps} (diff)")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0 if pair == diff == steps else 1


if __name__ == "__main__":
    sys.exit(main())
