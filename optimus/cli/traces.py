"""The commands that read a saved trace: ``show`` (its steps), ``repro`` (a standalone
script replaying one step), ``diff`` (the code a step changed) and ``inspect`` (one node
across the steps)."""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path

from optimus_lens.cli.errors import EXIT_OK, BadInput, input_errors
from optimus_lens.cli.options import TRACE, TRACE_STEP
from optimus_lens.cli.text import steps_table


def add_parsers(sub) -> None:
    """Add ``show``, ``repro``, ``diff`` and ``inspect`` to the subcommands ``sub``."""
    sub.add_parser("show", help="print the steps of a saved trace", parents=[TRACE]).set_defaults(fn=cmd_show)
    rp = sub.add_parser(
        "repro",
        help="write a standalone script that replays one step of a trace and checks it (no model code needed)",
        parents=[TRACE_STEP],
    )
    rp.add_argument("-o", "--output", help="write the script here (default: stdout)")
    rp.set_defaults(fn=cmd_repro)
    df = sub.add_parser(
        "diff",
        help="the GraphModule code before vs after one step, as a unified diff "
        "(> marks the lines of the step's sites and created nodes)",
        parents=[TRACE_STEP],
    )
    df.add_argument("--context", type=int, default=3, help="unchanged lines around each change (default: 3)")
    df.add_argument("--color", choices=["auto", "always", "never"], default="auto")
    df.set_defaults(fn=cmd_diff)
    ins = sub.add_parser(
        "inspect",
        help="one node of a trace: op, args, shape, strides, dtype, module, inputs, "
        "users, source, and where it came from and went across the steps",
        parents=[TRACE],
    )
    ins.add_argument("node", help="FX node name, e.g. layer_norm_3")
    ins.add_argument(
        "--step",
        type=int,
        help="the graph after this many steps (default: the last graph holding the node; 0 is the captured graph)",
    )
    ins.set_defaults(fn=cmd_inspect)


def load_trace(path: str):
    """The :class:`optimus_lens.core.trace.Trace` saved at ``path``. Raises BadInput when it
    cannot be read or is not a trace."""
    from optimus_lens.core.trace import Trace, TraceFormatError

    try:
        return Trace.load(path)
    except (OSError, TraceFormatError) as e:
        raise BadInput(f"cannot read {path}: {e}") from e


def pick_graph(t, graph: str | None, step: int | None = None, node: str | None = None, first: bool = False):
    """The trace of one graph of ``t`` (a run may hold the pre-grad graph and the ATen
    forward and backward graphs, each numbering its steps from 1): ``graph`` when given;
    else the only graph; else the one holding ``node`` when only one does; else, for a
    ``step`` number, none (BadInput: the number is ambiguous, ``--graph`` picks); else the
    first graph with steps (``first``) or the graph of the run's first failing step, and
    without one the last graph with steps. Raises BadInput for a graph the trace lacks."""
    if graph is not None:
        try:
            return t.graph_named(graph)
        except KeyError as e:
            raise BadInput(str(e.args[0])) from e
    graphs = t.traces()
    if len(graphs) == 1:
        return t
    if node is not None:
        holding = [g for g in graphs if _holds(g, node)]
        if len(holding) == 1:
            return holding[0]
        if len(holding) > 1:
            raise BadInput(
                f"{node} is in the {', '.join(g.graph for g in holding)} graphs of this trace: pick one with --graph"
            )
    busy = [g for g in graphs if g.steps]
    if step is not None and len(busy) > 1:
        raise BadInput(
            f"step {step} is ambiguous: the trace has steps in the {', '.join(g.graph for g in busy)} graphs, "
            "each numbered from 1; pick one with --graph"
        )
    if first:
        return busy[0] if busy else t
    failed = t.all_failed()
    if failed:
        return t.graph_named(failed[0].graph)
    return busy[-1] if busy else t


