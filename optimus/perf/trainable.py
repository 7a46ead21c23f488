"""A module users can train: the transformed graph run eagerly, with packed parameters.

:func:`transform` captures a model (Dynamo, one graph), runs the Optimus pipeline over it
(verified against the captured graph), then, in training, packs the parameters each fused
group stacks (:mod:`optimus_lens.perf.pack`, :mod:`optimus_lens.perf.packed`) or, in
inference, folds those stacks into constants (:mod:`optimus_lens.perf.prepack`). It
returns a :class:`TransformedModule`: an ``nn.Module`` that runs that graph and holds the
model's own state: ``parameters()``, ``buffers()``, ``named_modules()``,
``state_dict()`` / ``load_state_dict()`` are the model's (the same objects, the same
keys), so an optimizer built from ``model.parameters()`` before or after steps the module.
The run's Trace (pipeline steps, then one ``pack_parameters`` or ``prepack_weights`` step
per group, refusals included) is ``module.trace``.

Per call, in order (docs/training.md has the lifetime rules):

* a parameter or buffer the graph reads that is no longer the object on the model
  (compared by identity: ``model.fc.weight = nn.Parameter(...)``,
  ``load_state_dict(assign=True)``, ``model.to()`` replacing buffers) is picked up; a replaced
  submodule means the graph no longer matches the model's code: the module runs the
  model's own ``forward`` from then on;
* in another mode than captured (``eval()`` on a training transform, ``train()`` on an
  inference one), or with inputs of other shapes, dtypes, devices or strides, or other
  non-tensor arguments than the example's (the graph is specialised to them), the call
  runs the model's own ``forward`` (warned once);
* in training, each packed group checks that its parameters still alias the pack (one
  ``data_ptr`` per parameter) and re-links or falls back to the unpacked graph
  (:meth:`optimus_lens.perf.packed.PackedGroup.repair`).
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.fx import GraphModule
from torch.utils import _pytree as pytree

from optimus_lens.core.trace import Trace
from optimus_lens.perf.packed import PackedGroup

MODES = ("training", "inference")


class TransformError(ValueError):
    """The model cannot be transformed into a module (graph breaks, outputs built outside
    the graph, a failed verification, unsupported inputs)."""


@dataclass
class Program:
    """One graph and what its placeholders read: ``template`` holds the bound values
    (parameters, buffers, constants, packed leaves), ``user`` the (placeholder, input
    leaf) pairs filled per call."""

    gm: GraphModule
    template: list
    user: list[tuple[int, int]]
    packs: list[tuple[int, PackedGroup]] = field(default_factory=list)
    #: placeholder -> ("param" | "buffer", name on the model): what a re-registration re-binds
    bound: dict[int, tuple[str, str]] = field(default_factory=dict)
    run: Callable | None = None  # the callable (the GraphModule, or it compiled)

    def __call__(self, leaves) -> tuple:
        args = list(self.template)
        for i, j in self.user:
            args[i] = leaves[j]
        out = (self.gm if self.run is None else self.run)(*args)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    def refresh_packs(self) -> None:
        for i, g in self.packs:
            self.template[i] = g.leaf


_WATCHED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_HOOKS: list = []


def _on_register(module, name, value):
    if torch.compiler.is_compiling():  # see _on_module_register
        return None
    for t in list(_WATCHED.get(module, ())):
        t._stale = True
    return None


def _on_module_register(module, name, value):
    # Global hooks also run inside a forward that Dynamo traces (``self.layers[:-1]`` builds
    # a ModuleList). Traced, this lookup would guard the compiled frame on the weak table's
    # keys, which fails to build, or recompiles, as soon as a watched module is collected.
    # Modules made while tracing are never watched, so the traced hook does nothing.
    if torch.compiler.is_compiling():
        return None
    for t in list(_WATCHED.get(module, ())):
        t._stale = True
        t._replaced_modules = True
    return None


def _watch(t: TransformedModule, model: nn.Module) -> None:
    if not _HOOKS:
        from torch.nn.modules import module as mm

        _HOOKS.append(mm.register_module_parameter_registration_hook(_on_register))
        _HOOKS.append(mm.register_module_buffer_registration_hook(_on_register))
        _HOOKS.append(mm.register_module_module_registration_hook(_on_module_register))
    for m in model.modules():
        _WATCHED.setdefault(m, weakref.WeakSet()).add(t)


class TransformedModule(nn.Module):
    """``model`` running the transformed graph (see the module doc). Attributes:
    ``trace`` (the run's Trace), ``mode``, ``plan`` (the :class:`~optimus_lens.perf.pack.PackPlan`
    in training, else None), ``groups`` (the live :class:`~optimus_lens.perf.packed.PackedGroup`
    s), ``prepacked`` (inference: :class:`~optimus_lens.perf.prepack.Prepacked`), ``events``
    (what happened at run time: re-links, fallbacks). Other attributes are the model's."""

    def __init__(self, model: nn.Module, mode: str, trace: Trace, programs: dict, binding: dict):
        super().__init__()
        self._parameters = model._parameters
        self._buffers = model._buffers
        self._modules = model._modules
        self._non_persistent_buffers_set = model._non_persistent_buffers_set
        object.__setattr__(self, "_original", model)
        self.training = mode == "training"
        object.__setattr__(self, "mode", mode)
        object.__setattr__(self, "trace", trace)
        object.__setattr__(self, "_programs", programs)
        object.__setattr__(self, "_b", binding)
        object.__setattr__(self, "plan", binding.get("plan"))
        object.__setattr__(self, "groups", binding.get("groups", []))
        object.__setattr__(self, "prepacked", binding.get("prepacked"))
        object.__setattr__(self, "events", [])
        object.__setattr__(self, "_stale", False)
        object.__setattr__(self, "_replaced_modules", False)
        object.__setattr__(self, "_eager_reason", "")
        object.__setattr__(self, "_warned", set())
        object.__setattr__(self, "_unpacked", not binding.get("groups"))
        object.__setattr__(self, "_identity", [])
        self._bind_checks()
        _watch(self, model)

    def _bind_checks(self) -> None:
        """``(the owner's _parameters or _buffers dict, key, object)`` for every tensor a
        graph reads from the model: a call compares them by identity (``model.to()``
        replaces buffers, and parameters too under
        ``torch.__future__.set_overwrite_module_params_on_conversion``, without hooks)."""
        model = self._original
        seen: dict[str, str] = {}
        for prog in self._programs.values():
            seen.update({name: kind for kind, name in prog.bound.values()})
        for g in self.groups:
            seen.update(dict.fromkeys(g.spec.params, "param"))
        checks = []
        for name, kind in seen.items():
            owner_name, _, leaf = name.rpartition(".")
            owner = model.get_submodule(owner_name) if owner_name else model
            table = owner._parameters if kind == "param" else owner._buffers
            checks.append((table, leaf, table.get(leaf)))
        object.__setattr__(self, "_identity", checks)

    def __setstate__(self, state) -> None:
        """A copy (``copy.deepcopy``, ``pickle``) packs its own parameters into leaves of its
        own, with their gradient hooks, and watches its own model for replaced submodules."""
        super().__setstate__(state)
        for g in self.groups:
            g.relink_copy()
        if "packed" in self._programs:
            self._programs["packed"].refresh_packs()
        _watch(self, self._original)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            original = self.__dict__.get("_original")
            if original is None:
                raise
            return getattr(original, name)

    def extra_repr(self) -> str:
        packed = f", packed groups={len(self.groups)}" if self.mode == "training" else ""
        return f"mode={self.mode!r}{packed}, steps={len(self.trace.steps)}"

    # -- the model's state, exactly ------------------------------------------------------

    def state_dict(self, *args, **kwargs):
        """The model's ``state_dict`` (same keys, the parameters' current values)."""
        return self._original.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """The model's ``load_state_dict``: values are copied into the parameters (so into
        the packs); in inference the pre-packed constants are re-packed after it."""
        out = self._original.load_state_dict(state_dict, strict=strict, assign=assign)
        object.__setattr__(self, "_stale", True)
        self.refresh()
        return out

    def _apply(self, fn, recurse: bool = True):
        out = super()._apply(fn, recurse)
        if self.mode == "inference":
            for prog in self._programs.values():
                prog.gm._apply(fn)
        object.__setattr__(self, "_stale", True)
        return out

    def packed_parameters(self):
        """The parameters for an optimizer that steps the packs: the model's parameters in
        order, each packed group's leaf once in place of its members (8 tensors for
        recsys_towers32's 194). For element-wise optimizers (SGD, Adam, AdamW, RMSprop,
        ...) the updates are the same as over ``parameters()``, in one kernel per pack; the
        optimizer's ``state_dict`` is then keyed by packs, not by the model's parameters,
        and per-tensor rules (LAMB's trust ratio, Adafactor's factored moments) see one
        tensor per group. From this call on, a call that cannot run the packed graph (the
        model's own forward for another shape or mode, the unpacked graph) raises
        RuntimeError in grad mode: that optimizer would not see its gradients."""
        object.__setattr__(self, "_packs_handed_out", True)
        member = {id(p): g for g in self.groups for p in g.params}
        done: set[int] = set()
        for p in self.parameters():
            g = member.get(id(p))
            if g is None:
                yield p
            elif id(g) not in done:
                done.add(id(g))
                yield g.leaf

    def _pack_optimizer_guard(self, why: str) -> None:
        if self.__dict__.get("_packs_handed_out") and torch.is_grad_enabled():
            raise RuntimeError(
                f"optimus_lens.transform: {why}, so the packs' gradients would not be updated and an optimizer "
                "over packed_parameters() would step stale ones; build the optimizer over parameters() instead"
            )

    def compile_graphs(self, **torch_compile_kwargs) -> None:
        """Run every graph of the module (packed and unpacked) through
        ``torch.compile(graph, **torch_compile_kwargs)`` from the next call on."""
        for prog in self._programs.values():
            prog.run = torch.compile(prog.gm, **torch_compile_kwargs)

    def refresh(self) -> None:
        """Catch up with the model now (what a call does first): re-bound parameters and
        buffers, re-links, and in inference the pre-packed constants re-packed where their
        parameters changed (:func:`optimus_lens.perf.prepack.refresh`)."""
        if self._stale:
            self._rebind()
        self._check_packs()
        if self.mode == "inference" and self.prepacked is not None and self.prepacked.constants:
            from optimus_lens.perf.prepack import refresh

            refresh(self._programs["graph"].gm)

    # -- calls ---------------------------------------------------------------------------

    def forward(self, *args, **kwargs):
        why = self._eager_reason
        if not why and (self._stale or any(table.get(key) is not obj for table, key, obj in self._identity)):
            self._rebind()
            why = self._eager_reason
        b = self._b
        if not why and self.training != (self.mode == "training"):
            why = f"the module is in {'train' if self.training else 'eval'} mode; it was transformed for {self.mode}"
        leaves = None
        if not why:
            leaves, why = self._leaves(args, kwargs)
        if why:
            return self._eager(why, args, kwargs)
        if self.mode == "inference":
            with torch.no_grad():
                outs = self._programs["graph"](leaves)
        else:
            outs = self._program()(leaves)
        return self._outputs(outs, b)

    def _leaves(self, args, kwargs):
        b = self._b
        if not kwargs and b["flat"] and len(args) == len(b["in_meta"]):
            leaves = args
        else:
            leaves, spec = pytree.tree_flatten((args, kwargs))
            if spec != b["in_spec"]:
                return None, "the call's arguments are not structured as the example inputs"
        for x, meta in zip(leaves, b["in_meta"]):
            if isinstance(meta, tuple):
                if not isinstance(x, torch.Tensor) or (x.shape, x.dtype, x.device, x.stride()) != meta:
                    return None, "an input's shape, dtype, device or strides differ from the example inputs'"
            elif x is not meta and (type(x) is not type(meta) or x != meta):
                return None, "a non-tensor argument differs from the example's (the graph is specialised to it)"
        return leaves, ""

    def _program(self) -> Program:
        if not self._unpacked and distributed_run():
            object.__setattr__(self, "_unpacked", True)
            self._warn(
                f"a process group of {distributed_run()} ranks is initialised: packed parameters' gradients would "
                "bypass DDP/FSDP's per-parameter hooks, so the module runs the unpacked graph"
            )
        if not self._unpacked and not self._check_packs():
            self._pack_optimizer_guard("the module runs the unpacked graph")
            return self._programs["unpacked"]
        if self._unpacked and self.groups:
            self._pack_optimizer_guard("the module runs the unpacked graph")
        return self._programs["packed" if not self._unpacked else "unpacked"]

    def _check_packs(self) -> bool:
        """True while every group is intact or repaired; else switch to the unpacked graph."""
        if self._unpacked or self.mode != "training":
            return not self._unpacked
        broken = [g for g in self.groups if not g.intact()]
        if not broken:
            return True
        for g in broken:
            if g.repair():
                self.events.append(f"re-linked {g.spec.name} ({g.spec.params[0]}, ...)")
            else:
                object.__setattr__(self, "_unpacked", True)
                self._warn(f"packed group {g.spec.name} cannot be kept ({g.why_not()}): running the unpacked graph")
                return False
        self._programs["packed"].refresh_packs()
        return True

    def _eager(self, why: str, args, kwargs):
        if self.training:
            self._pack_optimizer_guard(f"this call runs the model's own forward ({why})")
        self._warn(f"running the model's own forward: {why}")
        original = self._original
        was = original.training
        original.training = self.training
        try:
            return original(*args, **kwargs)
        finally:
            original.training = was

    def _outputs(self, outs: tuple, b: dict):
        if b["out_single"]:
            return outs[0]
        values = list(b["out_consts"])
        for k, i in enumerate(b["out_tensor_slots"]):
            values[i] = outs[k]
        return pytree.tree_unflatten(values, b["out_spec"])

    def _warn(self, text: str) -> None:
        """Record and warn once per distinct reason (a fallback taken on every call is one event)."""
        if text not in self._warned:
            self._warned.add(text)
            self.events.append(text)
            warnings.warn(f"optimus_lens.transform: {text}", stacklevel=3)

    def _rebind(self) -> None:
        """Re-read every bound parameter and buffer from the model by name."""
        object.__setattr__(self, "_stale", False)
        if self._replaced_modules:
            object.__setattr__(
                self,
                "_eager_reason",
                "a submodule was replaced after transform; the graph no longer matches the model's code",
            )
            return
        model = self._original
        for prog in self._programs.values():
            for i, (kind, name) in prog.bound.items():
                try:
                    now = model.get_parameter(name) if kind == "param" else model.get_buffer(name)
                except AttributeError:
                    object.__setattr__(self, "_eager_reason", f"{kind} {name} is no longer on the model")
                    return
                old = prog.template[i]
                if now is not old:
                    if not isinstance(old, torch.Tensor) or now.shape != old.shape or now.dtype != old.dtype:
                        object.__setattr__(
                            self, "_eager_reason", f"{name} was replaced by a tensor of another shape or dtype"
                        )
                        return
                    prog.template[i] = now
        for g in self.groups:
            for k, name in enumerate(g.spec.params):
                now = model.get_parameter(name)
                if now is not g.params[k]:
                    g.params[k] = now
                    g.ptrs[k] = -1  # not linked: the next check re-links the group
        self._check_packs()
        self._bind_checks()


