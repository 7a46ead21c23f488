"""Packed parameters at run time: the model's own parameters as views into one packed leaf.

A :class:`PackedGroup` makes the packed tensor of one :class:`~optimus_lens.perf.pack.PackGroup`
(the leaf the rewritten graph reads) and turns each of the group's ``nn.Parameter``
objects into a view of its storage (``param.data = view``; the objects stay the same,
so an optimizer built before keeps working). Writes through a parameter (an optimizer
step, ``load_state_dict``, ``p.mul_(2)``) are writes into the packed tensor, so the graph
always reads current values and nothing is ever stale. This is how FSDP keeps its
``FlatParameter`` (``use_orig_params=True``: the original parameters are views into the
flat parameter, their gradients views into its gradient).

Gradients: autograd accumulates the group's gradient into the packed leaf's ``.grad``
(one AccumulateGrad, no unbind). The group keeps one gradient buffer, laid out as the
leaf, whose views are the parameters' ``.grad``; two hooks on the leaf keep it so:

* before the accumulation (a tensor hook on the leaf), the leaf's ``.grad`` is made to
  hold what the parameters' ``.grad`` say: left as the buffer when every parameter's
  ``.grad`` is still its view (accumulation goes on in place, as over micro-batches or
  after ``zero_grad(set_to_none=False)``, which zeroes the views in place); None when
  every one is None (after ``zero_grad(set_to_none=True)``: autograd stores the new
  gradient itself, and it is copied into the buffer after); otherwise the buffer, zeroed
  and holding each parameter's ``.grad`` (a ``.grad`` the user assigned, or one left
  from before packing), zeros for None ones;
* after it (a post-accumulate-grad hook), the leaf's ``.grad`` is the buffer and every
  parameter whose ``.grad`` is not its view of it gets it.

So ``p.grad`` after a backward is exactly what the unpacked model accumulates, and
``clip_grad_norm_``, weight decay and every optimizer read and write the packed
gradient through the views. (With ``create_graph=True`` autograd's own gradient tensor,
history included, becomes the buffer.)

What a group cannot see, and how it is caught (:meth:`PackedGroup.intact`, checked by the
module before every call): a parameter whose ``.data`` was replaced (``p.data = t``,
``model.to(...)``, ``model.half()``) no longer aliases the pack; the group re-links
(:meth:`PackedGroup.link`: a new packed tensor from the parameters' current values) when
the parameters still agree in dtype, device and ``requires_grad``, and otherwise reports
that it cannot, and the module runs the unpacked graph. Not seen at all: hooks on a
packed parameter (``p.register_hook``, ``register_post_accumulate_grad_hook``) never
fire, and ``torch.autograd.grad(loss, p)`` finds ``p`` unused, because the graph reads
the pack, not ``p`` (transform refuses parameters with hooks at transform time; see
docs/training.md).
"""

from __future__ import annotations

from operator import attrgetter, is_

import torch

from optimus_lens.perf.pack import PackGroup

_GRAD = attrgetter("grad")