def _holds(t, node: str) -> bool:
    if node in t.initial_graph.nodes:
        return True
    return any(s.delta is not None and any(r.name == node for r in s.delta.upsert) for s in t.steps)


def graphs_note(t, shown) -> str | None:
    """A line naming the other graphs of ``t`` with steps (``--graph`` shows them), or None."""
    others = [f"{g.graph} ({len(g.steps)} steps)" for g in t.traces() if g is not shown and g.steps]
    if not others:
        return None
    return f"(graph {shown.graph}; the trace also holds {', '.join(others)}: --graph NAME shows another)"


def step_index(t, step: int | None) -> int:
    """``step`` checked against the trace ``t`` (default: the first failing step, else the
    last). Raises BadInput when the trace has no such step."""
    if step is None:
        failed = t.failed_steps()
        step = failed[0].index if failed else len(t.steps)
    if not 1 <= step <= len(t.steps):
        raise BadInput(f"there is no step {step}; the trace has {len(t.steps)}")
    return step


def cmd_show(a: argparse.Namespace) -> int:
    """Print the model, its node counts and the step table; for a trace of several graphs
    (pre-grad, forward, backward) one table per graph, or the one ``--graph`` names."""
    t = load_trace(a.trace)
    shown = [pick_graph(t, a.graph)] if a.graph else t.traces()
    print(f"model {t.model}: {t.nodes_before} -> {t.nodes_after} nodes")
    for g in shown:
        if len(t.traces()) > 1:
            print(f"\n{g.graph} graph: {g.nodes_before} -> {g.nodes_after} nodes, {len(g.steps)} steps")
        print(steps_table(g))
    return EXIT_OK


def cmd_repro(a: argparse.Namespace) -> int:
    """Write the repro script of one step to stdout or ``-o`` (:func:`optimus_lens.debug.repro.repro_script`)."""
    from optimus_lens.debug.repro import repro_script

    t = pick_graph(load_trace(a.trace), a.graph, a.step)
    index = step_index(t, a.step)
    with input_errors():  # ReproError, RebuildError
        text = repro_script(t, index)
    if a.output in (None, "-"):
        sys.stdout.write(text)
    else:
        Path(a.output).write_text(text)
        s = t.step(index)
        print(
            f"repro of {t.graph} step {index} ({s.pass_name} / {s.pattern}) written to {a.output}; "
            f"run it with: python {a.output}"
        )
    return EXIT_OK


def cmd_diff(a: argparse.Namespace) -> int:
    """Print the unified diff of one step's GraphModule code (:func:`optimus_lens.debug.codediff.code_diff`),
    coloured on a terminal (``--color auto``)."""
    from optimus_lens.debug.codediff import code_diff, diff_text

    t = pick_graph(load_trace(a.trace), a.graph, a.step)
    index = step_index(t, a.step)
    with input_errors():  # RebuildError
        lines = code_diff(t, index, context=a.context)
    s = t.step(index)
    color = a.color == "always" or (a.color == "auto" and sys.stdout.isatty())
    where = f"{t.graph} " if t.graph != "pre-grad" or t.graphs else ""
    sys.stdout.write(diff_text(lines, f"{where}step {index} ({s.pass_name} / {s.pattern})", color=color))
    return EXIT_OK


def cmd_inspect(a: argparse.Namespace) -> int:
    """Print one node of the trace (:func:`optimus_lens.debug.inspect_node.node_info`); its
    source lines are looked up in the current directory and the sample models' folder."""
    from optimus_lens.debug.inspect_node import node_info, node_info_text

    t = pick_graph(load_trace(a.trace), a.graph, node=a.node)
    samples = str(resources.files("optimus_lens.sample_models"))
    with input_errors(IndexError):  # NodeNotFound (a KeyError), a step out of range
        info = node_info(t, a.node, a.step, search=[samples])
    print(node_info_text(info))
    return EXIT_OK
