"""Greedy search at industrial scale: our pipeline against PyTorch's own pre-grad Optimus.

Builds synthetic "towers" graphs directly as FX graphs shaped like Dynamo's pre-grad
graphs (parameters lifted to placeholders, every node carrying a FakeTensor
``meta["example_value"]``, ``nn_module_stack`` and ``stack_trace``): one input
``(B, T*D)`` is split into T slices, each goes through L layers of
``linear -> relu`` and a ``layer_norm``, and the T tower outputs are concatenated.
A graph has about ``T * (4L + 4)`` nodes; sizes grow in L with T = 128 towers
(``--towers``), so every fused group has 128 members at every size. Upstream's search
needs example inputs only to find the device and fake mode: real tensors are passed.

For each size, in one process and interleaved (repeat r runs upstream, ours, ours with
recording, each on a fresh copy of the graph, made and then followed by a full collection
before the timed call, so no run pays for collecting the harness's copy):

* **upstream**: ``torch._inductor.fx_passes.pre_grad.pre_grad_passes(gm, example_inputs)``
  under ``config.patch(pre_grad_fusion_options=UPSTREAM_OPTIONS)`` (batch_linear,
  batch_relu, batch_layernorm, batch_tanh, batch_sigmoid, normalization_pass and the
  split/cat passes). Its fusions are read from ``torch._dynamo.utils.counters["inductor"]``.
* **ours**: ``Engine(gm, inputs, default_pipeline(), RunOptions(verify="off", record=False))``.
* **ours+rec**: the same with ``record=True``; the trace's JSON size, one GraphSnapshot's
  JSON size, and the worst time to rebuild any step's before/after graph from the
  trace loaded back from JSON (``Trace.before(i)`` / ``Trace.after(i)``) are reported.
* **floor** (``--floor``): one more run of ours, timing the FX and FakeTensor primitives
  inside it (``Graph.create_node`` / ``erase_node``, FakeTensor dispatches, the final
  ``recompile``; :func:`run_floor`): what the same steps cost with no analysis at all.

Times are best-of-``--repeat`` and median seconds, both wall clock and CPU time of the
process (``time.process_time``), with torch at one thread. Growth between sizes is given
for both best and median: on a noisy machine the best of N short runs catches a quiet
stretch more often than the best of N long ones, which inflates best-of growth. Each
run's fresh copy of the graph is timed too (``fx_copy``): an O(nodes) control showing how
a linear pass over an FX graph grows on the machine at hand (caches make per-node costs
rise with graph size). Run::

    .venv/bin/python benchmarks/search_scale.py --sizes 5000,21000,85000 --json out.json
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import operator
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx import Graph, GraphModule

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from optimus_lens.core.engine import Engine, RunOptions, copy_graph_module  # noqa: E402
from optimus_lens.core.record import snapshot_graph  # noqa: E402
from optimus_lens.core.trace import Trace  # noqa: E402
from optimus_lens.passes import default_pipeline  # noqa: E402

UPSTREAM_OPTIONS = {
    "batch_linear": {},
    "batch_relu": {},
    "batch_layernorm": {},
    "batch_tanh": {},
    "batch_sigmoid": {},
    "normalization_pass": {},
    "merge_splits_pass": {},
    "split_cat_pass": {},
    "unbind_stack_pass": {},
    "merge_getitem_cat_pass": {},
    "mutate_cat_pass": {},
}
TIMES = (
    "upstream_s",
    "upstream_cpu_s",
    "ours_s",
    "ours_cpu_s",
    "ours_recording_s",
    "ours_recording_cpu_s",
    "fx_copy_s",
    "fx_copy_cpu_s",
)
TOWERS = 128  # T: default number of towers
WIDTH = 8  # D: features per tower
BATCH = 4  # B: rows

_SOURCE = 'File "towers.py", line {line}, in forward\n    {code}\n'


def shape_for(nodes: int, towers: int = TOWERS) -> tuple[int, int]:
    """(towers T, layers L) giving about ``nodes`` FX nodes with ``towers`` towers: the
    graph grows in depth, so every fused group has T members at every size (T <= 300,
    upstream's ``max_fuse_set_size``, keeps one group per layer)."""
    return towers, max(1, round((nodes / towers - 4) / 4))


def build_towers(towers: int, layers: int, width: int = WIDTH, batch: int = BATCH) -> tuple[GraphModule, tuple]:
    """The towers graph as a Dynamo-style GraphModule and its real example inputs
    (``x`` of shape ``(batch, towers*width)``, then every weight ``(width, width)``,
    bias ``(width,)`` and layer-norm weight/bias ``(width,)`` in placeholder order).

    Example values are FakeTensors of one FakeTensorMode, computed by running each op."""
    g = Graph()
    mode = FakeTensorMode(allow_non_fake_inputs=False)
    gen = torch.Generator().manual_seed(0)
    reals: list[torch.Tensor] = []

    def placeholder(name: str, shape: tuple, module: str | None = None, cls: type | None = None):
        p = g.placeholder(name)
        real = torch.randn(shape, generator=gen) * (0.3 if len(shape) == 2 else 1.0)
        reals.append(real)
        p.meta["example_value"] = mode.from_tensor(real)
        if module:
            p.meta["nn_module_stack"] = {f"m{module}": (f"L['self'].{module}", cls)}
        p.meta["stack_trace"] = _SOURCE.format(line=1, code="def forward(self, x):")
        return p

    def call(fn, args, kwargs=None, module=None, cls=None, line=0, code=""):
        n = g.call_function(fn, args, kwargs or {})
        vals = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: a.meta["example_value"])
        with mode:
            n.meta["example_value"] = fn(*vals[0], **vals[1])
        if module:
            n.meta["nn_module_stack"] = {f"m{module}": (f"L['self'].{module}", cls)}
        n.meta["stack_trace"] = _SOURCE.format(line=line, code=code)
        return n

    x = placeholder("l_x_", (batch, towers * width))
    params = []
    for t in range(towers):
        ws = []
        for i in range(layers):
            mod = f"towers.{t}.fc{i}"
            pre = f"l_self_modules_towers_modules_{t}_modules_fc{i}_parameters_"
            ws.append(
                (
                    placeholder(pre + "weight_", (width, width), mod, torch.nn.Linear),
                    placeholder(pre + "bias_", (width,), mod, torch.nn.Linear),
                )
            )
        mod = f"towers.{t}.norm"
        pre = f"l_self_modules_towers_modules_{t}_modules_norm_parameters_"
        params.append(
            (
                ws,
                placeholder(pre + "weight_", (width,), mod, torch.nn.LayerNorm),
                placeholder(pre + "bias_", (width,), mod, torch.nn.LayerNorm),
            )
        )
    split = call(torch.split, (x, width), {"dim": 1}, line=3, code="pieces = torch.split(x, W, dim=1)")
    outs = []
    for t, (ws, lw, lb) in enumerate(params):
        h = call(operator.getitem, (split, t), line=3, code="pieces = torch.split(x, W, dim=1)")
        for i, (w, b) in enumerate(ws):
            h = call(
                torch._C._nn.linear,
                (h, w, b),
                module=f"towers.{t}.fc{i}",
                cls=torch.nn.Linear,
                line=5,
                code="h = fc(h)",
            )
            h = call(
                F.relu,
                (h,),
                {"inplace": False},
                module=f"towers.{t}.act{i}",
                cls=torch.nn.ReLU,
                line=6,
                code="h = act(h)",
            )
        h = call(
            F.layer_norm,
            (h, (width,), lw, lb, 1e-05),
            module=f"towers.{t}.norm",
            cls=torch.nn.LayerNorm,
            line=7,
            code="h = norm(h)",
        )
        outs.append(h)
    out = call(torch.cat, (outs,), {"dim": 1}, line=8, code="return torch.cat(outs, dim=1)")
    g.output((out,))
    return GraphModule(torch.nn.Module(), g), tuple(reals)


