"""Packed parameters for training: one leaf tensor per fused group, read by the fused op directly.

After the batch fusions a fused graph stacks the group's parameters on every call
(``stack(W_i).transpose(1, 2)`` for ``batch_linear``, ``cat(W_i)`` for
``batch_linear_lhs``, ``stack(gamma_i)`` for ``batch_layernorm``), and in training every
backward splits the stack's gradient back into one gradient per parameter. The hand-fused
module never pays either: its leaves *are* the stacked weights. This transform, the
training counterpart of :mod:`optimus_lens.perf.prepack`, rewrites the graph so it reads one
new placeholder per group instead: the *packed* tensor, which holds exactly the value the
stack chain computed (same shape), so the fused op reads it with no copy. The member
placeholders and the stack chain are erased.

What a site is: :func:`optimus_lens.perf.prepack.find_sites` (a ``stack``/``cat`` of
parameter placeholders, extended over the layout ops that are its only user). Where the
members sit in the packed tensor: each member element is given an id, the chain is run on
the ids (:func:`optimus_lens.perf.prepack.chain_recipe`), and the ids' positions in the
result say where each member element is stored. A group is packed only when that is a
one-to-one re-layout and every member is a strided view of the storage (a
:class:`View`), so the model's own parameters can become views into the packed tensor
(:mod:`optimus_lens.perf.packed`). ``layout`` chooses the storage order:

* ``"fused"`` (default): the packed tensor is contiguous in the shape the fused op reads
  (``(k, in, out)`` for ``baddbmm``), as the hand-fused module stores it; a member may
  then be a transposed view (a Linear weight ``(out, in)`` with strides ``(1, out)``), and
  its gradient arrives with no copy;
* ``"members"``: every member keeps its own strides (contiguous weights stay
  contiguous) and the packed tensor is a strided view over them; autograd then copies each
  backward's gradient into that layout (AccumulateGrad's layout contract).

Refusals are facts, not silence: a site that cannot be packed keeps its stack and gets a
Step with ``info["packed"] = False`` and ``info["reason"]`` (a parameter read outside the
group or twice, mixed dtypes, devices or ``requires_grad``, a non-dense member, a chain
that is not a re-layout, or a reason the caller gives per parameter in ``refused``: tied
weights, gradient hooks, distributed wrappers; see :func:`optimus_lens.perf.trainable.transform`).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

import torch
from torch.fx import GraphModule, Node

from optimus_lens.core.record import recording
from optimus_lens.core.trace import Delta, Step, Trace
from optimus_lens.perf.prepack import chain_recipe, find_sites, parameter_placeholders

PASS_NAME = PATTERN = "pack_parameters"
LAYOUTS = ("fused", "members")


@dataclass(frozen=True)
class View:
    """Where a tensor lies in a group's storage: ``shape``, ``stride`` and ``offset``, in
    elements (``torch.as_strided``'s arguments, the offset relative to the storage's start)."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int = 0

    def of(self, base: torch.Tensor) -> torch.Tensor:
        """This view of ``base``'s storage, ``base`` laid out as the group's packed tensor."""
        return base.as_strided(self.shape, self.stride, base.storage_offset() + self.offset)


@dataclass
class PackGroup:
    """One packed group: the placeholder ``name`` of the packed tensor in the rewritten
    graph, the original placeholder ``positions`` of its members (in stack order) and
    their names (``params``), the packed tensor's geometry (``packed``: the shape the
    fused op reads) and each member's (``members``), ``numel`` elements of ``dtype`` on
    ``device`` in all, and the folded chain's node names (``folded``)."""

    name: str
    positions: list[int]
    params: list[str]
    packed: View
    members: list[View]
    numel: int
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool
    folded: list[str] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        """Size of the packed storage (bytes)."""
        return self.numel * torch.empty((), dtype=self.dtype).element_size()

    def allocate(self, members: list[torch.Tensor]) -> torch.Tensor:
        """A new packed leaf tensor (``requires_grad`` as the group) holding the values of
        ``members`` (tensors of the members' shapes, in stack order), on their device and dtype."""
        ref = members[0]
        leaf = torch.empty_strided(self.packed.shape, self.packed.stride, dtype=ref.dtype, device=ref.device)
        base = leaf.detach()
        with torch.no_grad():
            for view, m in zip(self.members, members):
                view.of(base).copy_(m)
        return leaf.requires_grad_(self.requires_grad)


