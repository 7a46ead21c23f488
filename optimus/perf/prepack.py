"""Pre-packed weights for inference: fold the per-call stacking of parameters into constants.

``batch_linear``, ``batch_linear_lhs`` and ``batch_layernorm`` stack or concatenate the
group's parameters in the graph (``stack(W_i).transpose(1, 2)``, ``cat(W_i)``,
``stack(b_i).unsqueeze(1)``, ``stack(gamma_i)``), so the fused graph copies every
member's weights on every call: more time and more memory than the unfused graph. In
inference the parameters do not change between calls, so this transform, run after the
fusions, computes each such value once and makes it a constant of the GraphModule
(a non-persistent buffer read by a ``get_attr`` node), as Inductor's ``freezing`` does
for its constant folding.

What is folded (:func:`find_sites`): a ``torch.stack`` / ``torch.cat`` whose tensor
inputs are all parameters (placeholders whose example input is an ``nn.Parameter``, as
Dynamo lifts them), extended over the chain of layout ops that is its only user
(transpose, unsqueeze, reshape/view, permute, ...). The constant is computed by running
exactly those nodes on the real parameters, so it has the value, shape and strides the
graph would have produced: a transposed stack stays a transposed view of one packed
buffer. The one exception: when every user reads it as a matrix-multiply operand
(``bmm``, ``baddbmm``, ``mm``, ``addmm``, ``matmul``, ``linear``: ops whose output is
freshly allocated whatever their inputs' strides), the constant is stored contiguous,
which BLAS reads faster (2 us of a 52 us ``baddbmm`` on recsys_towers32), and the node's
example value says so.

Only for inference: the constants carry no gradient. :func:`prepack` does nothing when
``training`` is true (then weights are stacked per call and gradients reach the original
parameters).

Stale weights. A constant is right only while its source parameters are unchanged.
The transform remembers each source tensor and its version counter (``Tensor._version``,
bumped by every in-place write: an optimizer step, ``load_state_dict``, ``p.mul_(...)``),
and offers three ways to keep the constants fresh, chosen by ``guard``:

* ``"optimizer"`` (default): a global optimizer step post-hook
  (``torch.optim.optimizer.register_optimizer_step_post_hook``) re-packs, after every
  optimizer step anywhere, the constants of live pre-packed graphs whose sources changed.
  No cost per call. Other writes (``load_state_dict``, manual in-place edits) need a
  call of :func:`refresh` (re-packs only what changed).
* ``"call"``: a forward pre-hook checks on every call that each source placeholder
  receives the very tensor it was packed from, at the same version; on a mismatch it
  re-packs from the tensors passed in (``on_stale="repack"``) or raises
  :class:`StaleWeightsError` (``on_stale="raise"``). Complete, but it costs about 20 us
  per call for 194 source parameters (recsys_towers32, CPU, one thread): 10% of the
  packed graph's 180 us.
* ``None``: nothing; :func:`refresh` and :func:`repack` by hand.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.fx import Graph, GraphModule, Node

from optimus_lens.core.record import recording
from optimus_lens.core.trace import Step, Trace
from optimus_lens.passes.common import is_call

PASS_NAME = PATTERN = "prepack_weights"
ATTR_PREFIX = "_optimus_packed_"

PACK_OPS = ({torch.stack, torch.cat, torch.concat}, set())
#: users for which an operand's strides change neither the values nor the strides of the output
MATMUL_OPS = (
    {torch.bmm, torch.baddbmm, torch.mm, torch.addmm, torch.matmul, torch._C._nn.linear, F.linear},
    {"bmm", "baddbmm", "mm", "addmm", "matmul"},
)
LAYOUT_OPS = (
    {
        torch.transpose,
        torch.unsqueeze,
        torch.squeeze,
        torch.reshape,
        torch.permute,
        torch.flatten,
        torch.t,
        torch.movedim,
        torch.swapaxes,
        torch.Tensor.view,
    },
    {
        "transpose",
        "unsqueeze",
        "squeeze",
        "reshape",
        "view",
        "permute",
        "flatten",
        "t",
        "movedim",
        "contiguous",
        "swapaxes",
    },
)


class StaleWeightsError(RuntimeError):
    """A pre-packed GraphModule was called with parameters other than, or changed since,
    the ones its constants were packed from (raised with ``on_stale="raise"``)."""


@dataclass
class PackedConstant:
    """One folded value: buffer ``attr`` of the GraphModule, made from the placeholders at
    positions ``sources`` by the nodes ``folded`` (the stack/cat first); ``nbytes`` is the
    size of its storage (bytes); ``recipe`` recomputes it from the source tensors."""

    attr: str
    sources: list[int]
    folded: list[str]
    nbytes: int
    recipe: GraphModule


@dataclass
class Prepacked:
    """The constants :func:`prepack` made, and the source tensors and versions the guard compares."""

    constants: list[PackedConstant] = field(default_factory=list)
    packed_from: dict[int, tuple[torch.Tensor, int]] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def bytes_packed(self) -> int:
        return sum(c.nbytes for c in self.constants)


def is_inference(model: torch.nn.Module | None = None, mode: str | None = None) -> bool:
    """Whether weights may be pre-packed: ``mode`` "inference" / "training" decides when
    given; otherwise inference means ``model`` in eval mode or gradients disabled.
    Raises ValueError for another ``mode``."""
    if mode is not None:
        if mode not in ("inference", "training"):
            raise ValueError(f"mode must be 'inference' or 'training', not {mode!r}")
        return mode == "inference"
    return not torch.is_grad_enabled() or (model is not None and not model.training)


def parameter_placeholders(gm: GraphModule, example_inputs: tuple) -> dict[Node, int]:
    """Placeholder -> position, for the placeholders whose example input is an ``nn.Parameter``."""
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return {n: i for i, (n, x) in enumerate(zip(phs, example_inputs)) if isinstance(x, torch.nn.Parameter)}


def _layout_user(node: Node) -> Node | None:
    """The only user of ``node`` if it is a layout op on ``node`` with constant other arguments."""
    if len(node.users) != 1:
        return None
    (u,) = node.users
    if not is_call(u, *LAYOUT_OPS) or not u.args or u.args[0] is not node:
        return None
    if any(i is not node for i in u.all_input_nodes):
        return None
    return u


def find_sites(gm: GraphModule, params: dict[Node, int]) -> list[list[Node]]:
    """Every foldable chain: ``[stack_or_cat, layout_op, ...]`` where the stack/cat reads
    only parameter placeholders (at least one) and each later node is the only user of
    the one before."""
    sites = []
    for n in gm.graph.nodes:
        if not is_call(n, *PACK_OPS) or not n.all_input_nodes:
            continue
        if not all(i in params for i in n.all_input_nodes):
            continue
        chain = [n]
        while (u := _layout_user(chain[-1])) is not None:
            chain.append(u)
        sites.append(chain)
    return sites


def chain_recipe(chain: list[Node], sources: list[Node]) -> GraphModule:
    """A GraphModule computing ``chain[-1]`` from the ``sources`` tensors (in that order)."""
    g = Graph()
    env = {s: g.placeholder(f"w{i}") for i, s in enumerate(sources)}
    for n in chain:
        env[n] = g.node_copy(n, env.__getitem__)
    g.output(env[chain[-1]])
    return GraphModule(torch.nn.Module(), g)


def _stride_blind(node: Node) -> bool:
    """Every user of ``node`` is a matrix multiply (``MATMUL_OPS``): its strides are unobservable."""
    return bool(node.users) and all(is_call(u, *MATMUL_OPS) for u in node.users)


def _meta_like(node: Node, value: torch.Tensor) -> dict:
    """``node``'s example-value meta, re-made with ``value``'s strides where they differ."""
    out = {k: v for k, v in node.meta.items() if k in ("example_value", "val")}
    for k, v in out.items():
        mode = getattr(v, "fake_mode", None)
        if isinstance(v, torch.Tensor) and mode is not None and v.stride() != value.stride():
            out[k] = mode.from_tensor(value)
    return out


def _fold(gm: GraphModule, chain: list[Node], attr: str, value: torch.Tensor) -> Node:
    """The one graph mutation: register ``value`` as buffer ``attr``, read it with a
    get_attr node in place of ``chain[-1]``, and erase the chain."""
    gm.register_buffer(attr, value, persistent=False)
    graph = gm.graph
    with graph.inserting_before(chain[0]):
        const = graph.get_attr(attr)
    const.meta.update(_meta_like(chain[-1], value))
    chain[-1].replace_all_uses_with(const)
    for n in reversed(chain):
        graph.erase_node(n)
    return const


def prepack(
    gm: GraphModule,
    example_inputs: tuple,
    training: bool = False,
    trace: Trace | None = None,
    guard: str | None = "optimizer",
    on_stale: str = "repack",
) -> Prepacked:
    """Fold every site of :func:`find_sites` into a constant of ``gm`` (mutated in place;
    recompiled). ``example_inputs`` are the real tensors of ``gm``'s placeholders (user
    inputs, then lifted parameters, as :func:`optimus_lens.frontend.capture.capture` returns them).

    With ``training`` nothing is folded (an empty :class:`Prepacked`). With ``trace``, one
    Step per folded constant is appended (pass and pattern ``prepack_weights``;
    ``step.info["bytes_packed"]`` its size in bytes). ``guard`` ("optimizer", "call" or
    None) and ``on_stale`` ("repack" or "raise") choose how changed weights are caught
    (:func:`install_guard`). Raises ValueError for another ``guard`` or ``on_stale``.
    """
    if on_stale not in ("repack", "raise"):
        raise ValueError(f"on_stale must be 'repack' or 'raise', not {on_stale!r}")
    if guard not in ("optimizer", "call", None):
        raise ValueError(f"guard must be 'optimizer', 'call' or None, not {guard!r}")
    out = Prepacked()
    if training:
        return out
    t_start = time.perf_counter()
    params = parameter_placeholders(gm, example_inputs)
    taken = {k for k in dir(gm) if k.startswith(ATTR_PREFIX)}
    for chain in find_sites(gm, params):
        t0 = time.perf_counter()
        sources = list(dict.fromkeys(chain[0].all_input_nodes))
        recipe = chain_recipe(chain, sources)
        positions = [params[s] for s in sources]
        with torch.no_grad():
            value = recipe(*(example_inputs[i] for i in positions))
        if _stride_blind(chain[-1]):
            value = value.contiguous()
        attr = f"{ATTR_PREFIX}{len(taken)}"
        taken.add(attr)
        folded = [n.name for n in chain]
        nbytes = value.untyped_storage().nbytes()
        with recording(gm) as rec:
            const = _fold(gm, chain, attr, value)
        out.constants.append(PackedConstant(attr, positions, folded, nbytes, recipe))
        for i in positions:
            out.packed_from[i] = (example_inputs[i], example_inputs[i]._version)
        if trace is not None:
            trace.steps.append(
                Step(
                    index=len(trace.steps) + 1,
                    pass_name=PASS_NAME,
                    pattern=PATTERN,
                    sites=folded,
                    created=[const.name],
                    erased=folded,
                    replaced=dict(rec.replaced),
                    delta=rec.delta(),
                    match_s=0.0,
                    rewrite_s=time.perf_counter() - t0,
                    nodes_after=len(gm.graph.nodes),
                    info={
                        "bytes_packed": nbytes,
                        "constant": attr,
                        "shape": list(value.shape),
                        "sources": [s.name for s in sources],
                    },
                )
            )
    gm.recompile()
    out.seconds = time.perf_counter() - t_start
    gm.optimus_prepacked = out
    if guard and out.constants:
        install_guard(gm, out, guard, on_stale)
    return out


def stale_sources(packed: Prepacked, args: tuple | None = None) -> list[int]:
    """Positions whose argument (``args``; default: the tensors packed from) is not the
    tensor packed from, or was written in place since."""
    if args is None:
        return [i for i, (t, v) in packed.packed_from.items() if t._version != v]
    return [
        i for i, (t, v) in packed.packed_from.items() if i >= len(args) or args[i] is not t or args[i]._version != v
    ]


def repack(gm: GraphModule, args: tuple | None = None, positions: list[int] | None = None) -> int:
    """Recompute ``gm``'s packed constants from ``args`` (tensors for its placeholders;
    default: the tensors they were packed from), all of them or those reading a
    placeholder in ``positions``; the buffers are updated in place (same storage), and
    the guard's reference tensors and versions too. Returns the number of constants
    re-packed. Raises ValueError when ``gm`` was not pre-packed."""
    packed: Prepacked | None = getattr(gm, "optimus_prepacked", None)
    if packed is None:
        raise ValueError(
            "this GraphModule has no pre-packed weights (optimus_lens.perf.prepack.prepack was not run on it)"
        )

    def arg(i: int) -> torch.Tensor:
        return packed.packed_from[i][0] if args is None else args[i]

    todo = set(positions) if positions is not None else None
    n = 0
    with torch.no_grad():
        for c in packed.constants:
            if todo is not None and not todo.intersection(c.sources):
                continue
            getattr(gm, c.attr).copy_(c.recipe(*(arg(i) for i in c.sources)))
            n += 1
            for i in c.sources:
                packed.packed_from[i] = (arg(i), arg(i)._version)
    return n


def refresh(gm: GraphModule) -> int:
    """Re-pack the constants of ``gm`` whose source parameters were written in place since
    they were packed; returns how many were re-packed (0: all fresh)."""
    stale = stale_sources(gm.optimus_prepacked)
    return repack(gm, positions=stale) if stale else 0


_WATCHED: weakref.WeakSet[GraphModule] = weakref.WeakSet()
_OPTIMIZER_HOOK = None


def _after_optimizer_step(optimizer, args, kwargs) -> None:
    for gm in list(_WATCHED):
        refresh(gm)


def install_guard(gm: GraphModule, packed: Prepacked, guard: str = "optimizer", on_stale: str = "repack"):
    """Keep ``gm``'s constants fresh as ``guard`` says (see the module doc): "optimizer"
    watches optimizer steps (returns None), "call" adds the per-call forward pre-hook
    (returns its handle; ``.remove()`` takes it off). Raises ValueError for another guard."""
    global _OPTIMIZER_HOOK
    if guard == "optimizer":
        _WATCHED.add(gm)
        if _OPTIMIZER_HOOK is None:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            _OPTIMIZER_HOOK = register_optimizer_step_post_hook(_after_optimizer_step)
        return None
    if guard != "call":
        raise ValueError(f"guard must be 'optimizer', 'call' or None, not {guard!r}")
    checks = packed.packed_from

    def check(module, args):
        for i, (t, v) in checks.items():
            a = args[i]
            if a is not t or a._version != v:
                stale = stale_sources(packed, args)
                if on_stale == "raise":
                    raise StaleWeightsError(
                        f"{len(stale)} parameter(s) changed since their weights were pre-packed (placeholder "
                        f"positions {stale[:8]}); call optimus_lens.perf.prepack.repack(gm, args) or use on_stale='repack'"
                    )
                repack(module, args, stale)
                return None
        return None

    return gm.register_forward_pre_hook(check)
