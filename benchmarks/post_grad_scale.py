"""Post-grad at scale: our post-grad pipeline against upstream's ``post_grad_passes`` on the
forward and backward ATen graphs of the towers model, for training (issue 27, item 3).

For each size (pre-grad node count of ``towers_model.Towers``, 128 towers; the graph grows
in depth): the model is captured by Dynamo with grad on
(:func:`optimus_lens.frontend.capture.capture`, ``grad=True``) and its ATen graphs for
training taken the way our post-grad runs take them
(:func:`optimus_lens.frontend.aten_capture.capture_aten`, ``mode="training"``: Inductor's
own ``compile_fx`` path up to ``post_grad_passes``, forward and backward). Both captures
are timed. Then, per graph, in one process and interleaved (each run on a fresh copy of
the captured graph):

* **upstream**: ``torch._inductor.fx_passes.post_grad.post_grad_passes(gm, is_inference)``
  with ``post_grad_fusion_options`` = :func:`optimus_lens.inductor.observe_post.default_post_grad_options`
  (the batch/group fusions and pattern passes our default post-grad pipeline implements),
  under :func:`optimus_lens.inductor.observe_post.upstream_post_grad` (the graph's fake
  mode, no custom passes);
* **inductor**: the same call with no Optimus options (``{}``): Inductor's own post-grad
  work (pattern matcher, reinplacing, ...), which upstream's figure includes; upstream's
  Optimus share is ``upstream - inductor``;
* **ours**: ``Engine(gm, inputs, post_grad_pipeline(), RunOptions(verify="off", record=False))``;
* **ours+rec**: the same with ``record=True``;
* **fx_copy**: each fresh copy (``copy_graph_module``), the O(nodes) control.

Best-of-``--repeat`` and median wall seconds (CPU seconds of the process beside them),
torch at one thread; node counts before and after; growth between sizes per 4x nodes of
each graph. Run::

    .venv/bin/python benchmarks/post_grad_scale.py --sizes 1000,5000 --repeat 3 --json out.json

(78 min on a loaded 2-core machine, most of it upstream on the 5k forward graph;
``--upstream-repeat 1`` shortens it.)
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from towers_model import TOWERS, towers_model  # noqa: E402

from optimus_lens.core.engine import Engine, RunOptions, copy_graph_module  # noqa: E402
from optimus_lens.frontend.aten_capture import AtenGraph, capture_aten  # noqa: E402
from optimus_lens.frontend.capture import capture  # noqa: E402
from optimus_lens.inductor.observe_post import default_post_grad_options, upstream_post_grad  # noqa: E402
from optimus_lens.passes.post_grad import post_grad_pipeline  # noqa: E402

RUNS = ("upstream", "inductor", "ours", "ours_recording", "fx_copy")


def _timed(fn):
    """(result, wall seconds, CPU seconds of this process) of ``fn()``."""
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


def capture_training(nodes: int, towers: int = TOWERS) -> tuple[list[AtenGraph], dict]:
    """The forward and backward ATen graphs of a towers model of about ``nodes`` pre-grad
    nodes, and the capture's facts (towers, layers, pre-grad nodes, Dynamo and ATen capture
    wall seconds)."""
    model, x = towers_model(nodes, towers)
    captured, dynamo_s, _ = _timed(lambda: capture(model, (x,), grad=True))
    aten, aten_s, _ = _timed(lambda: capture_aten(captured.gm, captured.example_inputs, "training"))
    layers = model.towers[0].layers
    info = {
        "towers": len(model.towers),
        "layers": layers,
        "pre_grad_nodes": len(captured.gm.graph.nodes),
        "dynamo_capture_s": dynamo_s,
        "aten_capture_s": aten_s,
    }
    return aten.graphs, info


def run_upstream(gm, is_inference: bool, options: dict) -> int:
    """Upstream's ``post_grad_passes`` on ``gm`` in place with ``options``; nodes after."""
    from torch._inductor.fx_passes.post_grad import post_grad_passes

    with upstream_post_grad(gm, options):
        post_grad_passes(gm, is_inference)
    return len(gm.graph.nodes)


def run_ours(gm, inputs: tuple, name: str, record: bool) -> tuple[int, int]:
    """Our default post-grad pipeline on ``gm`` in place, unverified; (nodes after, steps)."""
    engine = Engine(gm, inputs, post_grad_pipeline(), RunOptions(verify="off", record=record), graph=name)
    trace = engine.run()
    return len(gm.graph.nodes), len(trace.steps)


