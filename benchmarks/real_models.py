"""Real-model samples: what our pipeline and PyTorch's own pre-grad Optimus make of them.

For each sample (default: mmoe, twin_towers, deepfm), in one process:

* capture the Dynamo pre-grad graph;
* **ours**: ``default_pipeline()`` (global search), verified at the end, keeping the graph
  after every pass; then **ours + prepack**: the same graph with its parameter stacks
  folded into constants once (:mod:`optimus_lens.perf.prepack`, inference);
* **upstream**: ``torch._inductor.fx_passes.pre_grad.pre_grad_passes`` with
  ``UPSTREAM_OPTIONS`` (every pre-grad batch fusion our pipeline runs, with upstream's
  defaults, plus normalization and the split/cat passes), through
  :func:`optimus_lens.inductor.observe.run_upstream`;
* **reference**: the sample's hand-fused module (``optimus_reference()``: weights packed
  once, every parallel op batched), the bound; for twin_towers also **reference, towers
  only** (the towers hand-fused, the per-tower normalize / product / sum tail as in the
  model: the bound for fusions of the towers, as no Optimus pass fuses that tail);
* time all of them and the graph after each pass that made a step **round-robin in the
  same run** (:func:`optimus_lens.perf.bench.measure`: one sample of each per round, each sample a
  batch of calls of at least ~2 ms, the thread's CPU time as the clock), torch at one
  thread unless ``--threads``; median and p10..p90 (ms), speedup = captured median / median.

Prints a Markdown table (nodes before/after, steps by pattern, speedups with p10..p90),
then for every pass that made a step its estimated effect (:mod:`optimus_lens.passes.profit`) against
the measured one (the median per-round ratio to the stage before, as a time saved per
call, with its p10..p90) and how often the two have the same sign, over all passes and
over those whose measured effect is beyond the noise (p10..p90 of the ratio excludes 1);
passes flagged as slowdowns (:attr:`optimus_lens.perf.timings.StageTiming.slowdown`) are marked.
With ``--json``, the raw figures. Run::

    .venv/bin/python benchmarks/real_models.py --repeats 60
    .venv/bin/python benchmarks/real_models.py --paired 400 --samples twin_towers,mmoe
    .venv/bin/python benchmarks/real_models.py --profile
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from optimus_lens import sample_models  # noqa: E402
from optimus_lens.core.engine import Engine, RunOptions, copy_graph_module  # noqa: E402
from optimus_lens.frontend.capture import capture  # noqa: E402
from optimus_lens.inductor.observe import run_upstream  # noqa: E402
from optimus_lens.passes import default_pipeline  # noqa: E402
from optimus_lens.passes.profit import pass_estimates  # noqa: E402
from optimus_lens.perf.bench import measure as measure_stages
from optimus_lens.perf.prepack import prepack  # noqa: E402
from optimus_lens.perf.timings import Stage  # noqa: E402

UPSTREAM_OPTIONS = {
    "normalization_pass": {},
    "batch_linear_lhs": {},
    "batch_linear": {},
    "batch_layernorm": {},
    "batch_tanh": {},
    "batch_sigmoid": {},
    "batch_relu": {},
    "merge_splits_pass": {},
    "split_cat_pass": {},
    "unbind_stack_pass": {},
    "merge_getitem_cat_pass": {},
    "mutate_cat_pass": {},
}
SAMPLES = ("mmoe", "twin_towers", "deepfm")


def _references(name: str, model, inputs: tuple) -> list[Stage]:
    """The sample's hand-fused bounds as captured graphs (none when it has no ``optimus_reference``)."""
    make = getattr(model, "optimus_reference", None)
    if not callable(make):
        return []
    refs = [("reference", make())]
    if name == "twin_towers":
        from optimus_lens.sample_models.recsys_real import FusedTwinTowers

        refs.append(("reference, towers only", FusedTwinTowers(model, fuse_tail=False)))
    out = []
    for label, ref in refs:
        with torch.no_grad():
            torch.testing.assert_close(ref.eval()(*inputs), model(*inputs))
        c = capture(ref, inputs)
        out.append(Stage(label, c.gm, c.example_inputs, "reference"))
    return out


