"""Compile time in ``torch.compile``, end to end: the towers model compiled by Inductor
plainly, with upstream's Optimus options, and with our passes as the pre-grad custom pass
(issue 27, item 4).

For each size (pre-grad node count of ``towers_model.Towers``, 128 towers) and mode
(``inference``: under ``torch.no_grad``; ``training``: forward and backward), each way runs
in a fresh subprocess with ``TORCHINDUCTOR_FORCE_DISABLE_CACHES=1`` (no FX graph, AOTAutograd
or Inductor cache carries over, and none is read), torch at one thread:

* **inductor**: ``torch.compile(model, backend="inductor")``;
* **upstream**: the same with ``torch._inductor.config.pre_grad_fusion_options`` =
  ``search_scale.UPSTREAM_OPTIONS`` (the pre-grad options equivalent to our default
  pipeline, as in ``benchmarks/search_scale.py``);
* **upstream_all**: also ``post_grad_fusion_options`` =
  :func:`optimus_lens.inductor.observe_post.default_post_grad_options`;
* **ours**: ``optimus_lens.compile(model, check="off")`` (our default pipeline as Inductor's
  ``pre_grad_custom_pass``, recording on as the public API runs it; no first-call check, which
  would add an eager and a compiled run).

Each child reports the wall seconds of the first call (Dynamo, pre-grad passes,
AOTAutograd, post-grad passes, code generation and the C++ compile; in training the first
backward too, whose graph compiles on that call), the seconds inside Inductor's pre-grad
passes (``_recursive_pre_grad_passes``, which runs upstream's options and our custom pass)
and post-grad passes (``_recursive_post_grad_passes``), from Dynamo's own timers
(``torch._dynamo.utils.compilation_time_metrics``), and for ``ours`` the seconds inside our
pass alone; the pre-grad graph's node count before and after the pre-grad passes; the
steady-state per-call milliseconds (median of ``--calls`` calls after two warm-up calls;
training: forward and backward); and whether the outputs (and, in training, the
parameters' gradients) equal eager's (``torch.testing.assert_close``, max |diff|). Run::

    .venv/bin/python benchmarks/compile_e2e.py --sizes 500,2000 --modes inference,training --json out.json

(500 gives the one-layer model, 1,028 pre-grad nodes; a first call takes minutes per way
on a 2-core machine, training about 3x inference.)

Per call, the ways above are timed one process after another, so a change in the
machine's load between two children moves one way's median and not the other's: on a
shared 2-core VM the same way's median varied 3.9 to 6.9 ms between children run minutes
apart, more than any difference between the ways. ``--side-by-side`` times per call the
way a comparison needs: one child (caches off, one thread) compiles every way given, each
on its own model instance with its own copy of ``forward``'s code object (so one way's
Dynamo cache entry never sits in front of another's), checks each against eager, then
runs ``--calls`` rounds, one call of each way per round, the first way rotating; it
reports each way's median and p25..p75 and the ratio of medians to the first way::

    .venv/bin/python benchmarks/compile_e2e.py --side-by-side --sizes 2000 --modes inference --ways ours,upstream --calls 400
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

WAYS = ("inductor", "upstream", "upstream_all", "ours")
MARK = "compile_e2e result: "


def _timer_sums() -> dict[str, float]:
    from torch._dynamo.utils import compilation_time_metrics

    return {k: sum(v) for k, v in compilation_time_metrics.items()}


def _watch_pre_grad(seen: dict) -> None:
    """Count the pre-grad graph's nodes before and after Inductor's pre-grad passes."""
    import torch._inductor.compile_fx as cfx

    orig = cfx._recursive_pre_grad_passes

    def wrapped(gm, example_inputs):
        seen.setdefault("pre_grad_nodes_before", len(gm.graph.nodes))
        out = orig(gm, example_inputs)
        seen["pre_grad_nodes_after"] = len(out.graph.nodes)
        return out

    cfx._recursive_pre_grad_passes = wrapped


def _time_our_pass(seen: dict) -> None:
    """Add the seconds inside our pre-grad custom pass to ``seen["ours_pass_s"]``."""
    from optimus_lens.inductor.compile import OptimusPreGradPass

    orig = OptimusPreGradPass.__call__

    def timed(self, graph):
        t0 = time.perf_counter()
        try:
            return orig(self, graph)
        finally:
            seen["ours_pass_s"] = seen.get("ours_pass_s", 0.0) + time.perf_counter() - t0

    OptimusPreGradPass.__call__ = timed  # type: ignore[method-assign]


def _step(fn, model, x, tangent, training: bool):
    """One call of ``fn`` (the model, eager or compiled) on ``x``: (output, []) under
    ``no_grad`` in inference; in training also the backward of ``tangent`` and every
    parameter's gradient."""
    import torch

    if not training:
        with torch.no_grad():
            return fn(x), []
    for p in model.parameters():
        p.grad = None
    out = fn(x)
    out.backward(tangent)
    return out.detach(), [p.grad.clone() for p in model.parameters()]


