"""The stages a bench run times: the captured graph, the graph after each pass of the
pipeline that made a step, and on request each pass alone, upstream's passes and a
hand-fused reference (:func:`build_stages`; the module doc of :mod:`optimus_lens.perf.bench`
lists them), plus the ``pre_grad_fusion_options`` equivalent to our passes
(:func:`upstream_options`).
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule

from optimus_lens.perf.timings import MODES, Stage


def upstream_options(pass_names: list[str]) -> dict:
    """The ``pre_grad_fusion_options`` equivalent to our enabled passes ``pass_names``:
    each name upstream knows (:func:`optimus_lens.inductor.observe.known_pre_grad_passes`), a batch
    fusion with our search options for it (``min_fuse_set_size``,
    ``max_fuse_search_depth``), and for our ``split_cat_cleanup`` upstream's
    ``split_cat_pass`` and ``unbind_stack_pass``, which remove the same identity pairs."""
    from optimus_lens.core.pattern import REGISTRY
    from optimus_lens.inductor.observe import known_pre_grad_passes

    known = set(known_pre_grad_passes())
    opts: dict = {}
    for name in pass_names:
        if name == "split_cat_cleanup":
            opts.setdefault("split_cat_pass", {})
            opts.setdefault("unbind_stack_pass", {})
        elif name in known:
            p = REGISTRY.get(name)
            opts[name] = (
                {
                    "min_fuse_set_size": p.options.min_fuse_set_size,
                    "max_fuse_search_depth": p.options.max_fuse_search_depth,
                }
                if p is not None and p.kind == "batch"
                else {}
            )
    return opts


def _with_meta(gm: GraphModule, inputs: tuple) -> GraphModule:
    """Give nodes upstream created without an example value one, by fake propagation."""
    from optimus_lens.core import meta

    if all(meta.value(n) is not None for n in gm.graph.nodes if n.op not in ("output", "get_attr")):
        return gm
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    FakeTensorProp(gm, FakeTensorMode(allow_non_fake_inputs=True)).propagate(*inputs)
    return gm


def _trainable(inputs: tuple, n_user: int) -> tuple:
    """The reference's lifted weights (after the ``n_user`` user inputs) as leaf tensors that require grad."""
    return tuple(
        x
        if i < n_user or not isinstance(x, torch.Tensor) or not x.is_floating_point()
        else torch.nn.Parameter(x.detach().clone())
        for i, x in enumerate(inputs)
    )