def measure(name: str, repeats: int) -> dict:
    model, inputs = sample_models.get(name)
    c = capture(model, inputs)
    ours = copy_graph_module(c.gm)
    eng = Engine(ours, c.example_inputs, default_pipeline(), RunOptions(verify="end", keep_stages=True))
    trace = eng.run()
    assert trace.final_verify.ok, f"{name}: our final graph does not verify: {trace.final_verify.message}"
    packed = copy_graph_module(ours)
    pk = prepack(packed, c.example_inputs, guard=None)
    up = run_upstream(c.gm, c.example_inputs, UPSTREAM_OPTIONS)
    per_pass = Counter(st.pass_name for st in trace.steps)
    ins = c.example_inputs
    stages = [Stage("captured", copy_graph_module(c.gm), ins, "baseline")]
    stages += [Stage(n, g, ins, "pass", per_pass[n]) for n, g in eng.stages[1:] if n in per_pass]
    stages.append(Stage("prepack_weights", packed, ins, "prepack", len(pk.constants)))
    stages.append(Stage("upstream", up.gm, ins, "upstream"))
    stages += _references(name, model, inputs)
    t = measure_stages(stages, repeats=repeats, warmup=5, device="cpu")
    timing = {s.stage: s for s in t.stages}
    last_pass = [s for s in t.stages if s.kind == "pass"][-1]
    timing["ours"], timing["ours_prepack"] = last_pass, timing["prepack_weights"]
    checks = []
    for pname, est in pass_estimates(trace).items():
        cur = timing[pname]
        prev_ms = timing[cur.previous].median_ms
        saved = lambda r, prev_ms=prev_ms: prev_ms * (1 - 1 / r) * 1e3  # noqa: E731 - us saved per call at ratio r
        beyond = not (cur.vs_previous_p10 <= 1.0 <= cur.vs_previous_p90)
        checks.append(
            {
                "pass": pname,
                "estimate_us": round(est.us, 1),
                "measured_us": round(saved(cur.vs_previous), 1),
                "measured_p10_us": round(saved(cur.vs_previous_p10), 1),
                "measured_p90_us": round(saved(cur.vs_previous_p90), 1),
                "beyond_noise": beyond,
                "slowdown": cur.slowdown,
                "same_sign": (est.us >= 0) == (cur.vs_previous >= 1.0),
            }
        )
    refs = [s for s in t.stages if s.kind == "reference"]
    return {
        "checks": checks,
        "model": name,
        "nodes_before": len(c.gm.graph.nodes),
        "nodes_ours": len(ours.graph.nodes),
        "nodes_ours_prepack": len(packed.graph.nodes),
        "nodes_upstream": up.nodes_after,
        "steps": dict(Counter(s.pattern for s in trace.steps)),
        "upstream_fusions": {k: v for k, v in up.fusions.items() if v},
        "references": [r.stage for r in refs],
        **{
            f"{k}_{f}": getattr(timing[k], f)
            for k in ("captured", "ours", "ours_prepack", "upstream", *[r.stage for r in refs])
            for f in ("median_ms", "p10_ms", "p90_ms", "speedup")
        },
    }


def profile(name: str, calls: int = 200, top: int = 8) -> str:
    """Where the time goes: per aten op, self CPU time per call (us) and calls per forward,
    by ``torch.profiler``, for the captured graph, ours + prepack and the hand-fused bound."""
    model, inputs = sample_models.get(name)
    c = capture(model, inputs)
    ours = copy_graph_module(c.gm)
    Engine(ours, c.example_inputs, default_pipeline(), RunOptions(verify="off", record=False)).run()
    prepack(ours, c.example_inputs, guard=None)
    graphs = [("captured", c.gm, c.example_inputs), ("ours + prepack", ours, c.example_inputs)]
    graphs += [(s.label, s.gm, s.inputs) for s in _references(name, model, inputs)]
    out = [f"== {name}: self CPU us per forward by aten op ({torch.get_num_threads()} thread(s), {calls} calls)"]
    for label, gm, ins in graphs:
        with torch.no_grad():
            for _ in range(20):
                gm(*ins)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                for _ in range(calls):
                    gm(*ins)
        ev = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
        total = sum(e.self_cpu_time_total for e in ev) / calls
        ops = ", ".join(
            f"{e.key.replace('aten::', '')} {e.self_cpu_time_total / calls:.0f} (x{e.count / calls:g})"
            for e in ev[:top]
        )
        out.append(f"  {label:24s} total {total:6.0f}: {ops}")
    return "\n".join(out)


