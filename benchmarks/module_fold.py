"""When should module folding be on by default? For each realistic and demo sample, every
step's picture (before | after on one layout, the app's defaults) is laid out with module
folding off and on, and the script prints, per step, the nodes drawn (the union of both
sides), and the text size at which the whole picture fits one pane of the side-by-side
viewer at 1280x800 (about 600 x 520 px): ``px = 10 pt x min(600 / width, 520 / height)``
with the layout's size in points. A picture whose fit-all text is below ~5 px cannot be
read as a whole: the reader sees only a window of it. The threshold
(:data:`optimus_lens.viz.MODULES_ABOVE`) is chosen from these rows (docs/ARCHITECTURE.md).

    .venv/bin/python benchmarks/module_fold.py --json module_fold.json   # ~2 min
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from optimus_lens.frontend.run import optimize  # noqa: E402
from optimus_lens.viz import ViewOptions, step_picture  # noqa: E402
from optimus_lens.viz.select import drawable_count  # noqa: E402

SAMPLES = (
    "recsys_towers",
    "transformer_block",
    "swish_mlp",
    "deepfm",
    "twin_towers",
    "mmoe",
    "recsys_towers32",
    "bert",
    "gpt2",
)
PANE_W, PANE_H = 600.0, 520.0


def fit_px(layout) -> float:
    """Text height (px) of a 10 pt label when the whole layout fits one pane."""
    x0, y0, x1, y1 = layout.bb
    return 10.0 * min(PANE_W / max(x1 - x0, 1.0), PANE_H / max(y1 - y0, 1.0))


def measure(name: str, max_steps: int) -> list[dict]:
    trace = optimize(f"sample:{name}", verify="off").trace
    n = len(trace.steps)
    idx = sorted({1 + round(i * (n - 1) / max(max_steps - 1, 1)) for i in range(min(n, max_steps))}) if n else []
    rows = []
    for i in idx:
        drawable = max(drawable_count(trace.before(i), None, True), drawable_count(trace.after(i), None, True))
        off = step_picture(trace, i, ViewOptions(modules=False))
        on = step_picture(trace, i, ViewOptions(modules=True))
        rows.append(
            {
                "model": name,
                "step": i,
                "drawable": drawable,
                "drawn_off": off.diff.shown,
                "drawn_on": on.diff.shown,
                "fit_px_off": round(fit_px(off.layout), 1),
                "fit_px_on": round(fit_px(on.layout), 1),
                "modules_folded": len(on.diff.modules),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", default=",".join(SAMPLES))
    ap.add_argument("--max-steps", type=int, default=6, help="steps per model, evenly spaced")
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args(argv)
    rows = []
    for name in a.samples.split(","):
        for r in measure(name, a.max_steps):
            print(json.dumps(r), flush=True)
            rows.append(r)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