def _inductor_options(way: str) -> dict:
    """The Inductor config entries of an upstream way: its pre-grad Optimus options
    (``search_scale.UPSTREAM_OPTIONS``) and, for ``upstream_all``, the post-grad ones."""
    options: dict = {}
    if way in ("upstream", "upstream_all"):
        from search_scale import UPSTREAM_OPTIONS

        options["pre_grad_fusion_options"] = dict(UPSTREAM_OPTIONS)
    if way == "upstream_all":
        from optimus_lens.inductor.observe_post import default_post_grad_options

        options["post_grad_fusion_options"] = default_post_grad_options()
    return options


def _check_eager(into: dict, out, grads, ref_out, ref_grads) -> None:
    """``into["equal_eager"]``: whether the output and gradients equal eager's
    (``assert_close``), with the first line of the difference when not."""
    import torch

    try:
        torch.testing.assert_close(out, ref_out)
        for g, r in zip(grads, ref_grads):
            torch.testing.assert_close(g, r)
        into["equal_eager"] = True
    except AssertionError as e:
        into["equal_eager"] = False
        into["difference"] = str(e).splitlines()[0]


def child(way: str, nodes: int, mode: str, calls: int, towers: int) -> dict:
    """One compile in this (fresh) process: see the module doc. Returns the facts as a dict."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from towers_model import towers_model

    torch.set_num_threads(1)
    training = mode == "training"
    model, x = towers_model(nodes, towers)
    model.train(training)
    gen = torch.Generator().manual_seed(1)
    tangent = torch.randn(x.shape, generator=gen)

    def step(fn):
        return _step(fn, model, x, tangent, training)

    ref_out, ref_grads = step(model)
    seen: dict = {"way": way, "nodes": nodes, "mode": mode, "torch": torch.__version__}
    _watch_pre_grad(seen)
    if way == "ours":
        import optimus_lens

        _time_our_pass(seen)
        compiled = optimus_lens.compile(model, check="off")
    else:
        import torch._inductor.config as cfg

        for k, v in _inductor_options(way).items():
            setattr(cfg, k, v)
        compiled = torch.compile(model, backend="inductor")
    from torch._inductor import config as icfg

    seen["compile_threads"] = icfg.compile_threads
    t0 = time.perf_counter()
    out, grads = step(compiled)
    seen["first_call_s"] = time.perf_counter() - t0
    timers = _timer_sums()
    seen["pre_grad_s"] = timers.get("_recursive_pre_grad_passes", 0.0)
    seen["post_grad_s"] = timers.get("_recursive_post_grad_passes", 0.0)
    seen["timers"] = {k: round(v, 4) for k, v in sorted(timers.items(), key=lambda kv: -kv[1])[:12]}
    diffs = [(out - ref_out).abs().max().item()] + [(g - r).abs().max().item() for g, r in zip(grads, ref_grads)]
    seen["max_abs_diff"] = max(diffs)
    _check_eager(seen, out, grads, ref_out, ref_grads)
    seen["grads_checked"] = len(grads)
    for _ in range(2):
        step(compiled)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        step(compiled)
        times.append(time.perf_counter() - t0)
    seen["per_call_ms"] = statistics.median(times) * 1e3
    if way == "ours":
        seen["ours_steps"] = sum(len(t.steps) for t in compiled.optimus_traces)
    return seen


def _own_forward(model, tag: str) -> None:
    """Give ``model`` a class whose ``forward`` has a code object of its own: Dynamo keeps
    its cache entries on the code object, and compiles of one code are tried in turn."""
    import types

    cls = type(model)
    code = cls.forward.__code__.replace(co_name=f"forward_{tag}")
    fn = types.FunctionType(code, cls.forward.__globals__, f"forward_{tag}", cls.forward.__defaults__)
    model.__class__ = type(f"{cls.__name__}_{tag}", (cls,), {"forward": fn})


def side_by_side_child(ways: list[str], nodes: int, mode: str, calls: int, towers: int) -> dict:
    """Every way of ``ways`` compiled in this (fresh) process, then timed per call round-robin
    (see the module doc). Returns ``{"rows": [...], ...}``: per way its per-call median,
    p25 and p75 (ms), the pre-grad node count after the passes and whether it equals eager."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from towers_model import towers_model

    torch.set_num_threads(1)
    training = mode == "training"
    gen = torch.Generator().manual_seed(1)
    seen: dict = {}
    _watch_pre_grad(seen)
    entries = []
    for i, way in enumerate(ways):
        model, x = towers_model(nodes, towers)
        model.train(training)
        _own_forward(model, f"{way}_{i}")
        tangent = torch.randn(x.shape, generator=gen)

        def step(fn, model=model, x=x, tangent=tangent):
            return _step(fn, model, x, tangent, training)

        ref_out, ref_grads = step(model)
        if way == "ours":
            import optimus_lens

            compiled = optimus_lens.compile(model, check="off")
        else:
            compiled = torch.compile(model, backend="inductor", options=_inductor_options(way))
        seen.clear()
        t0 = time.perf_counter()
        out, grads = step(compiled)
        row = {"way": way, "first_call_s": time.perf_counter() - t0}
        row["pre_grad_nodes_after"] = seen.get("pre_grad_nodes_after")
        _check_eager(row, out, grads, ref_out, ref_grads)
        entries.append((row, step, compiled))
    for _, step, compiled in entries:
        for _ in range(2):
            step(compiled)
    times: list[list[float]] = [[] for _ in entries]
    for r in range(calls):
        for k in range(len(entries)):
            j = (r + k) % len(entries)
            _, step, compiled = entries[j]
            t0 = time.perf_counter()
            step(compiled)
            times[j].append(time.perf_counter() - t0)
    rows = []
    for (row, _, _), ts in zip(entries, times):
        q = statistics.quantiles(ts, n=4) if len(ts) > 1 else [ts[0]] * 3
        rows.append({**row, "per_call_ms": statistics.median(ts) * 1e3, "p25_ms": q[0] * 1e3, "p75_ms": q[2] * 1e3})
    return {"nodes": nodes, "mode": mode, "calls": calls, "torch": torch.__version__, "rows": rows}


