"""``optimus log PATH``: the graphs a compile log holds (``TORCH_TRACE`` or
``TORCH_COMPILE_DEBUG``), each with the ``log:`` spec that opens it in every command."""

from __future__ import annotations

import argparse

from optimus_lens.cli.errors import EXIT_OK, EXIT_VERIFY, BadInput
from optimus_lens.cli.jsonout import add_json, json_output


def add_parsers(sub) -> None:
    """Add ``log`` to the subcommands ``sub``."""
    lg = sub.add_parser(
        "log",
        help="list the graphs of a compile log (TORCH_TRACE or TORCH_COMPILE_DEBUG), with the log:PATH#SELECTOR "
        "spec that opens each",
    )
    lg.add_argument("path", help="a TORCH_TRACE directory or file, or a TORCH_COMPILE_DEBUG directory")
    lg.add_argument(
        "--replay",
        action="store_true",
        help="replay upstream's pre-grad passes on each compile's before_pre_grad_graph with the logged "
        "pre_grad_fusion_options and say whether that reproduces its after_pre_grad_graph node for node",
    )
    add_json(lg, "the listing")
    lg.set_defaults(fn=cmd_log)


def spec_of(path: str, e, default: bool) -> str:
    """The model spec opening entry ``e`` of the log at ``path``."""
    return f"log:{path}" if default else f"log:{path}#{e.selector}"


def replays(log, path: str) -> list[dict]:
    """Per compile holding both pre-grad graphs: our replay of upstream's passes against
    the logged result (:func:`optimus_lens.inductor.log_replay.check_replay`)."""
    from optimus_lens.frontend.capture import capture
    from optimus_lens.frontend.compile_log import LogError, load_entry
    from optimus_lens.inductor.log_replay import BEFORE, check_replay
    from optimus_lens.inductor.observe import observe

    out = []
    for e in log.graphs(BEFORE):
        row: dict = {"compile_id": e.compile_id}
        try:
            loaded = load_entry(log, e)
            c = capture(loaded.gm, loaded.example_inputs)
            res = observe(
                spec_of(path, e, False), options=log.pre_grad_options(e.compile_id) or {}, verify=True, captured=c
            )
            check = check_replay(res.trace)
        except (LogError, KeyError, TypeError) as ex:
            row.update({"reproduced": None, "text": f"cannot replay: {ex}"})
        else:
            if check is None:
                row.update({"reproduced": None, "text": "the log holds no after_pre_grad_graph for it"})
            else:
                row.update(
                    {
                        "reproduced": check.reproduced,
                        "text": check.text(),
                        "steps": len(res.trace.steps),
                        "failed_steps": [s.index for s in res.trace.failed_steps()],
                    }
                )
        out.append(row)
    return out


def cmd_log(a: argparse.Namespace) -> int:
    """Print the log's graphs (index, compile id, artifact, IR, nodes, spec), its graph
    breaks, the logged ``pre_grad_fusion_options`` and failed compiles; with ``--replay``
    one verdict per compile. Exit 1 when a replay does not reproduce the log; raises
    BadInput for a path that holds no log."""
    from optimus_lens.frontend.compile_log import DEFAULT_ARTIFACT, LogError, read_log

    try:
        log = read_log(a.path)
    except LogError as e:
        raise BadInput(str(e)) from e
    default = log.graphs(DEFAULT_ARTIFACT)[0].index if log.graphs(DEFAULT_ARTIFACT) else None
    rows = [
        {
            "index": e.index,
            "compile_id": e.compile_id,
            "artifact": e.artifact,
            "ir": e.ir,
            "nodes": e.nodes,
            "rank": e.rank,
            "spec": spec_of(a.path, e, e.index == default),
            "file": e.file,
            "line": e.line,
        }
        for e in log.entries
    ]
    status = EXIT_OK
    with json_output(a, "log") as emit:
        compiles = list(dict.fromkeys(e.compile_id for e in log.entries))
        n_breaks = sum(len(b) for b in log.breaks.values())
        print(
            f"compile log {a.path} ({len(log.files) or 'no structured'} file(s), torch {log.torch_version or '?'}): "
            f"{len(rows)} graph(s) in {len(compiles)} compile(s), {n_breaks} graph break(s)"
        )
        wc = max([len("compile"), *(len(r["compile_id"]) for r in rows)])
        wa = max([len("artifact"), *(len(r["artifact"]) for r in rows)])
        print(f"{'#':>4s}  {'compile':{wc}s}  {'artifact':{wa}s}  {'IR':5s} {'nodes':>6s}  MODEL")
        for r in rows:
            nodes = str(r["nodes"]) if r["nodes"] >= 0 else "?"
            print(
                f"{r['index']:4d}  {r['compile_id']:{wc}s}  {r['artifact']:{wa}s}  {r['ir']:5s} {nodes:>6s}  {r['spec']}"
            )
        for cid, reasons in log.breaks.items():
            for text in reasons:
                lines = text.splitlines()
                print(f"graph break in {cid}: {' / '.join(ln.strip() for ln in lines[:2])}")
        for cid in compiles:
            opts = log.pre_grad_options(cid)
            if opts:
                print(f"{cid}: pre_grad_fusion_options {opts}")
        for cid, why in log.failures.items():
            print(f"{cid}: compile failed: {why}")
        replay = replays(log, a.path) if a.replay else []
        for r in replay:
            print(f"{r['compile_id']}: {r['text']}")
            if r["reproduced"] is False:
                status = EXIT_VERIFY
        emit(
            {
                "path": a.path,
                "files": log.files,
                "torch": log.torch_version,
                "graphs": rows,
                "breaks": log.breaks,
                "pre_grad_fusion_options": {cid: log.pre_grad_options(cid) for cid in compiles},
                "failures": log.failures,
                "replay": replay if a.replay else None,
            }
        )
    return status
