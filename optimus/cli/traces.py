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
    """Print the model, its node counts and the step table."""
    t = load_trace(a.trace)
    print(f"model {t.model}: {t.nodes_before} -> {t.nodes_after} nodes")
    print(steps_table(t))
    return EXIT_OK


def cmd_repro(a: argparse.Namespace) -> int:
    """Write the repro script of one step to stdout or ``-o`` (:func:`optimus_lens.debug.repro.repro_script`)."""
    from optimus_lens.debug.repro import repro_script

    t = load_trace(a.trace)
    index = step_index(t, a.step)
    with input_errors():  # ReproError, RebuildError
        text = repro_script(t, index)
    if a.output in (None, "-"):
        sys.stdout.write(text)
    else:
        Path(a.output).write_text(text)
        s = t.step(index)
        print(
            f"repro of step {index} ({s.pass_name} / {s.pattern}) written to {a.output}; run it with: python {a.output}"
        )
    return EXIT_OK


def cmd_diff(a: argparse.Namespace) -> int:
    """Print the unified diff of one step's GraphModule code (:func:`optimus_lens.debug.codediff.code_diff`),
    coloured on a terminal (``--color auto``)."""
    from optimus_lens.debug.codediff import code_diff, diff_text

    t = load_trace(a.trace)
    index = step_index(t, a.step)
    with input_errors():  # RebuildError
        lines = code_diff(t, index, context=a.context)
    s = t.step(index)
    color = a.color == "always" or (a.color == "auto" and sys.stdout.isatty())
    sys.stdout.write(diff_text(lines, f"step {index} ({s.pass_name} / {s.pattern})", color=color))
    return EXIT_OK


def cmd_inspect(a: argparse.Namespace) -> int:
    """Print one node of the trace (:func:`optimus_lens.debug.inspect_node.node_info`); its
    source lines are looked up in the current directory and the sample models' folder."""
    from optimus_lens.debug.inspect_node import node_info, node_info_text

    t = load_trace(a.trace)
    samples = str(resources.files("optimus_lens.sample_models"))
    with input_errors(IndexError):  # NodeNotFound (a KeyError), a step out of range
        info = node_info(t, a.node, a.step, search=[samples])
    print(node_info_text(info))
    return EXIT_OK