def forget_kept(gm: GraphModule) -> int:
    """Drop what our runs keep on ``gm``'s example values (a FakeTensor's storage key and
    layout record, ``_optimus_*`` attributes): copies of a graph share its FakeTensors, so
    without this the second run of a benchmark would find them read already, which no
    compile of a new graph does. Returns the number of entries dropped."""
    dropped = 0
    for node in gm.graph.nodes:
        v = node.meta.get("example_value")
        for t in v if isinstance(v, (tuple, list)) else (v,):
            kept = getattr(t, "__dict__", None)
            if isinstance(t, torch.Tensor) and kept:
                for k in [k for k in kept if k.startswith("_optimus_")]:
                    del kept[k]
                    dropped += 1
    return dropped


def inductor_fusions() -> dict[str, int]:
    """Nonzero counters upstream's passes bumped (``counters["inductor"]``)."""
    from torch._dynamo.utils import counters

    return {k: v for k, v in counters["inductor"].items() if v}


def _timed(fn):
    """(result, wall seconds, CPU seconds of this process) of ``fn()``."""
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


def run_upstream(gm: GraphModule, inputs: tuple) -> tuple[float, float, int, dict]:
    """(wall s, CPU s, nodes after, counters) for upstream's pre-grad passes on ``gm``."""
    from torch._dynamo.utils import counters
    from torch._inductor import config
    from torch._inductor.fx_passes.pre_grad import pre_grad_passes

    counters.clear()
    with config.patch(pre_grad_fusion_options=UPSTREAM_OPTIONS):
        gm, wall, cpu = _timed(lambda: pre_grad_passes(gm, inputs))
    return wall, cpu, len(gm.graph.nodes), inductor_fusions()


