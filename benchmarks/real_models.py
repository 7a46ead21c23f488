"""Real-model samples: what our pipeline and PyTorch's own pre-grad Optimus make of them.

For each sample (default: mmoe, twin_towers, deepfm), in one process:

* capture the Dynamo pre-grad graph;
* **ours**: ``default_pipeline()`` (global search), verified at the end;
* **upstream**: ``torch._inductor.fx_passes.pre_grad.pre_grad_passes`` with
  ``UPSTREAM_OPTIONS`` (every pre-grad batch fusion our pipeline runs, with upstream's
  defaults, plus normalization and the split/cat passes), through
  :func:`optimus.inductor.run_upstream`;
* time the captured graph, ours and upstream's **round-robin in the same run**
  (:func:`optimus.bench.measure_stages`: one sample of each per round, each sample a
  batch of calls of at least ~2 ms), torch at one thread; median and p10..p90 (ms),
  speedup = captured median / median.

Prints a Markdown table (nodes before/after, steps by pattern, speedups with p10..p90),
then for every pass that made a step its estimated effect (:mod:`optimus.profit`)
against the measured change of the p10 latency from the stage before (the passes' stages are
timed in the same rounds), and how often the two have the same sign; with ``--json``,
the raw figures. Run::

    .venv/bin/python benchmarks/real_models.py --repeats 60
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sample_models  # noqa: E402
from optimus.bench import measure_stages  # noqa: E402
from optimus.capture import capture  # noqa: E402
from optimus.engine import Engine, RunOptions, copy_graph_module  # noqa: E402
from optimus.inductor import run_upstream  # noqa: E402
from optimus.passes import default_pipeline  # noqa: E402
from optimus.profit import pass_estimates  # noqa: E402

UPSTREAM_OPTIONS = {
    "normalization_pass": {}, "batch_linear_lhs": {}, "batch_linear": {}, "batch_layernorm": {}, "batch_tanh": {},
    "batch_sigmoid": {}, "batch_relu": {}, "merge_splits_pass": {}, "split_cat_pass": {}, "unbind_stack_pass": {},
    "merge_getitem_cat_pass": {}, "mutate_cat_pass": {},
}
SAMPLES = ("mmoe", "twin_towers", "deepfm")


def measure(name: str, repeats: int) -> dict:
    model, inputs = sample_models.get(name)
    c = capture(model, inputs)
    ours = copy_graph_module(c.gm)
    eng = Engine(ours, c.example_inputs, default_pipeline(), RunOptions(verify="end", keep_stages=True))
    trace = eng.run()
    assert trace.final_verify.ok, f"{name}: our final graph does not verify: {trace.final_verify.message}"
    up = run_upstream(c.gm, c.example_inputs, UPSTREAM_OPTIONS)
    stepped = {st.pass_name for st in trace.steps}
    passes = [(f"pass:{n}", g) for n, g in eng.stages[1:] if n in stepped]
    t = measure_stages([("captured", copy_graph_module(c.gm)), ("ours", ours), ("upstream", up.gm), *passes],
                       c.example_inputs, repeats=repeats, warmup=5, device="cpu")
    timing = {s.stage: s for s in t.stages}
    # estimate vs measurement, pass by pass: the change of the p10 from the stage before (on a
    # loaded machine the fast end of the distribution is the stable one)
    checks, prev = [], timing["captured"]
    for (label, _), est in zip(passes, pass_estimates(trace).values()):
        cur = timing[label]
        measured_us = (prev.p10_ms - cur.p10_ms) * 1e3
        spread_us = max(prev.p90_ms - prev.p10_ms, cur.p90_ms - cur.p10_ms) * 1e3
        checks.append({"pass": label[5:], "estimate_us": round(est.us, 1), "measured_us": round(measured_us, 1),
                       "spread_us": round(spread_us, 1), "same_sign": (est.us >= 0) == (measured_us >= 0)})
        prev = cur
    return {
        "checks": checks,
        "model": name, "nodes_before": len(c.gm.graph.nodes), "nodes_ours": len(ours.graph.nodes),
        "nodes_upstream": up.nodes_after, "steps": dict(Counter(s.pattern for s in trace.steps)),
        "upstream_fusions": {k: v for k, v in up.fusions.items() if v},
        **{f"{k}_{f}": getattr(timing[k], f) for k in ("captured", "ours", "upstream")
           for f in ("median_ms", "p10_ms", "p90_ms", "speedup")},
    }


def table(rows: list[dict]) -> str:
    def cell(r, k):
        c = r["captured_median_ms"]
        lo, hi = c / r[f"{k}_p90_ms"], c / r[f"{k}_p10_ms"]
        return f"{r[f'{k}_speedup']:.2f}x ({lo:.2f}..{hi:.2f})"

    out = ["| model | nodes captured -> ours / upstream | our steps by pattern | upstream rewrites by pass | "
           "captured ms (p10..p90) | ours speedup (p10..p90) | upstream speedup (p10..p90) |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        steps = ", ".join(f"{k} {v}" for k, v in r["steps"].items())
        ups = ", ".join(f"{k} {v}" for k, v in r["upstream_fusions"].items()) or "none"
        out.append(f"| {r['model']} | {r['nodes_before']} -> {r['nodes_ours']} / {r['nodes_upstream']} | {steps} | "
                   f"{ups} | {r['captured_median_ms']:.3f} ({r['captured_p10_ms']:.3f}..{r['captured_p90_ms']:.3f}) | "
                   f"{cell(r, 'ours')} | {cell(r, 'upstream')} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", default=",".join(SAMPLES))
    ap.add_argument("--repeats", type=int, default=60, help="timed rounds (default 60)")
    ap.add_argument("--json", help="write the rows as JSON here")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = [measure(n.strip(), a.repeats) for n in a.samples.split(",") if n.strip()]
    print(f"torch {torch.__version__}, CPU, 1 thread, {a.repeats} rounds; speedup = captured median / median; "
          "in brackets captured median / p90 .. / p10")
    print(table(rows))
    checks = [c for r in rows for c in r["checks"]]
    right = sum(c["same_sign"] for c in checks)
    print(f"\nestimate (optimus.profit) vs measured change per pass: same sign in {right} of {len(checks)} passes")
    for r in rows:
        for c in r["checks"]:
            print(f"  {r['model']:12s} {c['pass']:28s} estimate {c['estimate_us']:+8.1f} us  measured "
                  f"{c['measured_us']:+8.1f} us (spread {c['spread_us']:.1f})  {'ok' if c['same_sign'] else 'WRONG'}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