class PackedGroup:
    """The packed leaf of ``spec`` and the group's parameters (``params``, in stack order)
    as views into it. Built linked (:meth:`link`); ``leaf`` is what the graph reads."""

    def __init__(self, spec: PackGroup, params: list[torch.nn.Parameter]):
        if len(params) != len(spec.members):
            raise ValueError(f"group {spec.name} has {len(spec.members)} members, got {len(params)} parameters")
        self.spec = spec
        self.params = list(params)
        self.leaf: torch.Tensor = torch.empty(0)
        self.ptrs: list[int] = []
        self.requires_grad = spec.requires_grad
        self._gbuf: torch.Tensor | None = None
        self._views: tuple[torch.Tensor, ...] = ()
        self._even = even_spacing(spec.members)
        self._hooked = False
        self.links = 0
        if not self.link():
            raise ValueError(f"group {spec.name}: {self.why_not()}")

    def why_not(self) -> str:
        """Why the parameters cannot share one packed tensor now, or ''."""
        ref = self.params[0]
        for p, v, name in zip(self.params, self.spec.members, self.spec.params):
            if tuple(p.shape) != v.shape:
                return f"{name} has shape {tuple(p.shape)}, packed as {v.shape}"
            if p.dtype != ref.dtype or p.device != ref.device:
                return f"{name} is {p.dtype} on {p.device}, the group's first is {ref.dtype} on {ref.device}"
            if p.requires_grad != ref.requires_grad:
                return f"{name} has requires_grad={p.requires_grad}, the group's first {ref.requires_grad}"
        return ""

    def link(self) -> bool:
        """Pack the parameters' current values into new storage and point every parameter's
        ``.data`` at its view (their ``.grad`` stay as they are; the next backward takes
        them in). The leaf stays the same tensor object across re-links (its ``.data`` is
        replaced), so an optimizer over :meth:`optimus_lens.perf.trainable.TransformedModule.packed_parameters`
        keeps stepping it. False, changing nothing, when :meth:`why_not` has a reason."""
        if self.why_not():
            return False
        self.requires_grad = self.params[0].requires_grad
        fresh = self.spec.allocate([p.detach() for p in self.params])
        if self.links == 0:
            self.leaf = fresh
        else:
            self.leaf.data = fresh.detach()
        self.leaf.requires_grad_(self.requires_grad)
        base = self.leaf.detach()
        for p, v in zip(self.params, self.spec.members):
            p.data = v.of(base)
        self.ptrs = [p.data_ptr() for p in self.params]
        self._gbuf, self._views = None, ()
        self._hook()
        self.links += 1
        return True

    def relink_copy(self) -> None:
        """After ``copy.deepcopy``: the copied leaf carries no autograd hooks and the copied
        parameters are clones; pack them into a new leaf of this group's own."""
        self.links, self._hooked = 0, False
        if not self.link():
            raise ValueError(f"group {self.spec.name}: {self.why_not()}")

    def _hook(self) -> None:
        """The two gradient hooks on the leaf, once per leaf (a leaf that needs no grad gets
        them when it first does)."""
        if self.requires_grad and not self._hooked:
            self.leaf.register_hook(self._before_accumulate)
            self.leaf.register_post_accumulate_grad_hook(self._after_accumulate)
            self._hooked = True

    def intact(self) -> bool:
        """Every parameter still aliases its place in the leaf, with the leaf's ``requires_grad``."""
        rg = self.requires_grad
        for p, ptr in zip(self.params, self.ptrs):
            if p.data_ptr() != ptr or p.requires_grad is not rg:
                return False
        return True

    def repair(self) -> bool:
        """After :meth:`intact` said no: follow a ``requires_grad`` change made to every
        parameter alike, else re-link. False when the parameters can no longer share one
        packed tensor (then the caller runs the unpacked graph)."""
        ptrs_ok = all(p.data_ptr() == ptr for p, ptr in zip(self.params, self.ptrs))
        flags = {p.requires_grad for p in self.params}
        if ptrs_ok and len(flags) == 1:
            self.requires_grad = flags.pop()
            self.leaf.requires_grad_(self.requires_grad)
            self._hook()
            return True
        return self.link()

    # -- gradients --------------------------------------------------------------------

    def _buffer(self) -> torch.Tensor:
        """The group's gradient buffer (the leaf's layout, dtype and device; kept across
        steps, so each parameter's ``.grad`` view is made once)."""
        leaf = self.leaf
        buf = self._gbuf
        if buf is None or buf.dtype != leaf.dtype or buf.device != leaf.device or buf.stride() != leaf.stride():
            buf = torch.empty_strided(leaf.shape, leaf.stride(), dtype=leaf.dtype, device=leaf.device)
            self._gbuf, self._views = buf, self._member_views(buf)
        return buf

    def _before_accumulate(self, grad: torch.Tensor) -> None:
        leaf, params, views = self.leaf, self.params, self._views
        buf = self._gbuf
        if buf is not None and leaf.grad is buf and all(map(is_, map(_GRAD, params), views)):
            return None  # every .grad is its view: accumulate in place
        held = list(map(_GRAD, params))
        if all(g is None for g in held) or (leaf.grad is None and buf is not None and all(map(is_, held, views))):
            # every .grad None (zero_grad(set_to_none=True) on the parameters), or the pack's own
            # .grad set to None while the parameters' are still its views (zero_grad on an
            # optimizer over the packs): autograd stores the new gradient, copied into the buffer after
            leaf.grad = None
            return None
        snap = [None if g is None else g.detach().clone() for g in held]
        buf = self._buffer()
        with torch.no_grad():
            buf.zero_()
            for v, g in zip(self._views, snap):
                if g is not None:
                    v.copy_(g)
        leaf.grad = buf
        return None

    def _after_accumulate(self, leaf: torch.Tensor) -> None:
        g = leaf.grad
        if g is None:
            return
        if g is not self._gbuf:
            if g.requires_grad:  # create_graph=True: keep autograd's tensor and its history
                if g.stride() != leaf.stride():
                    laid = torch.empty_strided(leaf.shape, leaf.stride(), dtype=g.dtype, device=g.device)
                    leaf.grad = g = laid.copy_(g)
                self._gbuf, self._views = g, self._member_views(g)
            else:
                buf = self._buffer()
                with torch.no_grad():
                    buf.copy_(g)
                leaf.grad = buf
        for p, v in zip(self.params, self._views):
            if p.grad is not v:
                p.grad = v

    def _member_views(self, g: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each member's view of ``g`` (laid out as the leaf): one ``as_strided`` + ``unbind``
        when the members are equal and evenly spaced, else one ``as_strided`` each."""
        if self._even is not None:
            shape, stride, offset = self._even
            return g.as_strided(shape, stride, g.storage_offset() + offset).unbind(0)
        return tuple(m.of(g) for m in self.spec.members)


def even_spacing(members) -> tuple | None:
    """``(shape, stride, offset)`` of one strided tensor whose ``unbind(0)`` gives the
    ``members`` views (equal shapes and strides, evenly spaced offsets), or None."""
    first = members[0]
    if len(members) < 2:
        return None
    step = members[1].offset - first.offset
    if step <= 0:
        return None
    for i, m in enumerate(members):
        if m.shape != first.shape or m.stride != first.stride or m.offset != first.offset + i * step:
            return None
    return (len(members), *first.shape), (step, *first.stride), first.offset