def run_ours(gm: GraphModule, inputs: tuple, record: bool) -> tuple[float, float, int, Trace]:
    """(wall s, CPU s, nodes after, trace) for our default pipeline on ``gm``."""
    trace, wall, cpu = _timed(
        lambda: Engine(gm, inputs, default_pipeline(), RunOptions(verify="off", record=record)).run()
    )
    return wall, cpu, len(gm.graph.nodes), trace


#: the FX and FakeTensor primitives every rewrite of these steps pays, whatever its analyses
FLOOR_PARTS = {
    "create_node": (Graph, "create_node"),
    "erase_node": (Graph, "erase_node"),
    "fake_dispatch": (FakeTensorMode, "__torch_dispatch__"),
    "recompile": (GraphModule, "recompile"),
}


def run_floor(gm: GraphModule, inputs: tuple) -> dict[str, float]:
    """Wall seconds our default pipeline (recording off) spends inside the primitives of
    ``FLOOR_PARTS`` (outermost calls only; ``total_s`` is the whole run): FX's
    ``Graph.create_node`` and ``erase_node`` for the nodes the steps create and erase,
    the FakeTensor dispatches that compute the created nodes' example values (an
    ``unbind`` of 128 pieces makes 128 FakeTensors), and the final ``recompile``. Their
    sum is what the same steps cost with no analysis at all: the floor under the budget
    for this design (every node a step makes carries an example value)."""
    spent = dict.fromkeys(FLOOR_PARTS, 0.0)
    depth = [0]
    saved = {}

    def wrap(name, fn):
        def timed(*args, **kwargs):
            if depth[0]:
                return fn(*args, **kwargs)
            depth[0] += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - t0
                depth[0] -= 1

        return timed

    for name, (owner, attr) in FLOOR_PARTS.items():
        saved[name] = owner.__dict__[attr]
        setattr(owner, attr, wrap(name, saved[name]))
    try:
        _, wall, _ = _timed(
            lambda: Engine(gm, inputs, default_pipeline(), RunOptions(verify="off", record=False)).run()
        )
    finally:
        for name, (owner, attr) in FLOOR_PARTS.items():
            setattr(owner, attr, saved[name])
    spent["total_s"] = wall
    return spent


def rebuild_max(trace_json: str) -> float:
    """Worst seconds to rebuild one step's before and after graphs from a trace freshly
    loaded from JSON, steps visited last first (the first visit replays the most)."""
    t = Trace.loads(trace_json)
    worst = 0.0
    for i in range(len(t.steps), 0, -1):
        t0 = time.perf_counter()
        t.before(i)
        t.after(i)
        worst = max(worst, time.perf_counter() - t0)
    return worst


