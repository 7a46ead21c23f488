"""Our post-grad passes on a program's ATen graphs: capture them
(:mod:`optimus_lens.frontend.aten_capture`) and run the post-grad pipeline on each, one
recorded Trace per graph, every step verified against that graph's own original on the
real tensors it was called with (forward: its outputs, the activations saved for backward
among them; backward: the gradients it returns).

:func:`run_post_grad` is what :func:`optimus_lens.frontend.run.optimize` calls for
``stage="post-grad"`` (on the captured program) and ``stage="all"`` (on the program our
pre-grad passes rewrote); its traces become the run's ``Trace.graphs``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch.fx import GraphModule

from optimus_lens.core.engine import Engine, RunOptions
from optimus_lens.core.pipeline import Pipeline
from optimus_lens.core.trace import Step, Trace
from optimus_lens.frontend.aten_capture import AtenCapture, capture_aten

STAGES = ("pre-grad", "post-grad", "all")


@dataclass
class PostGradRun:
    """The ATen graphs of one program (``capture``), the Engine that ran the post-grad
    pipeline on each (``engines``, by graph name: its ``gm`` is the rewritten graph, its
    ``stages`` the per-pass copies with ``keep_stages``) and their traces, in run order."""

    capture: AtenCapture
    engines: dict[str, Engine] = field(default_factory=dict)
    traces: list[Trace] = field(default_factory=list)


def check_stage(stage: str, mode: str) -> None:
    """Raise ValueError for a stage or mode outside ``STAGES`` / ``("inference", "training")``."""
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {', '.join(STAGES)}, not {stage!r}")
    if mode not in ("inference", "training"):
        raise ValueError(f"mode must be inference or training, not {mode!r}")


def run_post_grad(
    gm: GraphModule,
    example_inputs: tuple,
    mode: str = "inference",
    pipeline: Pipeline | None = None,
    verify: str = "end",
    record: bool = True,
    keep_stages: bool = False,
    on_step: Callable[[Step], None] | None = None,
    on_error: str = "skip",
    model_name: str = "",
    capture: AtenCapture | None = None,
) -> PostGradRun:
    """Capture the ATen graphs of ``gm`` (unchanged) on ``example_inputs`` in ``mode``
    (:func:`optimus_lens.frontend.aten_capture.capture_aten`) and run ``pipeline``
    (default: :func:`optimus_lens.passes.post_grad.post_grad_pipeline`) on each, in place on
    the captured copies, with ``verify`` ("step", "end", "off") against each graph's
    original outputs on its recorded inputs. ``on_step`` sees every Step as it is applied
    (``Step.graph`` names its graph). ``capture`` reuses ATen graphs captured before
    (their graphs are rewritten). Raises
    :class:`optimus_lens.frontend.aten_capture.AtenCaptureError`,
    :class:`optimus_lens.core.verify.OriginalRunError` (a graph that does not run on its
    own inputs) and :class:`optimus_lens.core.engine.PatternError`."""
    if pipeline is None:
        from optimus_lens.passes.post_grad import post_grad_pipeline

        pipeline = post_grad_pipeline()
    aten = capture if capture is not None else capture_aten(gm, example_inputs, mode)
    out = PostGradRun(aten)
    for g in aten.graphs:
        engine = Engine(
            g.gm,
            g.example_inputs,
            pipeline,
            RunOptions(verify=verify, record=record, keep_stages=keep_stages, on_error=on_error),
            model_name=model_name,
            capture_info={**g.info(), "mode": mode, "aten_capture_s": round(aten.seconds, 3)},
            graph=g.name,
        )
        for step in engine.steps():
            if on_step is not None:
                on_step(step)
        out.engines[g.name] = engine
        out.traces.append(engine.trace)
    return out


def stage_pipelines(
    stage: str,
    pre: Pipeline,
    post: Pipeline | None = None,
    passes: list[str] | None = None,
    skip: list[str] | None = None,
) -> tuple[Pipeline, Pipeline]:
    """The pre-grad and post-grad pipelines a run of ``stage`` uses, ``passes`` (the
    enabled ones; None: all) and ``skip`` (switched off) read against both: a name is a pass
    of the pre-grad pipeline ``pre`` or of the post-grad one ``post`` (default:
    :func:`optimus_lens.passes.post_grad.post_grad_pipeline`), and a stage's pipeline keeps
    only its own names (``--passes batch_linear,batch_linear_post_grad`` with ``stage="all"``
    runs one pass in each). Raises KeyError for a name neither knows, or one the stage does
    not run (a post-grad pass with ``stage="pre-grad"``)."""
    if post is None:
        from optimus_lens.passes.post_grad import post_grad_pipeline

        post = post_grad_pipeline()
    names = {"pre-grad": pre.names(), "post-grad": post.names()}
    runs = ["pre-grad"] if stage == "pre-grad" else ["post-grad"] if stage == "post-grad" else ["pre-grad", "post-grad"]
    known = [n for s in runs for n in names[s]]
    unknown = [n for n in [*(passes or []), *(skip or [])] if n not in known]
    if unknown:
        other = [n for n in unknown if any(n in names[s] for s in names if s not in runs)]
        hint = f" ({', '.join(other)}: not a pass of --stage {stage})" if other else ""
        raise KeyError(f"unknown pass(es) {', '.join(unknown)}{hint}; known: {', '.join(known)}")

    def select(p: Pipeline) -> Pipeline:
        pool = [q.name for q in p.enabled()] if passes is None else [n for n in p.names() if n in passes]
        keep = [n for n in pool if n not in (skip or [])]
        return p if passes is None and not skip else p.only(keep)

    return select(pre), select(post)


def aten_graphs_of(
    captured_gm: GraphModule, example_inputs: tuple, stage: str, mode: str, pre: Pipeline | None = None
) -> AtenCapture:
    """The ATen graphs a ``stage`` run rewrites, unchanged: those of the captured program
    (``"post-grad"``) or of the program ``pre`` (default: the default pre-grad pipeline)
    rewrote, unverified, on a copy (``"all"``); what ``optimus match`` and ``optimus why``
    look at with ``--stage post-grad|all``. Raises ValueError for ``stage="pre-grad"``."""
    if stage == "pre-grad":
        raise ValueError("the pre-grad stage has no ATen graphs")
    check_stage(stage, mode)
    program = captured_gm
    if stage == "all":
        from optimus_lens.core.engine import copy_graph_module

        if pre is None:
            from optimus_lens.passes import default_pipeline

            pre = default_pipeline()
        program = copy_graph_module(captured_gm)
        Engine(program, example_inputs, pre, RunOptions(verify="off", record=False)).run()
    return capture_aten(program, example_inputs, mode)


def graph_for_node(aten: AtenCapture, node: str) -> tuple[str, str]:
    """(graph name, node name) for a node named ``GRAPH:NODE`` (``backward:mm_3``) or just
    ``NODE``: the one ATen graph holding it; raises KeyError when a bare name is in several
    graphs (the message says how to qualify it) or ``GRAPH`` is not captured. A bare name
    in no graph is looked up in the first (the caller's error then lists its nodes)."""
    graph, _, name = node.rpartition(":")
    if graph:
        aten.graph(graph)
        return graph, name
    holding = [g.name for g in aten.graphs if any(n.name == name for n in g.gm.graph.nodes)]
    if len(holding) > 1:
        raise KeyError(
            f"{name} is in the {' and '.join(holding)} graphs: name one as {holding[0]}:{name} or {holding[1]}:{name}"
        )
    return (holding[0] if holding else aten.graphs[0].name), name
