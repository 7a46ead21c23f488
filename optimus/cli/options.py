"""The options several commands share, as argparse parent parsers, and the readers of
their values.

A command's parser lists the parents it takes (``sub.add_parser(..., parents=[SOURCE,
PASSES])``); each parent adds its arguments before the command's own.
"""

from __future__ import annotations

import argparse
import json

from optimus_lens.cli.errors import BadInput

MODEL_HELP = (
    "sample:NAME (`optimus samples`), package.module:factory or path/to/file.py:factory "
    "(resolved from the current directory; the factory returns (model, example_inputs)), "
    "path/to/model.pt2 (saved by torch.export.save), or hf:NAME (`optimus sweep --list-hf`)"
)


def parent(*parents: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """A parent parser (no ``-h`` of its own) holding the arguments of ``parents``."""
    return argparse.ArgumentParser(add_help=False, parents=list(parents))


#: MODEL, the positional argument of every command that loads a model
MODEL = parent()
MODEL.add_argument("model", help=MODEL_HELP)

#: MODEL and how its graph is captured: run, match, why, bisect, observe, compare
SOURCE = parent(MODEL)
SOURCE.add_argument(
    "--capture",
    choices=["dynamo", "symbolic"],
    default="dynamo",
    help="how the graph is captured: dynamo (default) or symbolic (torch.fx symbolic tracing)",
)
SOURCE.add_argument("--graph", type=int, default=None, help="with graph breaks: which graph (0-based)")

#: --passes: run, bisect, bench, why
PASSES = parent()
PASSES.add_argument("--passes", help="comma-separated pass names to enable (`optimus passes` lists them; default: all)")

#: --skip: run, bisect
SKIP = parent()
SKIP.add_argument("--skip", help="comma-separated pass names to switch off (applied after --passes)")

#: --search: run, why
SEARCH = parent()
SEARCH.add_argument(
    "--search",
    choices=["global", "upstream"],
    default=None,
    help="how batch fusions find groups: global (default; every independent group of one key) "
    "or upstream (PyTorch's bounded search, for parity)",
)

#: --pattern-file: run, bench, why (match requires its own)
PATTERN_FILE = parent()
PATTERN_FILE.add_argument(
    "--pattern-file",
    help="a pattern file (pattern/replacement functions or PATTERNS): its patterns "
    "run as one extra pass, named after the file, after the default pipeline (alone with --passes NAME)",
)

#: --verify step|end|off: run, sweep
VERIFY = parent()
VERIFY.add_argument(
    "--verify",
    choices=["step", "end", "off"],
    default="end",
    help="compare outputs with the original model after every step, once at the end (default), or never",
)

#: --grads: run, bisect
GRADS = parent()
GRADS.add_argument("--grads", action="store_true", help="also compare gradients")

#: --trace OUT: run, bisect, observe
TRACE_OUT = parent()
TRACE_OUT.add_argument("--trace", help="write the trace JSON here (show, diff, repro, inspect and the app read it)")

#: --options JSON: observe, compare
UPSTREAM_OPTIONS = parent()
UPSTREAM_OPTIONS.add_argument(
    "--options",
    help="pre_grad_fusion_options as JSON, e.g. '{\"batch_layernorm\": {}}' "
    "(default: upstream's equivalent of our default pipeline; compare runs our equivalent of them too)",
)

#: --stage: bench (its own --mode says how the stages run)
STAGE_ONLY = parent()
STAGE_ONLY.add_argument(
    "--stage",
    choices=["pre-grad", "post-grad", "all"],
    default="pre-grad",
    help="which graphs: pre-grad (default: the Dynamo graph), post-grad (the ATen graphs Inductor's "
    "post-grad passes see: forward, and backward with --mode training), or all (pre-grad, then the ATen "
    "graphs of the rewritten program)",
)

#: --stage and --mode: run, observe, compare, match, why, bisect
STAGE = parent(STAGE_ONLY)
STAGE.add_argument(
    "--mode",
    choices=["inference", "training"],
    default="inference",
    help="inference (default): the forward ATen graph traced under no_grad; training: the forward and "
    "backward graphs (the model in train mode, pre-grad steps verified on gradients too)",
)

#: --graph pre-grad|forward|backward: the commands that read a saved trace
GRAPH_PICK = parent()
GRAPH_PICK.add_argument(
    "--graph",
    choices=["pre-grad", "forward", "backward"],
    default=None,
    help="which graph of a trace with several (optimus run --stage post-grad|all): each numbers its steps "
    "from 1 (default: the only graph with steps, else the graph of the first failing step)",
)

#: TRACE, the positional argument of every command that reads a saved trace
TRACE = parent(GRAPH_PICK)
TRACE.add_argument("trace", help="trace JSON written by `optimus run --trace`, `optimus observe --trace` or the app")

#: TRACE and --step N: repro, diff
TRACE_STEP = parent(TRACE)
TRACE_STEP.add_argument("--step", type=int, help="step index (default: the first failing step, else the last)")

#: -o / --output FILE (required): report, lesson
OUTPUT = parent()
OUTPUT.add_argument("-o", "--output", required=True, help="the HTML file to write")


def names_arg(text: str | None) -> list[str] | None:
    """A comma-separated option (``--passes a,b``) as a list of names; None when not given."""
    return [p.strip() for p in text.split(",") if p.strip()] if text else None


def options_arg(text: str | None) -> dict | None:
    """``--options`` JSON text -> dict (None: upstream's equivalent of our pipeline).
    Raises BadInput for text that is not a JSON object."""
    if text is None:
        return None
    try:
        opts = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadInput(f"--options is not JSON: {e}") from e
    if not isinstance(opts, dict):
        raise BadInput(f"--options must be a JSON object {{pass name: options}}, not {type(opts).__name__}")
    return opts