def measure(
    nodes: int, repeat: int, upstream_repeat: int | None = None, towers: int = TOWERS, floor: bool = False
) -> dict:
    """One row of the report: wall and CPU seconds of upstream, ours and ours with
    recording (interleaved, each on a fresh copy of one graph; upstream only in the first
    ``upstream_repeat`` rounds, 0 = never) as best-of-``repeat`` (``ours_s``, ...), median
    (``ours_median_s``, ...) and every sample (``samples``); node counts, JSON sizes and
    the worst step rebuild; with ``floor``, one more run of ours for :func:`run_floor`."""
    upstream_repeat = repeat if upstream_repeat is None else upstream_repeat

    towers, layers = shape_for(nodes, towers)
    base, inputs = build_towers(towers, layers)
    row: dict = {"nodes": len(base.graph.nodes), "towers": towers, "layers": layers}
    samples: dict[str, list[float]] = {k: [] for k in TIMES}

    def keep(name: str, wall: float, cpu: float) -> None:
        samples[name + "_s"].append(wall)
        samples[name + "_cpu_s"].append(cpu)

    def fresh() -> GraphModule:  # also the O(nodes) control: FX's own graph copy, timed
        """A copy of the graph, then a full collection: every timed run starts with the
        collector settled, so none pays for collecting the copy the harness just made (a
        full collection the copy's objects would trigger inside the run). The copy shares
        the graph's example values (FakeTensors), so what an earlier run kept on them is
        dropped first (:func:`forget_kept`): every run starts as a compile does, cold."""
        forget_kept(base)
        copy, wall, cpu = _timed(lambda: copy_graph_module(base))
        keep("fx_copy", wall, cpu)
        gc.collect()
        return copy

    trace = None
    for r in range(repeat):
        if r < upstream_repeat:
            gc.collect()
            wall, cpu, row["nodes_after_upstream"], row["upstream_counters"] = run_upstream(fresh(), inputs)
            keep("upstream", wall, cpu)
        gc.collect()
        wall, cpu, row["nodes_after_ours"], _ = run_ours(fresh(), inputs, record=False)
        keep("ours", wall, cpu)
        trace = None
        gc.collect()
        wall, cpu, _, trace = run_ours(fresh(), inputs, record=True)
        keep("ours_recording", wall, cpu)
    for k, xs in samples.items():
        row[k] = min(xs) if xs else None
        row[k[:-2] + "_median_s"] = statistics.median(xs) if xs else None
    row["samples"] = samples
    row["steps"] = len(trace.steps)
    row["ours_patterns"] = _count(s.pattern for s in trace.steps)
    text = trace.dumps()
    row["trace_bytes"] = len(text.encode())
    row["snapshot_bytes"] = len(json.dumps(snapshot_graph(base.graph).to_json(), separators=(",", ":")).encode())
    row["rebuild_max_s"] = rebuild_max(text)
    if floor:
        gc.collect()
        row["floor"] = run_floor(fresh(), inputs)
    return row


def _count(items) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in items:
        out[i] = out.get(i, 0) + 1
    return out


def report(rows: list[dict]) -> str:
    """The rows as text: seconds (wall, CPU), ratios ours/upstream, nodes, sizes, growth."""
    return "\n".join(report_row(prev, r) for prev, r in zip([None, *rows], rows))


def report_row(prev: dict | None, r: dict) -> str:
    """One size as text; with ``prev`` (the previous size) also the growth between them,
    of best and of median wall times, raw and scaled to exactly 4x the nodes: time ~
    nodes**k with k = log(time growth) / log(node growth), reported as 4**k (the target is
    <= 4.4 per 4x nodes). Adds ``growth_best``, ``growth_median`` and their ``_per_4x`` to
    ``r``."""
    lines = []
    up, upc = r["upstream_s"], r["upstream_cpu_s"]
    lines.append(f"== {r['nodes']} nodes ({r['towers']} towers x {r['layers']} layers)")
    if up is not None:
        lines.append(
            f"  upstream pre_grad_passes  wall {up:8.3f} s  cpu {upc:8.3f} s"
            f"                              nodes after {r['nodes_after_upstream']}"
        )
        lines.append(f"    upstream counters: {r['upstream_counters']}")
    for name, label in (("ours", "ours (record off)"), ("ours_recording", "ours (record on) ")):
        w, c = r[name + "_s"], r[name + "_cpu_s"]
        ratio = f"  ours/upstream wall {w / up:.3f} cpu {c / upc:.3f}" if up else ""
        after = f"  nodes after {r['nodes_after_ours']}" if name == "ours" else f"  steps {r['steps']}"
        lines.append(f"  {label}         wall {w:8.3f} s  cpu {c:8.3f} s{ratio}{after}")
    runs = len(r["samples"]["ours_s"])
    lines.append(
        f"    (best of {runs}; medians: "
        + ", ".join(
            f"{k} {r[k + '_median_s']:.3f} s" for k in ("upstream", "ours", "ours_recording") if r[k + "_median_s"]
        )
        + ")"
    )
    lines.append(f"    O(nodes) control, FX graph copy (copy_graph_module): median {r['fx_copy_median_s']:.3f} s")
    lines.append(f"    our steps by pattern: {r['ours_patterns']}")
    lines.append(
        f"  trace JSON {r['trace_bytes']:,} B; one snapshot {r['snapshot_bytes']:,} B "
        f"(trace/snapshot {r['trace_bytes'] / r['snapshot_bytes']:.2f}); "
        f"worst step before+after rebuild {r['rebuild_max_s'] * 1e3:.1f} ms"
    )
    if r.get("floor"):
        f = r["floor"]
        prims = sum(v for k, v in f.items() if k != "total_s")
        vs = f", {prims / up:.3f} of upstream" if up else ""
        lines.append(
            f"  floor: FX and FakeTensor primitives {prims:.3f} s of a {f['total_s']:.3f} s run "
            f"({prims / f['total_s']:.0%}{vs}): " + ", ".join(f"{k} {v:.3f}" for k, v in f.items() if k != "total_s")
        )
    if prev is not None:
        nodes = r["nodes"] / prev["nodes"]
        lines.append(f"  growth vs previous size (x{nodes:.2f} nodes), raw -> scaled to 4x the nodes:")
        for kind, suffix in (("best", "_s"), ("median", "_median_s")):
            g = {
                k: r[k + suffix] / prev[k + suffix]
                for k in ("upstream", "ours", "ours_recording", "fx_copy")
                if r[k + suffix] and prev[k + suffix]
            }
            per4 = {k: 4 ** (math.log(v) / math.log(nodes)) for k, v in g.items()}
            r[f"growth_{kind}"], r[f"growth_{kind}_per_4x"] = g, per4
            lines.append(f"    {kind:6s} " + ", ".join(f"{k} x{v:.2f} -> x{per4[k]:.2f}" for k, v in g.items()))
    lines.extend(verdicts(r))
    return "\n".join(lines)