def parameter_refusals(model: nn.Module) -> dict[int, str]:
    """Reasons, by ``id`` of the parameter, that a parameter must not be packed: tied (the
    same object under two names), gradient hooks (its own or a distributed wrapper's, which
    would not fire), a tensor subclass (DTensor: FSDP2, tensor parallel), a view into
    another tensor's storage (FSDP's flat parameters, a user's flat buffer, an earlier
    transform). A model wrapped in DDP or FSDP refuses all of them."""
    out: dict[int, str] = {}
    wrapper = distributed_wrapper(model)
    seen: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if wrapper:
            out[id(p)] = f"the model is wrapped in {wrapper}, whose per-parameter gradient hooks would not fire"
        elif id(p) in seen:
            out[id(p)] = f"tied: the same parameter is {seen[id(p)]} and {name}"
        elif getattr(p, "_backward_hooks", None) or getattr(p, "_post_accumulate_grad_hooks", None):
            out[id(p)] = "has gradient hooks (its own or a distributed wrapper's): they would not fire"
        elif type(p) is not nn.Parameter or type(p.data) is not torch.Tensor:
            out[id(p)] = f"is a {type(p.data).__name__} ({type(p).__name__}), not a plain tensor"
        elif p.untyped_storage().nbytes() != p.numel() * p.element_size() or p.storage_offset() != 0:
            out[id(p)] = "shares its storage with other tensors (a view into a flat buffer or an earlier pack)"
        seen.setdefault(id(p), name)
    return out


def distributed_wrapper(model: nn.Module) -> str:
    """The name of the distributed wrapper ``model`` is or holds (DistributedDataParallel,
    FullyShardedDataParallel, an FSDP2 ``fully_shard`` module), or ''."""
    if not torch.distributed.is_available():
        return ""
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        return "DistributedDataParallel"
    try:
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    except ImportError:  # pragma: no cover - FSDP absent in this build
        return ""
    for m in model.modules():
        if isinstance(m, FullyShardedDataParallel):
            return "FullyShardedDataParallel"
        if isinstance(m, FSDPModule):
            return "FSDP2 (fully_shard)"
    return ""


def distributed_run() -> int:
    """The world size of an initialised process group with more than one rank, else 0."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        n = dist.get_world_size()
        return n if n > 1 else 0
    return 0
