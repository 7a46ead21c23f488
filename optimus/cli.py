"""The ``optimus`` command.

    optimus run MODEL [--passes a,b] [--verify step|end|off] [--grads] [--trace out.json]
    optimus passes
    optimus bench MODEL [--passes a,b] [--repeats N] [--compile] [--json out.json]
    optimus show TRACE.json
    optimus why MODEL NODE
    optimus app [--port N]

MODEL is ``sample:NAME`` (``optimus run sample:recsys_towers``) or
``package.module:factory`` (a callable returning ``(model, example_inputs)``).
Exit status: 0 ok; 1 a step failed verification; 2 bad input (unknown model or pass,
untraceable model, unreadable trace); 3 a pattern raised.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

EXIT_VERIFY, EXIT_INPUT, EXIT_PATTERN = 1, 2, 3


def _fmt_verify(v) -> str:
    if v is None or v.ok is None:
        return "-" if v is None else v.checked
    if v.ok:
        return f"ok {v.max_abs_err:.1e}" if v.max_abs_err is not None else "ok"
    return "FAIL" + (f" {v.max_abs_err:.1e}" if v.max_abs_err is not None else "")


def steps_table(trace) -> str:
    """The steps of a trace as a plain-text table: index, pass, pattern, sites, created,
    erased, verify (ok / FAIL and the largest absolute error), ms (match + rewrite).
    Columns are as wide as their longest name."""
    wp = max([len("pass"), *(len(s.pass_name) for s in trace.steps)])
    wq = max([len("pattern"), *(len(s.pattern) for s in trace.steps)])
    head = (f"{'#':>4s}  {'pass':{wp}s} {'pattern':{wq}s} {'sites':>5s} {'created':>7s} {'erased':>6s}  "
            f"{'verify, max err':15s} {'ms':>7s}")
    rows = [head, "-" * len(head)]
    for s in trace.steps:
        rows.append(f"{s.index:4d}  {s.pass_name:{wp}s} {s.pattern:{wq}s} {len(s.sites):5d} {len(s.created):7d} "
                    f"{len(s.erased):6d}  {'rolled back' if s.error else _fmt_verify(s.verify):15s} "
                    f"{(s.match_s + s.rewrite_s) * 1e3:7.2f}")
    return "\n".join(rows)


def _passes_arg(text: str | None) -> list[str] | None:
    return [p.strip() for p in text.split(",") if p.strip()] if text else None


def cmd_run(a) -> int:
    from optimus.capture import CaptureError
    from optimus.engine import PatternError
    from optimus.run import ModelSpecError, optimize

    try:
        res = optimize(a.model, passes=_passes_arg(a.passes), verify=a.verify, grads=a.grads,
                       capture_method=a.capture, graph_index=a.graph,
                       on_capture=lambda c: print(c.summary(), file=sys.stderr),
                       dynamic=a.dynamic, on_error=a.on_error)
    except (ModelSpecError, CaptureError, KeyError, ValueError) as e:
        print(f"optimus: {e.args[0] if isinstance(e, KeyError) else e}", file=sys.stderr)
        return EXIT_INPUT
    except PatternError as e:
        print(f"optimus: {e}", file=sys.stderr)
        return EXIT_PATTERN
    t = res.trace
    print(steps_table(t))
    print(f"\nnodes: {t.nodes_before} -> {t.nodes_after} in {len(t.steps)} steps "
          f"({', '.join(f'{p}: {len(t.steps_of_pass(p))}' for p in dict.fromkeys(s.pass_name for s in t.steps)) or 'nothing matched'})")
    if t.final_verify is not None and t.final_verify.ok is not None:
        print(f"verify ({a.verify}): {_fmt_verify(t.final_verify)} {t.final_verify.message}".rstrip())
    if a.trace:
        n = t.save(a.trace)
        print(f"trace written to {a.trace} ({n:,} bytes)")
    failed = t.failed_steps() or ([] if not t.final_verify or t.final_verify.ok is not False else [None])
    for s in t.steps:
        if s.error:
            print(f"optimus: step {s.index} ({s.pattern} at {', '.join(s.sites[:4])}) was rolled back: "
                  f"{s.error['kind']}: {s.error['type']}: {s.error['message']} [{s.error['source']}]", file=sys.stderr)
    if failed:
        which = ", ".join(str(s.index) for s in failed if s is not None) or "the final graph"
        print(f"optimus: verification failed or rolled back at step(s) {which}", file=sys.stderr)
        return EXIT_VERIFY
    return 0


def cmd_passes(a) -> int:
    from optimus.passes import default_pipeline, pass_catalogue

    pipe = default_pipeline()
    in_pass = {p.name: q.name for q in pipe.passes for p in q.patterns}
    for p in pass_catalogue():
        where = f"in pass {in_pass[p['name']]}" if p["name"] in in_pass else \
            "not in the default pipeline (upstream_pipeline options only)"
        print(f"{p['name']}  [{p['kind']} pattern, {where}]  {p['source']}")
        print(f"    {p['description']}")
        for c in p["preconditions"]:
            print(f"    - {c}")
        if p["upstream"]:
            print(f"    upstream: {p['upstream']}")
    return 0


def cmd_bench(a) -> int:
    from optimus.bench import bench_pipeline
    from optimus.capture import CaptureError
    from optimus.run import ModelSpecError

    try:
        r = bench_pipeline(a.model, passes=_passes_arg(a.passes), repeats=a.repeats, compile=a.compile)
    except (ModelSpecError, CaptureError, KeyError, ValueError) as e:
        print(f"optimus: {e}", file=sys.stderr)
        return EXIT_INPUT
    print(r.table())
    if a.json:
        Path(a.json).write_text(json.dumps(r.to_json(), indent=1))
    return 0


def cmd_show(a) -> int:
    from optimus.trace import Trace, TraceFormatError

    try:
        t = Trace.load(a.trace)
    except (OSError, TraceFormatError) as e:
        print(f"optimus: cannot read {a.trace}: {e}", file=sys.stderr)
        return EXIT_INPUT
    print(f"model {t.model}: {t.nodes_before} -> {t.nodes_after} nodes")
    print(steps_table(t))
    return 0


def cmd_why(a) -> int:
    from optimus.capture import CaptureError, capture
    from optimus.pattern import BatchPattern, explain, get, group_size
    from optimus.run import ModelSpecError, load_model

    try:
        model, inputs, _ = load_model(a.model)
        gm = capture(model, inputs, method=a.capture).gm
    except (ModelSpecError, CaptureError) as e:
        print(f"optimus: {e}", file=sys.stderr)
        return EXIT_INPUT
    node = next((n for n in gm.graph.nodes if n.name == a.node), None)
    if node is None:
        names = [n.name for n in gm.graph.nodes if n.op != "placeholder"]
        print(f"optimus: no node {a.node!r} in the captured graph; nodes: {', '.join(names[:40])}"
              + (" ..." if len(names) > 40 else ""), file=sys.stderr)
        return EXIT_INPUT
    from optimus.record import target_name

    print(f"{node.name} = {node.op} {target_name(node)}")
    for name, reason in explain(node).items():
        if reason is not None:
            print(f"  {name:32s} no: {reason}")
            continue
        p = get(name)
        if not isinstance(p, BatchPattern):
            print(f"  {name:32s} matches here")
            continue
        size, need = group_size(p, node), p.options.min_fuse_set_size
        verdict = (f"too few to fuse (needs {need})" if size < need else
                   f"fuses if {need}+ of them are independent and all within "
                   f"{p.options.max_fuse_search_depth} producer hops of one node")
        print(f"  {name:32s} member: {size} node(s) share its group key; {verdict}")
    return 0


def cmd_app(a) -> int:
    app = Path(__file__).resolve().parent.parent / "app" / "main.py"
    env = dict(os.environ)
    if a.model:
        env["OPTIMUS_LENS_MODEL"] = a.model
    cmd = [sys.executable, "-m", "streamlit", "run", str(app), "--server.port", str(a.port),
           "--browser.gatherUsageStats", "false"]
    if a.headless:
        cmd += ["--server.headless", "true"]
    return subprocess.call(cmd, env=env)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="optimus", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="capture a model and run the Optimus pipeline, one recorded step per match")
    r.add_argument("model", help="sample:NAME or package.module:factory")
    r.add_argument("--passes", help="comma-separated pass names to enable (`optimus passes` lists them; "
                   "default: all)")
    r.add_argument("--verify", choices=["step", "end", "off"], default="end",
                   help="compare outputs with the original model after every step, once at the end "
                   "(default), or never")
    r.add_argument("--grads", action="store_true", help="also compare gradients")
    r.add_argument("--trace", help="write the trace JSON here")
    r.add_argument("--capture", choices=["dynamo", "symbolic"], default="dynamo")
    r.add_argument("--graph", type=int, default=None, help="with graph breaks: which graph (0-based)")
    r.add_argument("--dynamic", action="store_true",
                   help="capture with dynamic shapes (Dynamo); verification also runs a second input shape")
    r.add_argument("--on-error", choices=["skip", "stop"], default="skip", dest="on_error",
                   help="a step that raises or leaves the graph invalid is rolled back; then go on without "
                   "that pattern at that site (default) or stop")
    r.set_defaults(fn=cmd_run)
    p = sub.add_parser("passes", help="list the patterns with description, preconditions and source")
    p.set_defaults(fn=cmd_passes)
    b = sub.add_parser("bench", help="time the graph after each pass (CUDA events on GPU, wall clock on CPU)")
    b.add_argument("model", help="sample:NAME or package.module:factory")
    b.add_argument("--passes", help="comma-separated pass names to enable (default: all)")
    b.add_argument("--repeats", type=int, default=20, help="timed runs per stage after warm-up (default: 20)")
    b.add_argument("--compile", action="store_true", help="also time each stage under torch.compile (Inductor)")
    b.add_argument("--json", help="write the result as JSON here")
    b.set_defaults(fn=cmd_bench)
    s = sub.add_parser("show", help="print the steps of a saved trace")
    s.add_argument("trace")
    s.set_defaults(fn=cmd_show)
    y = sub.add_parser("why", help="for one node of a model's graph, why each pattern does or does not apply")
    y.add_argument("model")
    y.add_argument("node", help="FX node name, e.g. linear_3")
    y.add_argument("--capture", choices=["dynamo", "symbolic"], default="dynamo")
    y.set_defaults(fn=cmd_why)
    w = sub.add_parser("app", help="start the Streamlit app")
    w.add_argument("--port", type=int, default=8501)
    w.add_argument("--model", help="sample model selected first, e.g. sample:bert (default sample:recsys_towers)")
    w.add_argument("--headless", action="store_true")
    w.set_defaults(fn=cmd_app)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