def measure_graph(g: AtenGraph, repeat: int, upstream_repeat: int | None = None) -> dict:
    """One graph's row: best (``<run>_s``) and median (``<run>_median_s``) wall seconds,
    CPU seconds (``<run>_cpu_s``, best), every sample, nodes before and after each side."""
    upstream_repeat = repeat if upstream_repeat is None else upstream_repeat
    options = default_post_grad_options()
    row: dict = {"graph": g.name, "nodes": len(g.gm.graph.nodes), "options": sorted(options)}
    wall: dict[str, list[float]] = {k: [] for k in RUNS}
    cpu: dict[str, list[float]] = {k: [] for k in RUNS}

    def fresh():
        copy, w, c = _timed(lambda: copy_graph_module(g.gm))
        wall["fx_copy"].append(w)
        cpu["fx_copy"].append(c)
        gc.collect()
        return copy

    def keep(name: str, fn, *args):
        gm = fresh()  # copied (and timed as the control) before this run's clock starts
        out, w, c = _timed(lambda: fn(gm, *args))
        wall[name].append(w)
        cpu[name].append(c)
        return out

    for r in range(repeat):
        if r < upstream_repeat:
            row["nodes_after_upstream"] = keep("upstream", run_upstream, g.is_inference, options)
            row["nodes_after_inductor"] = keep("inductor", run_upstream, g.is_inference, {})
        row["nodes_after_ours"], row["steps"] = keep("ours", run_ours, g.example_inputs, g.name, False)
        keep("ours_recording", run_ours, g.example_inputs, g.name, True)
    for k in RUNS:
        row[k + "_s"] = min(wall[k]) if wall[k] else None
        row[k + "_median_s"] = statistics.median(wall[k]) if wall[k] else None
        row[k + "_cpu_s"] = min(cpu[k]) if cpu[k] else None
    row["samples"] = wall
    return row


def measure(nodes: int, repeat: int, upstream_repeat: int | None = None, towers: int = TOWERS) -> dict:
    """One size: the capture's facts and one row per ATen graph (``graphs``)."""
    graphs, info = capture_training(nodes, towers)
    info["graphs"] = [measure_graph(g, repeat, upstream_repeat) for g in graphs]
    return info


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.3f}" if a and b else "-"


def report(prev: dict | None, size: dict) -> str:
    """One size as text: per graph the seconds of each run side by side, the ratios of
    ours to upstream, to upstream's Optimus share (upstream - inductor) and to the FX copy,
    node counts; with ``prev`` the growth per 4x nodes of medians (adds ``growth_per_4x``
    to each graph row)."""
    lines = [
        f"== towers {size['towers']} x {size['layers']} layers: {size['pre_grad_nodes']} pre-grad nodes; "
        f"Dynamo capture {size['dynamo_capture_s']:.1f} s, ATen capture (training) {size['aten_capture_s']:.1f} s"
    ]
    before = {g["graph"]: g for g in prev["graphs"]} if prev else {}
    for g in size["graphs"]:
        up, ind, ours, rec, copy = (g[k + "_s"] for k in RUNS)
        share = up - ind if up and ind and up > ind else None
        lines.append(f"  {g['graph']}: {g['nodes']} ATen nodes; best of {len(g['samples']['ours'])}, wall s (median)")
        for k, label in (
            ("upstream", "upstream post_grad_passes, Optimus options"),
            ("inductor", "upstream post_grad_passes, no options   "),
            ("ours", "ours (record off)                        "),
            ("ours_recording", "ours (record on)                         "),
            ("fx_copy", "FX graph copy (control)                  "),
        ):
            if g[k + "_s"] is None:
                continue
            after = {"upstream": "nodes after " + str(g.get("nodes_after_upstream"))}
            after["inductor"] = "nodes after " + str(g.get("nodes_after_inductor"))
            after["ours"] = f"nodes after {g['nodes_after_ours']} ({g['steps']} steps)"
            lines.append(
                f"    {label} {g[k + '_s']:8.3f} ({g[k + '_median_s']:8.3f})  cpu {g[k + '_cpu_s']:8.3f}  "
                + after.get(k, "")
            )
        lines.append(
            f"    ratios (best): ours/upstream off {_ratio(ours, up)} on {_ratio(rec, up)}; "
            f"ours/upstream's Optimus share (upstream - no options) {_ratio(ours, share)}; "
            f"ours/FX copy {_ratio(ours, copy)}; upstream/FX copy {_ratio(up, copy)}"
        )
        p = before.get(g["graph"])
        if p:
            n = g["nodes"] / p["nodes"]
            per4 = {
                k: 4 ** (math.log(g[k + "_median_s"] / p[k + "_median_s"]) / math.log(n))
                for k in RUNS
                if g[k + "_median_s"] and p[k + "_median_s"]
            }
            g["growth_per_4x"] = per4
            lines.append(
                f"    growth of medians vs previous size (x{n:.2f} nodes), per 4x nodes: "
                + ", ".join(f"{k} x{v:.2f}" for k, v in per4.items())
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,5000", help="comma-separated pre-grad node counts of the towers model")
    ap.add_argument("--repeat", type=int, default=3, help="runs per graph (best and median are reported)")
    ap.add_argument("--upstream-repeat", type=int, help="runs of upstream per graph (default: --repeat)")
    ap.add_argument("--towers", type=int, default=TOWERS, help="towers T (the model grows in layers)")
    ap.add_argument("--json", help="write the sizes as JSON to this path")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}; load average {Path('/proc/loadavg').read_text().split()[:3]}", flush=True)
    sizes: list[dict] = []
    for n in (int(s) for s in a.sizes.split(",") if s):
        sizes.append(measure(n, a.repeat, a.upstream_repeat, a.towers))
        print(report(sizes[-2] if len(sizes) > 1 else None, sizes[-1]), flush=True)
        if a.json:
            Path(a.json).write_text(json.dumps(sizes, indent=1))
    print(f"load average at the end {Path('/proc/loadavg').read_text().split()[:3]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