@dataclass
class PackPlan:
    """What :func:`pack_graph` did: the packed ``groups``, the ``refused`` sites (dicts
    ``{"params", "reason", "sites"}``), the storage ``layout``, and where each placeholder
    of the rewritten graph gets its value (``sources``: ``("input", i)``, the i-th example
    input of the graph before, or ``("pack", g)``, group g's packed tensor)."""

    groups: list[PackGroup] = field(default_factory=list)
    refused: list[dict] = field(default_factory=list)
    sources: list[tuple[str, int]] = field(default_factory=list)
    layout: str = "fused"
    seconds: float = 0.0

    @property
    def bytes_packed(self) -> int:
        return sum(g.nbytes for g in self.groups)

    def inputs(self, example_inputs: tuple) -> tuple:
        """Inputs for the rewritten graph from the old graph's ``example_inputs``: each
        packed tensor a fresh leaf ``nn.Parameter`` holding a copy of its members (the
        members themselves are not touched; :mod:`optimus_lens.perf.packed` links them)."""
        packs = [
            torch.nn.Parameter(g.allocate([example_inputs[i] for i in g.positions]), requires_grad=g.requires_grad)
            for g in self.groups
        ]
        return tuple(example_inputs[i] if kind == "input" else packs[i] for kind, i in self.sources)


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


def affine_view(offsets: torch.Tensor) -> View | None:
    """The :class:`View` whose element ``i`` is at ``offsets[i]`` (an int64 tensor of the
    view's shape), or None when no non-negative strides place them so. Size-1 dims get
    contiguous strides."""
    shape = tuple(offsets.shape)
    if offsets.numel() == 0:
        return None
    base = int(offsets.reshape(-1)[0])
    strides = list(contiguous_strides(shape))
    expected = torch.full(shape, base, dtype=torch.int64)
    for d, n in enumerate(shape):
        if n == 1:
            continue
        at = [0] * len(shape)
        at[d] = 1
        s = int(offsets[tuple(at)]) - base
        if s < 0:
            return None
        strides[d] = s
        expected = (
            expected + torch.arange(n, dtype=torch.int64).view([n if i == d else 1 for i in range(len(shape))]) * s
        )
    return View(shape, tuple(strides), base) if torch.equal(expected, offsets) else None


def _offsets(t: torch.Tensor) -> torch.Tensor:
    """Each element's storage offset relative to ``t``'s own (int64, ``t``'s shape)."""
    out = torch.zeros(t.shape, dtype=torch.int64)
    for d, (n, s) in enumerate(zip(t.shape, t.stride())):
        out = out + torch.arange(n, dtype=torch.int64).view([n if i == d else 1 for i in range(t.dim())]) * s
    return out


def _dense(t: torch.Tensor) -> bool:
    """Every element of ``t`` at its own offset and no gaps: the offsets are 0..numel-1."""
    return torch.equal(torch.sort(_offsets(t).reshape(-1)).values, torch.arange(t.numel()))