def paired(name: str, rounds: int, calls: int = 5) -> str:
    """The final graphs only (captured, ours + prepack, the hand-fused bounds), round-robin
    for ``rounds`` rounds of ``calls`` calls each (one thread: its CPU time; more: the wall clock); per-round ratio of the
    captured graph's time to each graph's, median and p10..p90, and the ratio of the
    fastest rounds."""
    import statistics
    import time

    model, inputs = sample_models.get(name)
    c = capture(model, inputs)
    ours = copy_graph_module(c.gm)
    Engine(ours, c.example_inputs, default_pipeline(), RunOptions(verify="off", record=False)).run()
    prepack(ours, c.example_inputs, guard=None)
    graphs = [("captured", c.gm, c.example_inputs), ("ours + prepack", ours, c.example_inputs)]
    graphs += [(s.label, s.gm, s.inputs) for s in _references(name, model, inputs)]
    samples: dict[str, list[float]] = {g[0]: [] for g in graphs}
    load = os.getloadavg()[0]
    # One thread: its CPU time (least disturbed by other jobs); more: the wall clock, since
    # the other threads' work is not on the calling thread's clock.
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    with torch.no_grad():
        for _, gm, ins in graphs:
            for _ in range(30):
                gm(*ins)
        for r in range(rounds):
            k = r % len(graphs)
            for label, gm, ins in graphs[k:] + graphs[:k]:
                t0 = clock()
                for _ in range(calls):
                    gm(*ins)
                samples[label].append((clock() - t0) / calls * 1e3)
    base = samples["captured"]
    out = [
        f"== {name}: {rounds} paired rounds of {calls} calls, {torch.get_num_threads()} thread(s), "
        f"{'thread CPU time' if clock is time.thread_time else 'wall clock'}, load average {load:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after"
    ]
    for label, xs in samples.items():
        rs = sorted(b / a for b, a in zip(base, xs))
        out.append(
            f"  {label:24s} median {statistics.median(xs):.3f} ms  speedup {rs[len(rs) // 2]:.2f}x "
            f"(p10..p90 {rs[len(rs) // 10]:.2f}..{rs[9 * len(rs) // 10]:.2f}; fastest rounds "
            f"{min(base) / min(xs):.2f}x)"
        )
    return "\n".join(out)


def table(rows: list[dict]) -> str:
    def cell(r, k):
        c = r["captured_median_ms"]
        lo, hi = c / r[f"{k}_p90_ms"], c / r[f"{k}_p10_ms"]
        return f"{r[f'{k}_speedup']:.2f}x ({lo:.2f}..{hi:.2f})"

    out = [
        "| model | nodes captured -> ours (+prepack) / upstream | our steps by pattern | upstream rewrites by pass | "
        "captured ms (p10..p90) | ours speedup (p10..p90) | ours + prepack | upstream | hand-fused bound |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        steps = ", ".join(f"{k} {v}" for k, v in r["steps"].items())
        ups = ", ".join(f"{k} {v}" for k, v in r["upstream_fusions"].items()) or "none"
        refs = "; ".join(f"{k}: {cell(r, k)}" for k in r["references"]) or "-"
        out.append(
            f"| {r['model']} | {r['nodes_before']} -> {r['nodes_ours']} ({r['nodes_ours_prepack']}) / "
            f"{r['nodes_upstream']} | {steps} | {ups} | {r['captured_median_ms']:.3f} "
            f"({r['captured_p10_ms']:.3f}..{r['captured_p90_ms']:.3f}) | {cell(r, 'ours')} | "
            f"{cell(r, 'ours_prepack')} | {cell(r, 'upstream')} | {refs} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", default=",".join(SAMPLES))
    ap.add_argument("--repeats", type=int, default=60, help="timed rounds (default 60)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1; 0: torch's default)")
    ap.add_argument("--json", help="write the rows as JSON here")
    ap.add_argument("--profile", action="store_true", help="only print where the time goes, op by op")
    ap.add_argument(
        "--paired",
        type=int,
        metavar="ROUNDS",
        help="only time the final graphs and the bounds, per-round ratios over ROUNDS rounds",
    )
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.profile or a.paired:
        for n in a.samples.split(","):
            print(profile(n.strip()) if a.profile else paired(n.strip(), a.paired))
        return 0
    load = os.getloadavg()
    rows = [measure(n.strip(), a.repeats) for n in a.samples.split(",") if n.strip()]
    clock = "thread CPU time" if torch.get_num_threads() == 1 else "wall clock"
    print(
        f"torch {torch.__version__}, CPU, {torch.get_num_threads()} thread(s), {clock}, {a.repeats} rounds; "
        f"load average {load[0]:.1f} before, {os.getloadavg()[0]:.1f} after ({os.cpu_count()} cores); "
        "speedup = captured median / median; in brackets captured median / p90 .. / p10"
    )
    print(table(rows))
    checks = [c for r in rows for c in r["checks"]]
    right = sum(c["same_sign"] for c in checks)
    clear = [c for c in checks if c["beyond_noise"]]
    print(
        f"\nestimate (optimus_lens.passes.profit) vs measured effect per pass: same sign in {right} of {len(checks)} passes; "
        f"{sum(c['same_sign'] for c in clear)} of {len(clear)} whose measured effect is beyond the noise"
    )
    for r in rows:
        for c in r["checks"]:
            flag = " SLOWDOWN" if c["slowdown"] else ""
            print(
                f"  {r['model']:12s} {c['pass']:28s} estimate {c['estimate_us']:+8.1f} us  measured "
                f"{c['measured_us']:+8.1f} us ({c['measured_p10_us']:+.1f}..{c['measured_p90_us']:+.1f})  "
                f"{'ok' if c['same_sign'] else 'WRONG'}{'' if c['beyond_noise'] else ' (within noise)'}{flag}"
            )
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