def build_stages(
    spec,
    passes: list[str] | None = None,
    mode: str = "inference",
    alone: bool = False,
    against_upstream: bool = False,
    reference: bool = True,
    inputs: tuple | None = None,
    capture_method: str = "dynamo",
    graph_index: int | None = None,
    final_only: bool = False,
    pipeline=None,
    stage: str = "pre-grad",
    post_pipeline=None,
    device: str | None = None,
) -> tuple[list[Stage], dict]:
    """Capture ``spec`` (a model spec, see :func:`optimus_lens.frontend.run.load_model`, or an nn.Module
    with ``inputs``) in ``mode``, run the pipeline keeping the graph after each pass, and
    return the stages to time plus facts for the result (``unchanged``,
    ``upstream_options``, ``bytes_packed``: the pre-packed constants in inference, the
    packed parameters in training). See the module doc for the stages; with
    ``final_only`` the per-pass stages are left out but the last (the whole pipeline).
    ``pipeline`` replaces the default pipeline (e.g. with a pattern file's pass added by
    :func:`optimus_lens.frontend.patternfile.pipeline_with`). ``stage`` ("pre-grad", "post-grad",
    "all") adds the post-grad stages (:func:`optimus_lens.perf.aten_stages.post_grad_stages`: the
    ATen graphs, captured on ``device``, after each pass of ``post_pipeline``) of the captured
    program (post-grad: the pre-grad stages are left out) or of the one our pre-grad passes
    rewrote (all). Raises ModelSpecError, CaptureError, AtenCaptureError, KeyError
    (unknown pass), ValueError (mode)."""
    from optimus_lens.core.engine import Engine, RunOptions, copy_graph_module
    from optimus_lens.frontend.capture import capture
    from optimus_lens.frontend.run import model_and_inputs, optimize
    from optimus_lens.passes import default_pipeline
    from optimus_lens.perf.prepack import prepack

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    model, inputs, _ = model_and_inputs(spec, inputs)
    model.train(mode == "training")
    for p in model.parameters():
        p.requires_grad_(True)
    if stage == "post-grad":
        from optimus_lens.core.pipeline import Pipeline

        pipeline = Pipeline([])
    res = optimize(
        model,
        tuple(inputs),
        passes=passes,
        verify="off",
        record=False,
        keep_stages=True,
        capture_method=capture_method,
        graph_index=graph_index,
        pipeline=pipeline,
    )
    ins = res.captured.example_inputs
    per_pass: dict[str, int] = {}
    for s in res.trace.steps:
        per_pass[s.pass_name] = per_pass.get(s.pass_name, 0) + 1
    base = res.engine.stages[0][1]
    stages = [Stage("baseline", base, ins, "baseline")]
    stages += [Stage(name, gm, ins, "pass", per_pass[name]) for name, gm in res.engine.stages[1:] if name in per_pass]
    if final_only and len(stages) > 2:
        stages = [stages[0], Stage("pipeline", stages[-1].gm, ins, "pass", len(res.trace.steps))]
    enabled = [name for name, _ in res.engine.stages[1:]]
    facts: dict = {"unchanged": [n for n in enabled if n not in per_pass], "upstream_options": None, "bytes_packed": 0}
    if mode == "inference":
        packed = copy_graph_module(res.engine.gm)
        pk = prepack(packed, ins, guard=None)
        if pk.constants:
            stages.append(Stage("prepack_weights", packed, ins, "prepack", len(pk.constants)))
            facts["bytes_packed"] = pk.bytes_packed
    else:
        from optimus_lens.perf.pack import pack_graph

        packed = copy_graph_module(res.engine.gm)
        names = {id(p): n for n, p in model.named_parameters()}
        plan = pack_graph(packed, ins, names={i: names[id(x)] for i, x in enumerate(ins) if id(x) in names})
        if plan.groups:
            stages.append(Stage("packed", packed, plan.inputs(ins), "prepack", len(plan.groups)))
            facts["bytes_packed"] = plan.bytes_packed
    if alone:
        pipe = default_pipeline()
        for name in per_pass:
            eng = Engine(copy_graph_module(base), ins, pipe.only([name]), RunOptions(verify="off", record=False))
            eng.run()
            stages.append(Stage(f"alone:{name}", eng.gm, ins, "alone", len(eng.trace.steps)))
    up_program = None
    if against_upstream and stage != "post-grad":
        from optimus_lens.inductor.observe import run_upstream

        opts = upstream_options(enabled)
        up = run_upstream(base, ins, opts)
        up_program = _with_meta(up.gm, ins)
        stages.append(Stage("upstream", up_program, ins, "upstream", sum(up.fusions.values())))
        facts["upstream_options"] = opts
    make_ref = getattr(model, "optimus_reference", None)
    if reference and callable(make_ref):
        ref = make_ref()
        ref.train(mode == "training")
        n_user = len(inputs)
        c = capture(ref, tuple(inputs))
        rins = _trainable(c.example_inputs, n_user) if mode == "training" else c.example_inputs
        stages.append(Stage("reference", c.gm, rins, "reference"))
    if stage != "pre-grad":
        from optimus_lens.perf.aten_stages import post_grad_stages

        program = base if stage == "post-grad" else res.engine.gm
        post, pfacts = post_grad_stages(program, ins, mode, post_pipeline, against_upstream, device, up_program)
        stages = post if stage == "post-grad" else stages + post
        facts.update(pfacts)
    return stages, facts