def run_side_by_side(ways: list[str], nodes: int, mode: str, calls: int, towers: int, timeout: float) -> dict:
    """:func:`side_by_side_child` in a fresh interpreter with Inductor's caches off."""
    env = {**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child-side-by-side", ",".join(ways)]
    cmd += ["--sizes", str(nodes), "--modes", mode, "--calls", str(calls), "--towers", str(towers)]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout * len(ways))
    except subprocess.TimeoutExpired:
        return {"nodes": nodes, "mode": mode, "error": f"timed out after {timeout * len(ways):.0f} s"}
    for line in p.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])
    tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
    return {"nodes": nodes, "mode": mode, "error": f"exit {p.returncode}: {tail}"}


def report_side_by_side(res: dict) -> str:
    """One side-by-side run as text: per-call medians (p25..p75) and each way's ratio of
    medians to the first way's."""
    if "error" in res:
        return f"== {res['nodes']} nodes target, {res['mode']}, side by side: error: {res['error']}"
    rows = res["rows"]
    lines = [f"== {res['nodes']} nodes target, {res['mode']}, side by side ({res['calls']} rounds, round-robin)"]
    lines.append("  way           per call ms, median (p25..p75)   vs first  nodes after pre-grad  equal eager")
    base = rows[0]["per_call_ms"]
    for r in rows:
        lines.append(
            f"  {r['way']:13s} {r['per_call_ms']:8.3f} ({r['p25_ms']:.3f}..{r['p75_ms']:.3f})"
            f"      x{r['per_call_ms'] / base:.3f}  {str(r.get('pre_grad_nodes_after', '-')):>20}  {r['equal_eager']}"
        )
    return "\n".join(lines)


def run_child(way: str, nodes: int, mode: str, calls: int, towers: int, timeout: float) -> dict:
    """:func:`child` in a fresh interpreter with Inductor's caches off; its dict, plus the
    child's total wall seconds (``process_s``), or ``{"error": ...}``."""
    env = {**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", way, "--sizes", str(nodes), "--modes", mode]
    cmd += ["--calls", str(calls), "--towers", str(towers)]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"way": way, "nodes": nodes, "mode": mode, "error": f"timed out after {timeout:.0f} s"}
    wall = time.perf_counter() - t0
    for line in p.stdout.splitlines():
        if line.startswith(MARK):
            return {**json.loads(line[len(MARK) :]), "process_s": wall}
    tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
    return {"way": way, "nodes": nodes, "mode": mode, "error": f"exit {p.returncode}: {tail}"}