def geometry(chain: list[Node], sources: list[Node], tensors: list[torch.Tensor], layout: str = "fused"):
    """The packed tensor's :class:`View` and each member's, for the stack chain ``chain``
    over the placeholders ``sources`` (unique, stack order) whose values are ``tensors``;
    or a reason (str) why the members cannot be views of one packed tensor."""
    numels = [t.numel() for t in tensors]
    total = sum(numels)
    if total == 0:
        return "the group's parameters are empty"
    starts = [sum(numels[:i]) for i in range(len(numels))]
    ids = [torch.arange(s, s + n, dtype=torch.int64).view(t.shape) for s, n, t in zip(starts, numels, tensors)]
    try:
        v_ids = chain_recipe(chain, sources)(*ids)
    except Exception as e:  # noqa: BLE001 - a chain that cannot run on ids is not a re-layout
        return f"the stack chain does not run on index tensors ({type(e).__name__}: {e})"
    flat = v_ids.reshape(-1)
    if flat.numel() != total or not torch.equal(torch.sort(flat).values, torch.arange(total)):
        return f"{chain[-1].name} is not a one-to-one re-layout of the stacked parameters"
    if layout == "fused":
        pos = torch.empty(total, dtype=torch.int64)
        pos[flat] = torch.arange(total, dtype=torch.int64)
        packed: View | None = View(tuple(v_ids.shape), contiguous_strides(tuple(v_ids.shape)), 0)
    else:
        pos = torch.cat([s + _offsets(t).reshape(-1) for s, t in zip(starts, tensors)])
        packed = affine_view(pos[v_ids])
        if packed is None:
            return "with layout='members' the value the fused op reads is not a strided view of the members"
    members = []
    for s, n, t in zip(starts, numels, tensors):
        v = affine_view(pos[s : s + n].view(t.shape))
        if v is None:
            return "a member would not be a strided view of the packed tensor"
        members.append(v)
    return packed, members


def _members(stack: Node) -> list:
    tensors = stack.args[0] if stack.args else stack.kwargs.get("tensors", [])
    return list(tensors) if isinstance(tensors, (list, tuple)) else [tensors]


def _name(names: list[str]) -> str:
    """``towers.*.fc1.weight`` for ``towers.0.fc1.weight``, ``towers.1.fc1.weight``, ...:
    the parts that differ become ``*``."""
    split = [n.split(".") for n in names]
    if len({len(s) for s in split}) != 1:
        return f"{names[0]} and {len(names) - 1} more"
    return ".".join(p[0] if len(set(p)) == 1 else "*" for p in zip(*split))


def _refusal(stack: Node, members: list, tensors: list, refused: dict[int, str], pos: dict[Node, int], names) -> str:
    """Why the group of ``stack`` cannot be packed, or ''."""
    seen: set[Node] = set()
    for m in members:
        if m in seen:
            return f"{names[pos[m]]} appears more than once in {stack.name}"
        seen.add(m)
    for m in members:
        if pos[m] in refused:
            return f"{names[pos[m]]}: {refused[pos[m]]}"
        others = [u.name for u in m.users if u is not stack]
        if others:
            return f"{names[pos[m]]} is also read outside this group (by {', '.join(others[:3])})"
    ref = tensors[0]
    for m, t in zip(members, tensors):
        if t.dtype != ref.dtype or t.device != ref.device:
            return (
                f"mixed dtypes or devices ({names[pos[m]]} is {t.dtype} on {t.device}, not {ref.dtype} on {ref.device})"
            )
        if t.requires_grad != ref.requires_grad:
            return f"some parameters require grad and some do not ({names[pos[m]]})"
        if not _dense(t):
            return f"{names[pos[m]]} is not a dense tensor (strides {tuple(t.stride())})"
    return ""


def _fake_like(node: Node, shape, stride, dtype, device, requires_grad: bool):
    mode = getattr(node.meta.get("example_value"), "fake_mode", None)
    if mode is None:
        return None
    real = torch.empty_strided(shape, stride, dtype=dtype, device=device).requires_grad_(requires_grad)
    return mode.from_tensor(real, static_shapes=True)


