"""The step viewer at industrial scale: how long a step's picture takes to build, fold and
lay out, on towers graphs of about 2k, 21k and 85k FX nodes and on an adversarial
skip-edge chain.

Towers graphs are :func:`benchmarks.search_scale.build_towers` (128 towers, Dynamo-style
FX graphs with lifted parameters; the graph grows in depth, so every fused group has 128
members at every size), optimised with recording on. For every step (or ``--max-steps``
of them, evenly spaced) :func:`viz.step_picture` builds the before, after and diff views
on one layout with the app's default options, and the worst step (and the median of the
DOT build and render times) is reported:

* ``fold_s``: folding parallel copies (both sides),
* ``dot_build_s``: building the views' DOT (selection, module folding, labels, union),
  parallel-copy folding and the trace's graph rebuild excluded; ``dot_build_cpu_s``: the
  same in CPU seconds of the process (what a shared, loaded machine does not inflate),
* ``render_s``: laying out the union (bounded ``dot``) and drawing the before and after
  panes with ``neato -n2``,
* ``rebuild_s``: ``Trace.before(i)`` + ``Trace.after(i)``; ``index_s``: moving the users
  index along the step's delta (:mod:`viz.index`),
* ``drawn``: the most nodes any view of any step drew; ``fallback_steps``: steps whose
  layout used the layered fallback; ``index_build_s``: the one-off users index built when
  a trace is opened (:mod:`viz.index`; steps then move it along their deltas).

The skip-edge chain is ``h = sin(h) + keep[-7]; h = h * 0.5`` repeated (``--chain-blocks``,
default 1,700 blocks, ~5,100 nodes), symbolically traced; nothing matches in it, so its
views are the captured graph's: the first 300 nodes (the app's view), a marked node's
2-hop and 60-hop neighbourhoods, and a 2,000-node cut (the largest "whole graph" the app
offers), each built, laid out and drawn (``render_s`` includes the fallback when used).

    .venv/bin/python benchmarks/viz_scale.py --sizes 2000,21000,85000 --json viz_scale.json
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from search_scale import build_towers, shape_for  # noqa: E402

from optimus_lens.core.engine import Engine, RunOptions  # noqa: E402
from optimus_lens.core.record import snapshot_graph  # noqa: E402
from optimus_lens.core.trace import Trace  # noqa: E402
from optimus_lens.passes import default_pipeline  # noqa: E402
from optimus_lens.viz import Marks, ViewOptions, graph_view, render_view, step_picture  # noqa: E402
from optimus_lens.viz.index import users_at  # noqa: E402
from optimus_lens.viz.layout import draw_pinned  # noqa: E402
from optimus_lens.viz.select import is_param  # noqa: E402


def towers_trace(nodes: int) -> Trace:
    """The recorded trace of optimising a towers graph of about ``nodes`` FX nodes. The FX
    graph and its FakeTensors are dropped and what is left is frozen out of the cycle
    collector (``gc.freeze``), as in a viewer that opened the trace: otherwise a full
    collection of the optimiser's heap (1-2 s at 21k nodes) lands in whichever step it
    interrupts."""
    towers, layers = shape_for(nodes)
    gm, inputs = build_towers(towers, layers)
    trace = Engine(gm, inputs, default_pipeline(), RunOptions(verify="off", record=True)).run()
    del gm, inputs
    gc.collect()
    gc.freeze()
    return trace


def step_times(trace: Trace, index: int) -> dict:
    """Seconds per phase of step ``index``'s picture (:attr:`optimus_lens.viz.StepPicture.timings`),
    and of drawing its before and after panes."""
    pic = step_picture(trace, index)
    t0 = time.perf_counter()
    for v in (pic.before, pic.after):
        draw_pinned(v.source)
    draw = time.perf_counter() - t0
    tm = pic.timings
    return {
        "rebuild_s": tm["rebuild_s"],
        "index_s": tm["index_s"],
        "fold_s": tm["fold_s"],
        "dot_build_s": tm["dot_build_s"],
        "dot_build_cpu_s": tm["dot_build_cpu_s"],
        "render_s": tm["layout_s"] + draw,
        "drawn": max(v.shown for v in pic.views().values()),
        "fallback": pic.layout.method == "layered",
        "sites": len(trace.step(index).sites),
        "step": f"{index}: {trace.step(index).pattern}",
    }


def measure_towers(nodes: int, max_steps: int | None) -> dict:
    t0 = time.perf_counter()
    trace = towers_trace(nodes)
    built = time.perf_counter() - t0
    n = len(trace.steps)
    idx = list(range(1, n + 1))
    if max_steps and n > max_steps:
        idx = sorted({1 + round(i * (n - 1) / (max_steps - 1)) for i in range(max_steps)})
    t0 = time.perf_counter()
    users_at(trace, 0, trace.graph_at(0), is_param)  # once per trace, when it is opened
    index_s = time.perf_counter() - t0
    rows = [step_times(trace, i) for i in idx]
    worst = {
        k: max(r[k] for r in rows)
        for k in ("rebuild_s", "index_s", "fold_s", "dot_build_s", "dot_build_cpu_s", "render_s", "drawn")
    }
    med = {f"median_{k}": statistics.median(r[k] for r in rows) for k in ("dot_build_s", "dot_build_cpu_s", "render_s")}
    return {
        "graph": "towers",
        "nodes": trace.nodes_before,
        "steps": n,
        "steps_measured": len(idx),
        **{k: round(v, 4) if isinstance(v, float) else v for k, v in {**worst, **med}.items()},
        "slowest_dot_build_step": max(rows, key=lambda r: r["dot_build_s"])["step"],
        "fallback_steps": sum(r["fallback"] for r in rows),
        "widest_fusion": max(r["sites"] for r in rows),
        "index_build_s": round(index_s, 4),
        "build_and_optimise_s": round(built, 2),
    }


class SkipChain(torch.nn.Module):
    """``blocks`` x (h = sin(h) + keep[-7]; h = h * 0.5): every block adds a skip edge from 7 blocks back."""

    def __init__(self, blocks: int):
        super().__init__()
        self.blocks = blocks

    def forward(self, x):
        keep, h = [x] * 7, x
        for _ in range(self.blocks):
            h = torch.sin(h) + keep[-7]
            h = h * 0.5
            keep.append(h)
        return h


def measure_chain(blocks: int) -> dict:
    gm = torch.fx.symbolic_trace(SkipChain(blocks))
    snap = snapshot_graph(gm.graph)
    names = list(snap.nodes)
    mid = names[len(names) // 2]
    views = {
        "first 300 nodes": (None, ViewOptions(legend_in_graph=False)),
        "2-hop of a node": (Marks(groups={mid: 0}), ViewOptions(legend_in_graph=False)),
        "60-hop of a node": (Marks(groups={mid: 0}), ViewOptions(hops=60, legend_in_graph=False)),
        "2,000-node cut": (None, ViewOptions(max_nodes=2000, legend_in_graph=False)),
    }
    out = {}
    for label, (marks, opts) in views.items():
        t0 = time.perf_counter()
        v = graph_view(snap, marks, "", opts)
        build = time.perf_counter() - t0
        r = render_view(v)
        out[label] = {
            "drawn": v.shown,
            "dot_build_s": round(build, 4),
            "render_s": round(r.seconds, 4),
            "fallback": bool(r.note),
        }
    worst = {k: max(o[k] for o in out.values()) for k in ("dot_build_s", "render_s")}
    return {"graph": "skip_chain", "nodes": len(snap), **worst, "fold_s": 0.0, "views": out}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="2000,21000,85000", help="towers graph sizes (FX nodes), comma-separated")
    ap.add_argument("--chain-blocks", type=int, default=1700, help="blocks of the skip-edge chain (3 nodes each)")
    ap.add_argument("--max-steps", type=int, default=0, help="measure at most this many steps per graph (0: all)")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    results = []
    for size in [int(s) for s in a.sizes.split(",") if s]:
        r = measure_towers(size, a.max_steps or None)
        print(json.dumps(r), flush=True)
        results.append(r)
    r = measure_chain(a.chain_blocks)
    print(json.dumps(r), flush=True)
    results.append(r)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
