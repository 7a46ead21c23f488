"""The post-grad stages a bench run times: the ATen graphs of a program (forward, and
backward in training) as captured, after each post-grad pass of ours that made a step,
and with ``against_upstream`` after upstream's ``post_grad_passes`` with no Optimus options
(``post:inductor``: what Inductor does anyway) and with the options equivalent to ours
(``post:upstream``).

Each stage runs the forward graph on its recorded primals and the backward graph on its
recorded saved activations and tangents, as one timed call ("eager": the ATen graphs run
op by op; with ``compile`` each graph under ``torch.compile``, Inductor). The graphs are
captured on the device they are timed on (ATen graphs name devices in their arguments).
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule

from optimus_lens.core.engine import copy_graph_module
from optimus_lens.core.pipeline import Pipeline
from optimus_lens.frontend.aten_capture import AtenCapture, capture_aten
from optimus_lens.frontend.postgrad import run_post_grad
from optimus_lens.perf.timings import Stage

PREFIX = "post:"


def _on(x, device: str):
    if isinstance(x, torch.Tensor) and x.device.type != torch.device(device).type:
        return x.detach().to(device).requires_grad_(x.requires_grad)
    return x


def _stage(label: str, kind: str, graphs: list[tuple[GraphModule, tuple]], steps: int = 0) -> Stage:
    (gm, ins), rest = graphs[0], graphs[1:]
    return Stage(label, gm, ins, kind, steps, after=list(rest))


def capture_on(program: GraphModule, inputs: tuple, mode: str, device: str | None) -> AtenCapture:
    """The ATen graphs of ``program`` captured with it and its inputs on ``device`` (None: where they are)."""
    if device is not None and device != "cpu":
        program = copy_graph_module(program).to(device)
        inputs = tuple(_on(x, device) for x in inputs)
    return capture_aten(program, inputs, mode)


def post_grad_stages(
    program: GraphModule,
    inputs: tuple,
    mode: str = "training",
    pipeline: Pipeline | None = None,
    against_upstream: bool = False,
    device: str | None = None,
    upstream_program: GraphModule | None = None,
) -> tuple[list[Stage], dict]:
    """The post-grad stages of ``program`` (a pre-grad graph: as captured, or rewritten by
    our pre-grad passes) on ``inputs`` in ``mode``, captured on ``device``, and facts for the
    result (``post_unchanged``: enabled post-grad passes that made no step in any graph;
    ``post_upstream_options``). ``pipeline``: the post-grad pipeline (default:
    :func:`optimus_lens.passes.post_grad.post_grad_pipeline`). With ``against_upstream``,
    ``post:inductor`` and ``post:upstream`` run upstream's ``post_grad_passes`` on the ATen
    graphs of ``upstream_program`` (the program upstream's pre-grad passes rewrote; default
    ``program``). Raises AtenCaptureError and what upstream raises."""
    aten = capture_on(program, inputs, mode, device)
    names = [g.name for g in aten.graphs]
    upstream: list[Stage] = []
    facts: dict = {"post_unchanged": [], "post_upstream_options": None}
    if against_upstream:  # before ours: our passes rewrite the captured graphs in place
        from optimus_lens.inductor.observe_post import default_post_grad_options, run_post_grad_upstream

        up_aten = aten if upstream_program is None else capture_on(upstream_program, inputs, mode, device)
        opts = default_post_grad_options()
        for label, kind, o in (("inductor", "post-inductor", {}), ("upstream", "post-upstream", opts)):
            graphs = [(run_post_grad_upstream(g, o), g.example_inputs) for g in up_aten.graphs]
            upstream.append(_stage(f"{PREFIX}{label}", kind, graphs))
        facts["post_upstream_options"] = opts
    post = run_post_grad(program, inputs, mode, pipeline, verify="off", record=False, keep_stages=True, capture=aten)
    engines = [post.engines[n] for n in names]
    steps: dict[str, int] = {}
    for e in engines:
        for s in e.trace.steps:
            steps[s.pass_name] = steps.get(s.pass_name, 0) + 1
    io = {g.name: g.example_inputs for g in aten.graphs}
    stages = [_stage(f"{PREFIX}baseline", "post-baseline", [(e.stages[0][1], io[n]) for e, n in zip(engines, names)])]
    enabled = [name for name, _ in engines[0].stages[1:]]
    for k, name in enumerate(enabled, start=1):
        if name in steps:
            graphs = [(e.stages[k][1], io[n]) for e, n in zip(engines, names)]
            stages.append(_stage(f"{PREFIX}{name}", "post-pass", graphs, steps[name]))
    facts["post_unchanged"] = [n for n in enabled if n not in steps]
    return stages + upstream, facts
