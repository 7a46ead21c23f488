"""The ATen graphs Inductor's post-grad passes see: the forward graph (inference) or the
forward and backward graphs (training) of a captured pre-grad program.

Inductor runs ``post_grad_passes(gm, is_inference)`` (torch/_inductor/fx_passes/post_grad.py)
once per graph AOTAutograd hands it, inside ``compile_fx_inner``, after

1. its pre-grad passes on the Dynamo graph (``compile_fx`` runs them; with an empty
   ``pre_grad_fusion_options`` only the default cleanups),
2. AOTAutograd's functionalization with Inductor's decompositions (``select_decomp_table``),
3. the joint-graph passes and the partitioner (``min_cut_rematerialization_partition``:
   what the backward recomputes and what the forward saves),
4. ``view_to_reshape`` and a FakeTensor propagation (``meta["val"]`` on every node).

The partitioner's choices (what the forward saves, what the backward recomputes) depend on
which inputs are parameters, which AOTAutograd reads from Dynamo's metadata on the
GraphModule; :func:`optimus_lens.core.engine.copy_graph_module` keeps it, so a captured
graph, a copy of it, or the graph our pre-grad passes rewrote all partition as under
``torch.compile``.

:func:`capture_aten` runs exactly that path — ``torch._inductor.compile_fx.compile_fx``
itself — with its ``inner_compile`` replaced by a recorder that repeats step 4 (Inductor's
own ``view_to_reshape`` and ``fake_tensor_prop``), keeps a copy of the graph and returns
it to AOTAutograd as an eagerly run function (no code generation). The program is then
run once for real: forward, and in training a backward with seeded random tangents, so
every graph comes with the real tensors it was called with (the forward's primals; the
backward's saved activations and tangents), and can be run and verified on its own
(forward: its outputs, which include the activations saved for backward; backward: the
gradients). ``tests/test_aten_capture.py`` checks node for node that these are the graphs a
real ``torch.compile(backend="inductor")`` hands its post-grad passes.

Nodes keep AOTAutograd's metas: ``seq_nr`` (the autograd node a forward op and the backward
ops of its gradient share), ``stack_trace``, ``nn_module_stack`` (forward nodes) and
``from_node`` (the pre-grad nodes an ATen node came from).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import GraphModule

from optimus_lens.core.engine import copy_graph_module

MODES = ("inference", "training")
#: the names a run's ATen graphs are recorded under (``Step.graph``, ``Trace.graph``)
FORWARD, BACKWARD = "forward", "backward"
TANGENT_SEED = 1234


class AtenCaptureError(RuntimeError):
    """AOTAutograd (or Inductor's decompositions) could not turn the program into ATen
    graphs, or the program raised when run for its example inputs."""


@dataclass
class AtenGraph:
    """One ATen graph as ``post_grad_passes(gm, is_inference)`` receives it.

    ``name`` is ``"forward"`` or ``"backward"``; ``gm`` the graph (every node with
    ``meta["val"]``, a FakeTensor); ``example_inputs`` the real tensors it was called with
    in the run (copies: the run's own buffers may be written later); ``is_inference`` the
    flag Inductor passes (True only for the forward graph of an inference capture)."""

    name: str
    gm: GraphModule
    example_inputs: tuple
    is_inference: bool

    def info(self) -> dict:
        """Plain data for a Trace: name, node count, inputs, ``is_inference``."""
        return {
            "graph": self.name,
            "nodes": len(self.gm.graph.nodes),
            "inputs": len(self.example_inputs),
            "is_inference": self.is_inference,
        }


@dataclass
class AtenCapture:
    """The ATen graphs of one program: ``forward`` and, in training mode with something
    that requires grad, ``backward``. ``seconds``: wall time of the capture (s)."""

    mode: str
    graphs: list[AtenGraph] = field(default_factory=list)
    seconds: float = 0.0

    def names(self) -> list[str]:
        return [g.name for g in self.graphs]

    def graph(self, name: str) -> AtenGraph:
        """The graph ``name``; KeyError listing the captured ones otherwise."""
        for g in self.graphs:
            if g.name == name:
                return g
        raise KeyError(f"no {name} graph was captured (captured: {', '.join(self.names()) or 'none'})")

    def info(self) -> dict:
        return {"mode": self.mode, "graphs": [g.info() for g in self.graphs], "seconds": round(self.seconds, 3)}


def _copy_input(x: Any) -> Any:
    """A copy of a real input with its strides (so a later write to the original, such as a
    buffer update of the same run, does not change the recorded example)."""
    if not isinstance(x, torch.Tensor):
        return x
    c = x.detach().clone()
    if c.stride() != x.stride() and x.numel():
        try:
            c = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=x.device).copy_(x.detach())
        except RuntimeError:  # overlapping strides (an expanded input): the values are what matter
            pass
    return c


def _tangents(outs: list[torch.Tensor], seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(o.shape, generator=gen, dtype=torch.float32).to(o.dtype).to(o.device) for o in outs]


def _float_leaves(out: Any) -> list[torch.Tensor]:
    leaves = torch.utils._pytree.tree_leaves(out)
    return [o for o in leaves if isinstance(o, torch.Tensor) and o.requires_grad and o.is_floating_point()]


def capture_aten(
    gm: GraphModule,
    example_inputs: tuple,
    mode: str = "inference",
    tangent_seed: int = TANGENT_SEED,
) -> AtenCapture:
    """The ATen graphs of the pre-grad program ``gm`` (a Dynamo graph, as
    :func:`optimus_lens.frontend.capture.capture` returns it, or one our pre-grad passes
    rewrote) on ``example_inputs`` (its real placeholder values: user inputs, then lifted
    parameters and buffers), as Inductor's post-grad passes receive them (see the module
    doc). ``gm`` itself is not changed (AOTAutograd works on a copy).

    ``mode="inference"`` traces under ``torch.no_grad``: one graph, ``forward``, with
    ``is_inference=True``. ``mode="training"`` traces with grad enabled: ``forward`` and,
    when an input requires grad (the parameters, in a model from
    :func:`optimus_lens.frontend.run.load_model`), ``backward``; the backward's tangents are
    seeded random tensors (``tangent_seed``), one per floating-point output that requires
    grad.

    Caches are off for the capture (AOTAutograd's and the FX-graph cache could otherwise
    skip the recorder). Raises ValueError for another ``mode`` and
    :class:`AtenCaptureError` when AOTAutograd cannot trace the program or it raises when
    run (the message names the stage)."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._inductor.compile_fx import compile_fx, fake_tensor_prop
    from torch._inductor.fx_passes.post_grad import view_to_reshape

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    t0 = time.perf_counter()
    out = AtenCapture(mode)
    pending: dict[int, AtenGraph] = {}

    def recorder(graph: GraphModule, fake_inputs, **kwargs) -> Callable:
        backward = bool(kwargs.get("is_backward", False))
        inference = bool(kwargs.get("is_inference", False))
        # what compile_fx_inner does before post_grad_passes (torch/_inductor/compile_fx.py)
        view_to_reshape(graph)
        with torch.no_grad():
            fake_tensor_prop(graph, fake_inputs)
        rec = AtenGraph(BACKWARD if backward else FORWARD, copy_graph_module(graph), (), inference)
        out.graphs.append(rec)
        key = len(out.graphs) - 1
        pending[key] = rec
        run = graph.forward

        def call(*args):
            if key in pending:
                pending.pop(key).example_inputs = tuple(_copy_input(a) for a in args)
            return run(*args)

        return make_boxed_func(call)

    work = copy_graph_module(gm)
    inputs = list(example_inputs)
    training = mode == "training"
    try:
        with (
            functorch_config.patch(enable_autograd_cache=False),
            inductor_config.patch(fx_graph_cache=False, force_disable_caches=True),
        ):
            with torch.enable_grad() if training else torch.no_grad():
                compiled: Any = compile_fx(work, inputs, inner_compile=recorder)  # type: ignore[arg-type]
    except Exception as e:  # noqa: BLE001 - AOTAutograd's failure, said plainly
        raise AtenCaptureError(
            f"AOTAutograd could not trace the program ({mode}): {type(e).__name__}: {_first_line(e)}"
        ) from e
    try:
        with torch.enable_grad() if training else torch.no_grad():
            result = compiled(*inputs)
            if training:
                outs = _float_leaves(result)
                if outs:
                    torch.autograd.backward(outs, _tangents(outs, tangent_seed))
    except Exception as e:  # noqa: BLE001
        raise AtenCaptureError(f"running the ATen graphs ({mode}) raised {type(e).__name__}: {_first_line(e)}") from e
    finally:
        for x in inputs:  # the run's gradients are the capture's business, not the caller's
            if isinstance(x, torch.Tensor) and x.grad is not None and x.requires_grad:
                x.grad = None
    missing = [g.name for g in pending.values()]
    if missing:
        raise AtenCaptureError(f"the {' and '.join(missing)} graph was compiled but never run")
    out.seconds = time.perf_counter() - t0
    return out


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""