def pack_graph(
    gm: GraphModule,
    example_inputs: tuple,
    layout: str = "fused",
    refused: dict[int, str] | None = None,
    names: dict[int, str] | None = None,
    trace: Trace | None = None,
) -> PackPlan:
    """Rewrite ``gm`` (in place; recompiled) to read one packed placeholder per parameter
    stack of :func:`find_sites` that can be packed (module doc). ``example_inputs`` are the
    real tensors of ``gm``'s placeholders (user inputs, then lifted parameters, as
    :func:`optimus_lens.frontend.capture.capture` gives them); they are not changed.
    ``refused`` maps placeholder positions to a reason their groups must not be packed,
    ``names`` positions to parameter names (default: the placeholder names). With
    ``trace``, one Step per site is appended (pass and pattern ``pack_parameters``): a
    packed group's with its delta and ``info`` (``packed`` True, ``parameters``, ``shape``,
    ``strides``, ``member_strides``, ``bytes_packed``), a refused one's with an empty delta
    and ``info["reason"]``. Returns the :class:`PackPlan` (its ``sources`` say what the new
    placeholders read). Raises ValueError for another ``layout``."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, not {layout!r}")
    t_start = time.perf_counter()
    refused = dict(refused or {})
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    pos = {n: i for i, n in enumerate(phs)}
    label = {i: (names or {}).get(i, n.name) for i, n in enumerate(phs)}
    params = parameter_placeholders(gm, example_inputs)
    plan = PackPlan(layout=layout)
    group_of: dict[Node, int] = {}
    last = phs[-1] if phs else None
    for chain in find_sites(gm, params):
        t0 = time.perf_counter()
        stack = chain[0]
        members = _members(stack)
        tensors = [example_inputs[pos[m]] for m in members]
        pnames = [label[pos[m]] for m in members]
        sites = [n.name for n in chain]
        reason = _refusal(stack, members, tensors, refused, pos, label)
        geo = reason or geometry(chain, members, tensors, layout)
        if isinstance(geo, str):
            plan.refused.append({"params": pnames, "reason": geo, "sites": sites})
            if trace is not None:
                info = {"packed": False, "reason": geo, "parameters": _name(pnames), "members": pnames}
                trace.steps.append(_step(trace, sites, [], [], {}, Delta(), t0, gm, info))
            continue
        packed, views = geo
        ref = tensors[0]
        parts = [p for p in re.sub(r"\W+", "_", _name(pnames)).split("_") if p]
        gname = "_".join(["packed", *parts])
        taken = {n.target for n in gm.graph.nodes if n.op == "placeholder"} | {n.name for n in gm.graph.nodes}
        gname = next(
            f"{gname}{s}" for s in ["", *(f"_{i}" for i in range(1, len(taken) + 2))] if f"{gname}{s}" not in taken
        )
        with recording(gm) as rec:
            with gm.graph.inserting_after(last):
                ph = gm.graph.placeholder(gname)
            fake = _fake_like(chain[-1], packed.shape, packed.stride, ref.dtype, ref.device, ref.requires_grad)
            if fake is not None:
                ph.meta["example_value"] = fake
            chain[-1].replace_all_uses_with(ph)
            for n in reversed(chain):
                gm.graph.erase_node(n)
            for m in members:
                gm.graph.erase_node(m)
        last = ph
        g = PackGroup(
            ph.name,
            [pos[m] for m in members],
            pnames,
            packed,
            views,
            sum(t.numel() for t in tensors),
            ref.dtype,
            ref.device,
            ref.requires_grad,
            sites,
        )
        group_of[ph] = len(plan.groups)
        plan.groups.append(g)
        if trace is not None:
            info = {
                "packed": True,
                "layout": layout,
                "parameters": _name(pnames),
                "members": pnames,
                "placeholder": ph.name,
                "shape": list(packed.shape),
                "strides": list(packed.stride),
                "member_strides": list(views[0].stride),
                "member_strides_before": list(ref.stride()),
                "bytes_packed": g.nbytes,
            }
            erased = sites + [m.name for m in members]
            trace.steps.append(
                _step(
                    trace, sites + [m.name for m in members], [ph.name], erased, rec.replaced, rec.delta(), t0, gm, info
                )
            )
    gm.recompile()
    plan.sources = [
        ("pack", group_of[n]) if n in group_of else ("input", pos[n]) for n in gm.graph.nodes if n.op == "placeholder"
    ]
    plan.seconds = time.perf_counter() - t_start
    return plan


def _step(trace: Trace, sites, created, erased, replaced, delta, t0: float, gm: GraphModule, info: dict) -> Step:
    return Step(
        index=len(trace.steps) + 1,
        pass_name=PASS_NAME,
        pattern=PATTERN,
        sites=list(sites),
        created=list(created),
        erased=list(erased),
        replaced=dict(replaced),
        delta=delta,
        match_s=0.0,
        rewrite_s=time.perf_counter() - t0,
        nodes_after=len(gm.graph.nodes),
        info=info,
    )
