"""Finding the first failing step: per-step verification vs a run without it plus bisection.

A towers graph (``search_scale.build_towers``: T towers of L Linear-ReLU layers and a
LayerNorm, split before and cat after) runs through the default pipeline with one
deliberately wrong pass inserted after ``batch_linear``: it negates the first ReLU it
finds, once. Side by side in one process, per size:

* ``verify="step"``: every step is checked as it is applied (one graph run per step);
* ``verify="off"`` then :func:`optimus_lens.debug.bisect.bisect_trace`: the run checks nothing, the
  search rebuilds and checks ``1 + ceil(log2(steps))`` graphs at most.

Both must name the same step. Prints steps, graphs checked, wall seconds, and the ratio
(per-step time / (unverified run + bisection)).

    .venv/bin/python benchmarks/bisect_cost.py --sizes 8x10,8x40,16x60
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from search_scale import build_towers  # noqa: E402

from optimus_lens.core.engine import Engine, RunOptions, copy_graph_module  # noqa: E402
from optimus_lens.core.miss import Miss  # noqa: E402
from optimus_lens.core.pattern import Match, RewritePattern  # noqa: E402
from optimus_lens.core.pipeline import Pass, Pipeline  # noqa: E402
from optimus_lens.debug.bisect import bisect_trace  # noqa: E402
from optimus_lens.passes import default_pipeline  # noqa: E402


class NegateOneRelu(RewritePattern):
    """Wrong on purpose: puts a neg after the first ReLU it sees, once per instance."""

    name = "negate_one_relu"
    anchors = frozenset({F.relu, torch.relu})

    def __init__(self):
        self.fired = False

    def match(self, node):
        if self.fired or node.target not in self.anchors:
            return Miss("fired already" if self.fired else "not a relu")
        return Match(node, [node])

    def rewrite(self, graph, m):
        self.fired = True
        with graph.inserting_after(m.anchor):
            neg = graph.call_function(torch.neg, (m.anchor,))
        neg.meta = dict(m.anchor.meta)
        m.anchor.replace_all_uses_with(neg, delete_user_cb=lambda u: u is not neg)


def pipeline() -> Pipeline:
    base = default_pipeline()
    at = base.names().index("batch_linear") + 1
    return Pipeline(base.passes[:at] + [Pass("broken", [NegateOneRelu()])] + base.passes[at:])


def measure(towers: int, layers: int) -> dict:
    gm, inputs = build_towers(towers, layers)
    t0 = time.perf_counter()
    verified = Engine(copy_graph_module(gm), inputs, pipeline(), RunOptions(verify="step")).run()
    t_step = time.perf_counter() - t0
    t0 = time.perf_counter()
    plain = Engine(copy_graph_module(gm), inputs, pipeline(), RunOptions(verify="off")).run()
    t_off = time.perf_counter() - t0
    t0 = time.perf_counter()
    b = bisect_trace(plain, inputs)
    t_bisect = time.perf_counter() - t0
    first = verified.failed_steps()[0].index
    assert b.first_bad == first, (b.first_bad, first)
    return {
        "nodes": len(gm.graph.nodes),
        "steps": len(plain.steps),
        "first_bad": first,
        "probes": len(b.probes),
        "t_step": t_step,
        "t_off": t_off,
        "t_bisect": t_bisect,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="8x10,8x40,16x60", help="comma-separated TOWERSxLAYERS")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    print(
        f"{'nodes':>6s} {'steps':>5s} {'failing':>7s}  {'graphs checked: per-step':>24s} {'bisect':>6s}  "
        f"{'per-step s':>10s} {'off s':>6s} {'bisect s':>8s}  ratio"
    )
    for size in a.sizes.split(","):
        t, length = (int(v) for v in size.split("x"))
        r = measure(t, length)
        both = r["t_off"] + r["t_bisect"]
        print(
            f"{r['nodes']:6d} {r['steps']:5d} {r['first_bad']:7d}  {r['steps']:24d} {r['probes']:6d}  "
            f"{r['t_step']:10.2f} {r['t_off']:6.2f} {r['t_bisect']:8.2f}  {r['t_step'] / both:5.1f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
