"""``optimus_lens.transform``: a model in, a trainable (or inference) module out.

Builds a :class:`~optimus_lens.perf.trainable.TransformedModule` (its module doc says what a
call does): capture with Dynamo, run the pipeline (verified, gradients too in training),
pack (training) or pre-pack (inference), bind every placeholder to the model's own
parameter, buffer or an input. :func:`compile_packed` is the same module with its graphs
compiled by ``torch.compile`` (``optimus_lens.compile(..., pack=True)``).
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.utils import _pytree as pytree

from optimus_lens.perf.pack import LAYOUTS, pack_graph
from optimus_lens.perf.packed import PackedGroup
from optimus_lens.perf.trainable import (
    MODES,
    Program,
    TransformedModule,
    TransformError,
    distributed_wrapper,
    parameter_refusals,
)


def transform(
    model: nn.Module,
    example_inputs,
    mode: str = "training",
    *,
    pack: bool = True,
    layout: str = "fused",
    passes: list[str] | None = None,
    skip: list[str] | None = None,
    pipeline=None,
    verify: str = "end",
) -> TransformedModule:
    """``model`` with the Optimus pipeline applied, as an ``nn.Module`` to train or serve.

    ``example_inputs``: the positional arguments of one call (a tuple, or one tensor); the
    graph is captured (Dynamo, static shapes) and specialised to their shapes, dtypes,
    devices and strides, and to any non-tensor argument; other calls run the model's own
    forward. ``mode`` "training" (forward and backward; the model is put in ``train()``)
    or "inference" (``eval()``, calls run under ``torch.no_grad``). With ``pack`` (default)
    the parameters each fused group stacks are packed (training:
    :func:`optimus_lens.perf.pack.pack_graph` in ``layout`` "fused" or "members") or
    folded into constants (inference: :func:`optimus_lens.perf.prepack.prepack`, re-packed
    after optimizer steps and ``load_state_dict``). ``passes`` / ``skip`` / ``pipeline`` as
    for :func:`optimus_lens.frontend.run.optimize`; ``verify`` "end" (default) checks the
    pipeline's graph against the captured one (outputs, and gradients in training) before
    anything is packed, "off" skips it.

    The model's parameters stay the module's (``parameters()`` yields the same objects;
    packed ones become views into their pack, see docs/training.md). Raises ValueError for
    a bad ``mode`` / ``layout``, TypeError when ``model`` is not an ``nn.Module``,
    :class:`~optimus_lens.perf.trainable.TransformError` (a DDP / FSDP-wrapped model,
    graph breaks, outputs built outside the graph, a failed verification), and what
    :func:`optimize` raises.
    """
    from optimus_lens.frontend.capture import capture
    from optimus_lens.frontend.run import optimize

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, not {layout!r}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"transform takes an nn.Module, not {type(model).__name__}")
    wrapper = distributed_wrapper(model)
    if wrapper:
        raise TransformError(
            f"the model is wrapped in {wrapper}, whose forward does the collective work: transform the module it "
            "wraps and wrap the result (with pack=False: packed parameters' gradients bypass its hooks)"
        )
    inputs = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    training = mode == "training"
    model.train(training)
    param_names = {id(p): n for n, p in model.named_parameters()}
    buffer_names = {id(b): n for n, b in model.named_buffers()}
    refusals = parameter_refusals(model) if training and pack else {}
    copied = _copy(inputs)
    leaves, in_spec = pytree.tree_flatten((copied, {}))
    leaf_index = {id(x): j for j, x in enumerate(leaves) if isinstance(x, torch.Tensor)}
    saved = {n: b.detach().clone() for n, b in model.named_buffers()}
    devices = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    try:
        with torch.random.fork_rng(devices=devices):
            captured = capture(model, copied, copy_inputs=False)
            if len(captured.graphs) != 1 or captured.breaks or captured.eager:
                raise TransformError(f"transform needs the model as one graph: {captured.summary()}")
            ex = captured.example_inputs
            user = [(i, leaf_index[id(x)]) for i, x in enumerate(ex) if id(x) in leaf_index]
            res = optimize(
                model, captured=captured, passes=passes, skip=skip, pipeline=pipeline, verify=verify, grads=training
            )
            fv = res.trace.final_verify
            if fv is not None and fv.ok is False:
                raise TransformError(f"the transformed graph does not compute what the model does: {fv.message}")
            outs = _output_binding(model, inputs, res.engine.gm, ex, user)
    finally:
        with torch.no_grad():
            for n, b in model.named_buffers():
                if n in saved:
                    b.copy_(saved[n])
    gm = res.engine.gm
    template = [None if any(i == k for k, _ in user) else x for i, x in enumerate(ex)]
    bound = {
        i: ("param", param_names[id(x)]) if id(x) in param_names else ("buffer", buffer_names[id(x)])
        for i, x in enumerate(ex)
        if id(x) in param_names or id(x) in buffer_names
    }
    binding: dict = {
        "flat": all(isinstance(x, torch.Tensor) for x in inputs),
        "in_spec": in_spec,
        "in_meta": [
            (x.shape, x.dtype, x.device, x.stride()) if isinstance(x, torch.Tensor) else x
            for x in pytree.tree_flatten((inputs, {}))[0]
        ],
        **outs,
    }
    programs: dict = {}
    if not training:
        if pack:
            from optimus_lens.perf.prepack import prepack

            binding["prepacked"] = prepack(gm, ex, trace=res.trace)
        programs["graph"] = Program(gm, template, user, bound=bound)
        return TransformedModule(model, mode, res.trace, programs, binding)
    programs["unpacked"] = Program(gm, list(template), user, bound=dict(bound))
    if pack:
        from optimus_lens.core.engine import copy_graph_module

        packed_gm = copy_graph_module(gm)
        refused = {i: refusals[id(x)] for i, x in enumerate(ex) if id(x) in refusals}
        names = {i: param_names[id(x)] for i, x in enumerate(ex) if id(x) in param_names}
        plan = pack_graph(packed_gm, ex, layout, refused, names, res.trace)
        groups = [PackedGroup(g, [ex[i] for i in g.positions]) for g in plan.groups]
        old_user = dict(user)
        slot = {}
        for new, (kind, i) in enumerate(plan.sources):
            slot[new] = (kind, i)
        ptemplate = [groups[i].leaf if kind == "pack" else template[i] for kind, i in plan.sources]
        puser = [(new, old_user[i]) for new, (kind, i) in slot.items() if kind == "input" and i in old_user]
        pbound = {new: bound[i] for new, (kind, i) in slot.items() if kind == "input" and i in bound}
        packs = [(new, groups[i]) for new, (kind, i) in slot.items() if kind == "pack"]
        programs["packed"] = Program(packed_gm, ptemplate, puser, packs, pbound)
        binding.update(plan=plan, groups=groups)
    return TransformedModule(model, mode, res.trace, programs, binding)


def compile_packed(model: nn.Module, example_inputs, passes: list[str] | None = None, layout: str = "fused", **kw):
    """:func:`transform` in training with packed parameters, its graphs then compiled by
    ``torch.compile(graph, **kw)`` (Inductor unless ``backend`` says otherwise; ``mode``
    is torch.compile's). The packs are leaves of the compiled graph, so their gradient
    hooks run as in eager. Returns the :class:`TransformedModule`, with ``optimus_traces``
    (``[module.trace]``) as :func:`optimus_lens.inductor.compile.compile` gives."""
    t = transform(model, example_inputs, "training", pack=True, layout=layout, passes=passes)
    t.compile_graphs(**kw)
    object.__setattr__(t, "optimus_traces", [t.trace])
    return t


def _copy(inputs: tuple) -> tuple:
    try:
        return copy.deepcopy(inputs)
    except Exception as e:  # noqa: BLE001 - say which input cannot be copied
        raise TransformError(f"the example inputs cannot be copied ({type(e).__name__}: {e})") from e


def _output_binding(model: nn.Module, inputs: tuple, gm, ex: tuple, user: list[tuple[int, int]]) -> dict:
    """How the graph's outputs become the model's: the model's output structure and which
    of its leaves the graph's outputs are, from one run of each on copies of the example
    inputs with the same seed. Raises TransformError when they do not line up."""
    with torch.no_grad():
        torch.manual_seed(0)
        out = model(*_copy(inputs))
        args = list(ex)
        fresh = pytree.tree_flatten((_copy(inputs), {}))[0]
        for i, j in user:
            args[i] = fresh[j]
        torch.manual_seed(0)
        g = gm(*args)
    g = tuple(g) if isinstance(g, (tuple, list)) else (g,)
    leaves, spec = pytree.tree_flatten(out)
    slots = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    ok = len(slots) == len(g) and all(
        leaves[i].shape == t.shape
        and leaves[i].dtype == t.dtype
        and (not t.is_floating_point() or torch.allclose(leaves[i], t, rtol=1e-2, atol=1e-3, equal_nan=True))
        for i, t in zip(slots, g)
    )
    if not ok:
        raise TransformError(
            f"the model returns {len(slots)} tensor(s) that are not the captured graph's {len(g)} outputs in order "
            "(its output is built outside the graph); transform supports models whose outputs the graph computes"
        )
    single = spec.is_leaf() and len(g) == 1
    return {
        "out_single": single,
        "out_spec": spec,
        "out_tensor_slots": slots,
        "out_consts": [None if isinstance(x, torch.Tensor) else x for x in leaves],
    }