#: the compile-time budget (issue 27): ours / upstream at >= BUDGET_FROM nodes (record off,
#: on), ours / an FX graph copy of the same graph, our growth per 4x nodes / the copy's
BUDGET = {"upstream_off": 0.03, "upstream_on": 0.04, "copy": 2.0, "growth": 1.10}
BUDGET_FROM = 20000


def verdicts(r: dict) -> list[str]:
    """The budget's verdicts for one row (after :func:`report_row` added its growth), as
    ``budget: <check> <value> <= <limit> PASS|FAIL`` lines; adds ``r["verdicts"]``
    ({check: bool}). Seconds are best-of; growth is of medians (best-of growth is
    inflated on a noisy machine, see the module docstring). The upstream ratios apply
    from ``BUDGET_FROM`` nodes (at 5k upstream's passes are still near-linear)."""
    checks: list[tuple[str, float, float]] = []
    up = r.get("upstream_s")
    if up and r["nodes"] >= BUDGET_FROM:
        checks.append(("ours/upstream (record off)", r["ours_s"] / up, BUDGET["upstream_off"]))
        checks.append(("ours/upstream (record on) ", r["ours_recording_s"] / up, BUDGET["upstream_on"]))
    copy = r.get("fx_copy_s")
    if copy:
        checks.append(("ours/FX copy (record off) ", r["ours_s"] / copy, BUDGET["copy"]))
    per4 = r.get("growth_median_per_4x") or {}
    if "ours" in per4 and "fx_copy" in per4:
        checks.append(("growth per 4x, ours/copy  ", per4["ours"] / per4["fx_copy"], BUDGET["growth"]))
    r["verdicts"] = {name.strip(): value <= limit for name, value, limit in checks}
    return [
        f"  budget: {name} {value:7.3f} <= {limit:g}  {'PASS' if value <= limit else 'FAIL'}"
        for name, value, limit in checks
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="5000,21000,85000", help="comma-separated target node counts")
    ap.add_argument("--repeat", type=int, default=1, help="runs per size (best is reported)")
    ap.add_argument("--json", help="write the rows as JSON to this path")
    ap.add_argument("--towers", type=int, default=TOWERS, help="towers T (the graph grows in layers)")
    ap.add_argument(
        "--upstream-repeat",
        help="runs of upstream per size, one number or one per size "
        "(default: --repeat; upstream takes many minutes at 85k nodes), e.g. 3,3,1",
    )
    ap.add_argument("--no-upstream", action="store_true", help="skip upstream (profiling our side only)")
    ap.add_argument(
        "--floor", action="store_true", help="also time the FX and FakeTensor primitives inside one run of ours"
    )
    a = ap.parse_args(argv)
    torch.set_num_threads(1)  # neither side computes on real tensors; keeps CPU time = work
    print(f"torch {torch.__version__}", flush=True)
    rows: list[dict] = []
    sizes = [int(s) for s in a.sizes.split(",") if s]
    ups = [int(u) for u in a.upstream_repeat.split(",")] if a.upstream_repeat else [a.repeat]
    if len(ups) not in (1, len(sizes)):
        ap.error(f"--upstream-repeat needs one number or {len(sizes)} (one per size)")
    ups = ups * len(sizes) if len(ups) == 1 else ups
    for size, up in zip(sizes, ups):  # each size is printed and saved as it ends
        rows.append(measure(size, a.repeat, 0 if a.no_upstream else up, a.towers, a.floor))
        print(report_row(rows[-2] if len(rows) > 1 else None, rows[-1]), flush=True)
        if a.json:
            Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