def _load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def report(rows: list[dict]) -> str:
    """The runs of one size and mode as text: seconds side by side and ratios to plain
    Inductor (``x``: this way's seconds / inductor's)."""
    base = next((r for r in rows if r["way"] == "inductor" and "error" not in r), None)
    r0 = rows[0]
    lines = [f"== {r0['nodes']} nodes target, {r0['mode']}"]
    if "pre_grad_nodes_before" in (base or {}):
        lines[0] += f" (Dynamo graph: {base['pre_grad_nodes_before']} nodes)"  # type: ignore[index]
    lines.append(
        "  way           first call s  (vs inductor)  pre-grad s  post-grad s  our pass s  nodes after pre-grad"
        "  per call ms (vs inductor)  equal eager (max |diff|)"
    )
    for r in rows:
        if "error" in r:
            lines.append(f"  {r['way']:13s} error: {r['error']}")
            continue

        def vs(k: str, r: dict = r) -> str:
            return f"x{r[k] / base[k]:.2f}" if base and base.get(k) else "-"

        ours = f"{r['ours_pass_s']:10.2f}" if "ours_pass_s" in r else " " * 10
        lines.append(
            f"  {r['way']:13s} {r['first_call_s']:10.1f}  ({vs('first_call_s'):>6s})     {r['pre_grad_s']:8.2f}"
            f"  {r['post_grad_s']:10.2f}  {ours}  {r.get('pre_grad_nodes_after', '-'):>20}"
            f"  {r['per_call_ms']:9.2f} ({vs('per_call_ms'):>6s})       {r['equal_eager']} ({r['max_abs_diff']:.1e})"
        )
    up = next((r for r in rows if r["way"] == "upstream" and "error" not in r), None)
    ours_r = next((r for r in rows if r["way"] == "ours" and "error" not in r), None)
    if up and ours_r and base:
        up_share = up["pre_grad_s"] - base["pre_grad_s"]
        lines.append(
            f"  pre-grad: ours {ours_r['pre_grad_s']:.2f} s (our pass {ours_r.get('ours_pass_s', 0):.2f} s) vs upstream "
            f"{up['pre_grad_s']:.2f} s (its Optimus options: {up_share:.2f} s over plain Inductor's "
            f"{base['pre_grad_s']:.2f} s); ours/upstream {ours_r['pre_grad_s'] / up['pre_grad_s']:.3f}; "
            f"first call ours/upstream {ours_r['first_call_s'] / up['first_call_s']:.3f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="500,2000", help="comma-separated pre-grad node counts of the towers model")
    ap.add_argument("--modes", default="inference,training", help="inference, training or both")
    ap.add_argument("--ways", default=",".join(WAYS), help=f"which compiles, of {', '.join(WAYS)}")
    ap.add_argument("--calls", type=int, default=20, help="steady-state calls timed after compile")
    ap.add_argument("--towers", type=int, default=128, help="towers T (the model grows in layers)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per child process")
    ap.add_argument("--json", help="write every run as JSON to this path")
    ap.add_argument(
        "--side-by-side",
        action="store_true",
        help="per call only: compile every way in one process and time them round-robin",
    )
    ap.add_argument("--child", choices=WAYS, help=argparse.SUPPRESS)
    ap.add_argument("--child-side-by-side", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(MARK + json.dumps(child(a.child, int(a.sizes), a.modes, a.calls, a.towers)), flush=True)
        return 0
    if a.child_side_by_side:
        res = side_by_side_child(a.child_side_by_side.split(","), int(a.sizes), a.modes, a.calls, a.towers)
        print(MARK + json.dumps(res), flush=True)
        return 0
    ways = [w for w in a.ways.split(",") if w]
    bad = [w for w in ways if w not in WAYS]
    if bad:
        ap.error(f"unknown way(s) {', '.join(bad)}; known: {', '.join(WAYS)}")
    print(f"load average at start {_load()}", flush=True)
    if a.side_by_side:
        results = []
        for n in (int(s) for s in a.sizes.split(",") if s):
            for mode in (m for m in a.modes.split(",") if m):
                res = run_side_by_side(ways, n, mode, a.calls, a.towers, a.timeout)
                res["load_after"] = _load()
                results.append(res)
                if a.json:
                    Path(a.json).write_text(json.dumps(results, indent=1))
                print(report_side_by_side(res), flush=True)
        print(f"load average at end {_load()}", flush=True)
        bad_runs = [r for r in results if "error" in r or not all(x["equal_eager"] for x in r["rows"])]
        return 1 if bad_runs else 0
    runs: list[dict] = []
    for n in (int(s) for s in a.sizes.split(",") if s):
        for mode in (m for m in a.modes.split(",") if m):
            rows = []
            for way in ways:
                r = run_child(way, n, mode, a.calls, a.towers, a.timeout)
                r["load_after"] = _load()
                rows.append(r)
                runs.append(r)
                if a.json:
                    Path(a.json).write_text(json.dumps(runs, indent=1))
            print(report(rows), flush=True)
    print(f"load average at end {_load()}", flush=True)
    failed = [r for r in runs if "error" in r or not r.get("equal_eager")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
