"""ATen schemas read as plain data, and the probe that resolves a torch-level call to the
ATen overloads it runs: what :mod:`optimus_lens.core.effects` reads an op's effects from.

* :func:`params` / :func:`bind`: a ``torch._C.FunctionSchema``'s arguments (name,
  keyword-only, list, required, ``Tensor(a!)`` written, ``Tensor(a)`` returned as an
  alias) and a call's arguments bound to them, Python varargs for a trailing list
  parameter included (``x.view(2, 3)``).
* :func:`overloads` / :func:`named_overloads`: every overload of an ``OpOverloadPacket``;
  the ATen op a torch function or Tensor method stands for (the JIT's builtin table,
  ``torch.ops.aten.<method>``).
* :func:`probe`: the call run once on fresh FakeTensors laid out as its inputs' example
  values, under a dispatch recorder: which inputs a dispatched overload writes (by
  storage), which the result shares storage with, which it is itself, whether a random
  op ran. Memoised per target and argument signature.
* :func:`arg_signature` / :func:`value_signature` / :func:`value_kind` /
  :func:`shared_inputs`: what that memo and the effects shared between nodes are keyed
  by (inputs' layouts, constants, the kind of the node's own value, storage sharing).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import Node
from torch.utils._python_dispatch import TorchDispatchMode

from optimus_lens.core import meta
from optimus_lens.core.meta import storage_key, storages

NUMBER = (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)


@dataclass(frozen=True)
class Param:
    name: str
    kwarg_only: bool
    is_list: bool
    required: bool
    writes: bool  # Tensor(a!)
    returned: bool  # its alias set is one of a return's: the result may be (a view of) it


_PARAMS: dict[Any, tuple[Param, ...]] = {}


def params(schema: Any) -> tuple[Param, ...]:
    """A schema's arguments as plain data (``schema.arguments`` builds new objects on each
    access), memoised per schema."""
    try:
        key: Any = schema
        got = _PARAMS.get(key)
    except (RuntimeError, TypeError):  # a schema whose default values do not hash (an int[] default)
        key = str(schema)
        got = _PARAMS.get(key)
    if got is None:
        ret = returned_sets(schema)
        got = tuple(
            Param(
                a.name,
                a.kwarg_only,
                isinstance(a.type, torch._C.ListType),
                not a.has_default_value() and not isinstance(a.type, torch._C.OptionalType),
                a.alias_info is not None and a.alias_info.is_write,
                a.alias_info is not None
                and ("*" in ret or bool(set(a.alias_info.before_set) & ret) or "*" in set(a.alias_info.after_set)),
            )
            for a in schema.arguments
        )
        _PARAMS[key] = got
    return got


def bind(schema: Any, args: tuple, kwargs: dict) -> dict[int, Any] | None:
    """Schema argument index -> the value the call passes for it; None when the call does
    not fit this overload (too many positional arguments, an unknown keyword, a missing
    required one). Extra positional values go to a trailing list parameter
    (``x.view(2, 3)``, ``x.permute(1, 0)``)."""
    ps = params(schema)
    pos = [i for i, a in enumerate(ps) if not a.kwarg_only]
    out: dict[int, Any] = {}
    if len(args) > len(pos):
        if not pos or not ps[pos[-1]].is_list:
            return None
        args = (*args[: len(pos) - 1], tuple(args[len(pos) - 1 :]))
    for i, v in zip(pos, args):
        out[i] = v
    if kwargs:
        index = {a.name: i for i, a in enumerate(ps)}
        for k, v in kwargs.items():
            i = index.get(k)
            if i is None or i in out:
                return None
            out[i] = v
    for i, a in enumerate(ps):
        if i not in out and a.required:
            return None
    return out


def returned_sets(schema: Any) -> set:
    sets: set = set()
    for r in schema.returns:
        if r.alias_info is not None:
            sets |= set(r.alias_info.before_set) | set(r.alias_info.after_set)
    return sets


def loose(schema: Any, args: tuple, kwargs: dict) -> dict[int, Any]:
    """Every argument mapped to the parameter at its position or of its name (for a call
    that fits no overload exactly: conservative)."""
    ps = params(schema)
    out = {i: v for i, v in enumerate(args[: len(ps)])}
    if len(args) > len(ps) and ps:
        out[len(ps) - 1] = tuple(args[len(ps) - 1 :])
    index = {a.name: i for i, a in enumerate(ps)}
    for k, v in kwargs.items():
        if k in index:
            out[index[k]] = v
    return out


def overloads(packet: Any) -> list:
    """Every overload of an ``OpOverloadPacket`` (its ``OpOverload`` objects)."""
    out = []
    for o in packet.overloads():
        try:
            out.append(getattr(packet, o))
        except Exception:  # noqa: BLE001 - an overload that cannot be loaded is left out
            continue
    return out


def named_overloads(node: Node) -> list:
    """The overloads of the ATen op a torch function or Tensor method stands for: the
    JIT's builtin table (``torch.relu`` -> ``aten::relu``) or, for a method,
    ``torch.ops.aten``'s op of that name; every overload."""
    if node.op == "call_method":
        qual = f"aten::{node.target}"
    else:
        from torch.jit._builtins import _find_builtin

        try:
            qual = _find_builtin(node.target)
        except Exception:  # noqa: BLE001 - unhashable or odd callables
            qual = None
    if not qual or not qual.startswith("aten::"):
        return []
    packet = getattr(torch.ops.aten, qual[len("aten::") :], None)
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        return []
    return overloads(packet)


# ----------------------------------------------------------------------------- probe


class _Recorder(TorchDispatchMode):
    """Records every ATen overload dispatched and the tensors it writes (by storage)."""

    def __init__(self):
        super().__init__()
        self.written: set = set()
        self.rng = False
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        schema = getattr(func, "_schema", None)
        if schema is not None:
            self.ops.append(str(func))
            if torch.Tag.nondeterministic_seeded in getattr(func, "tags", ()):
                self.rng = True
            ps = params(schema)
            b = bind(schema, tuple(args), dict(kwargs)) or {}
            for i, v in b.items():
                if ps[i].writes:
                    for t in torch.utils._pytree.tree_leaves(v):
                        k = storage_key(t)
                        if k is not None:
                            self.written.add(k)
        return func(*args, **kwargs)


_PROBES: dict = {}  # (op, target, signature) -> (written arg ids, aliased arg ids, identity id, rng, ops) | None
_PROBE_LIMIT = 4096
_PRIVATE_MODE: list = []


_SIGNATURE = "_optimus_signature"  # the node attribute holding (example value, value_signature of it)


def arg_signature(v: Any, slots: dict) -> Any:
    """A hashable description of an argument for the probe's memo: a tensor by its
    metadata and the slot of its node (so a node passed twice stays one tensor)."""
    if isinstance(v, Node):
        ev = meta.value(v)
        slot = slots.setdefault(v, len(slots))
        return ("node", slot, node_signature(v, ev))
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, tuple([arg_signature(x, slots) for x in v]))
    if isinstance(v, dict):
        return ("dict", tuple([(k, arg_signature(x, slots)) for k, x in v.items()]))
    if isinstance(v, slice):
        return ("slice", arg_signature((v.start, v.stop, v.step), slots))
    hash(v)
    return ("const", type(v).__name__, v)


_ATOMIC = {int: "int", float: "float", bool: "bool", str: "str", type(None): "NoneType"}


def call_signature(args: Any, kwargs: Any, slots: dict) -> tuple[Any, Any]:
    """``(arg_signature(args, slots), arg_signature(kwargs, slots))`` of a call, the same
    values, made in one loop each where the arguments are nodes and plain constants (a
    tuple of them, a dict of them: most calls), else by :func:`arg_signature`."""
    out: list = []
    for v in args if type(args) is tuple else ():
        t = type(v)
        if t is Node:
            out.append(("node", slots.setdefault(v, len(slots)), node_signature(v, meta.value(v))))
        elif t in _ATOMIC:
            out.append(("const", _ATOMIC[t], v))
        else:
            slots.clear()
            return arg_signature(args, slots), arg_signature(kwargs, slots)
    if type(args) is not tuple:
        return arg_signature(args, slots), arg_signature(kwargs, slots)
    kw: list = []
    for k, v in kwargs.items():
        t = type(v)
        if t is Node:
            kw.append((k, ("node", slots.setdefault(v, len(slots)), node_signature(v, meta.value(v)))))
        elif t in _ATOMIC:
            kw.append((k, ("const", _ATOMIC[t], v)))
        else:
            slots.clear()
            return arg_signature(args, slots), arg_signature(kwargs, slots)
    return ("tuple", tuple(out)), ("dict", tuple(kw))


def node_signature(node: Node, ev: Any) -> Any:
    """:func:`value_signature` of ``ev``, ``node``'s example value, memoised on the node
    while its value stays the same object (a node is read as an input by each of its
    users' effect queries and as itself by its own). Raises what value_signature raises."""
    hit = node.__dict__.get(_SIGNATURE)
    if hit is None or hit[0] is not ev:
        hit = (ev, value_signature(ev))
        object.__setattr__(node, _SIGNATURE, hit)  # not Node.__setattr__
    return hit[1]


def value_signature(ev: Any) -> Any:
    """A hashable description of an example value: a tensor's sizes, strides, storage
    offset (elements; symbolic ones by their hints), dtype and device; a tuple of them for
    a tuple; a number by its value; anything else by its type. Raises ValueError for a
    symbolic size without hint."""
    rec = meta.layout_record(ev)  # a FakeTensor's static layout, kept on it
    if rec is not None:
        off = ev.storage_offset()
        if type(off) is int:
            return ("t", rec[0], rec[1], off, rec[2], rec[3])
    if isinstance(ev, torch.Tensor):
        if not ev._has_symbolic_sizes_strides:  # the common, static case: plain ints
            off = ev.storage_offset()
            if type(off) is int:
                return ("t", tuple(ev.shape), ev.stride(), off, ev.dtype, meta.device_text(ev.device))
        size, stride, off = tuple(ev.shape), ev.stride(), ev.storage_offset()
        if all(type(x) is int for x in (*size, *stride, off)):
            return ("t", size, stride, off, ev.dtype, str(ev.device))
        return (
            "t",
            tuple(_hint(s) for s in ev.shape),
            tuple(_hint(s) for s in ev.stride()),
            _hint(ev.storage_offset()),
            ev.dtype,
            str(ev.device),
        )
    if isinstance(ev, (list, tuple)):
        return tuple(value_signature(x) for x in ev)
    if isinstance(ev, NUMBER):
        return ("n", _hint(ev))
    return ("v", type(ev).__name__)


def value_kind(v: Any) -> str:
    """What resolving a node's effects (:mod:`optimus_lens.core.effects`) reads of its own
    example value besides its storages, which the answers shared between nodes key
    separately: whether it is a tensor, a number, None, a list or tuple holding a tensor,
    or something else (the branch for a call without tensor inputs). Not its layout: no
    schema binding or probe reads the result's sizes or strides, so an ``unbind`` of 128
    pieces is keyed without reading them."""
    if isinstance(v, torch.Tensor):
        return "tensor"
    if isinstance(v, NUMBER):
        return "number"
    if v is None:
        return "none"
    if isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
        return "tensors"
    return "other"


def holds_storage(v: Any, key: Any) -> bool:
    """``key in storages(v)`` (``key`` not None), without building a set for a tensor."""
    if isinstance(v, torch.Tensor):
        return storage_key(v) == key
    return key in storages(v)


def shared_inputs(value: Any, inputs: Iterable[Node]) -> tuple[int, ...]:
    """The positions in ``inputs`` of the nodes whose example value shares a storage with
    ``value`` (``storages(meta.value(n)) & storages(value)``, compared by key for a tensor)."""
    if isinstance(value, torch.Tensor):  # the common case: one storage key, no sets
        mine = storage_key(value)
        if mine is None:
            return ()
        out = []
        for i, n in enumerate(inputs):
            v = meta.value(n)
            if storage_key(v) == mine if isinstance(v, torch.Tensor) else mine in storages(v):
                out.append(i)
        return tuple(out)
    ks = storages(value)
    if not ks:
        return ()
    return tuple(i for i, n in enumerate(inputs) if storages(meta.value(n)) & ks)


def _hint(x: Any) -> Any:
    if type(x) in (int, float, bool):
        return x
    h = getattr(getattr(x, "node", None), "hint", None)
    if h is None:
        raise ValueError("symbolic size without a hint")
    return h


def _fresh(ev: Any) -> Any:
    """A fresh FakeTensor laid out as ``ev`` (sizes, strides, storage offset, dtype,
    device), in its own storage; a tuple of them for a tuple; a number as its hint."""
    if isinstance(ev, torch.Tensor):
        size = [_hint(s) for s in ev.shape]
        stride = [_hint(s) for s in ev.stride()]
        off = _hint(ev.storage_offset())
        span = off + sum((n - 1) * s for n, s in zip(size, stride) if n > 0) + 1 if all(size) else off
        base = torch.empty(max(span, 1), dtype=ev.dtype, device=ev.device)
        return base.as_strided(size, stride, off)
    if isinstance(ev, (list, tuple)):
        return type(ev)(_fresh(x) for x in ev)
    if isinstance(ev, NUMBER):
        return _hint(ev)
    raise ValueError(f"cannot make a probe value for {type(ev).__name__}")


def _mode_for(node: Node) -> Any:
    vals = [meta.value(i) for i in node.all_input_nodes]
    mode = meta._fake_mode_of(torch.utils._pytree.tree_iter(vals))
    if mode is not None:
        return mode
    if not _PRIVATE_MODE:
        from torch._subclasses.fake_tensor import FakeTensorMode

        _PRIVATE_MODE.append(FakeTensorMode(allow_non_fake_inputs=False))
    return _PRIVATE_MODE[0]


@dataclass(frozen=True)
class Probe:
    """What one probe saw: the input nodes a dispatched overload wrote (by storage), the
    input nodes the result shares storage with, the input the result is itself (or
    None), whether a random op ran, and the overloads dispatched (names)."""

    writes: tuple[Node, ...]
    aliases: tuple[Node, ...]
    identity: Node | None
    rng: bool
    ops: tuple[str, ...]


def probe(node: Node) -> Probe | None:
    """Run ``node``'s target once on fresh FakeTensors laid out as its inputs' example
    values (sizes, strides, storage offset, dtype, device; each in its own storage),
    recording the ATen overloads it dispatches (see :class:`Probe`). Memoised per target
    and argument signature (the tensors' layouts, the constants). None when it cannot run
    (an input without example value, a symbolic size without hint, the op raises). Only
    for calls without global side effects: the caller decides which."""
    slots: dict[Node, int] = {}
    try:
        key = (node.op, node.target, arg_signature(node.args, slots), arg_signature(node.kwargs, slots))
    except (TypeError, ValueError):
        return None
    hit = _PROBES.get(key, False)
    if hit is False:
        hit = _run_probe(node, list(slots))
        if len(_PROBES) < _PROBE_LIMIT:
            _PROBES[key] = hit
    if hit is None:
        return None
    written, aliased, ident, rng, ops = hit
    order = list(slots)
    return Probe(
        tuple(order[i] for i in written),
        tuple(order[i] for i in aliased),
        order[ident] if ident is not None else None,
        rng,
        ops,
    )


def _run_probe(node: Node, inputs: list[Node]) -> tuple | None:
    mode = _mode_for(node)
    try:
        with mode:
            fresh = {n: _fresh(meta.value(n)) for n in inputs}
    except Exception:  # noqa: BLE001 - an input we cannot lay out: no probe
        return None
    args = torch.fx.node.map_arg(node.args, fresh.__getitem__)
    kwargs = torch.fx.node.map_arg(node.kwargs, fresh.__getitem__)
    rec = _Recorder()
    try:
        with torch.no_grad(), mode, rec:
            if node.op == "call_method":
                out = getattr(type(args[0]), node.target)(*args, **kwargs)
            else:
                out = node.target(*args, **kwargs)
    except Exception:  # noqa: BLE001 - the op refuses these values: no probe
        return None
    keys = [storages(fresh[n]) for n in inputs]
    mine = storages(out)
    written = tuple(i for i, k in enumerate(keys) if k & rec.written)
    aliased = tuple(i for i, k in enumerate(keys) if k & mine)
    ident = next((i for i, n in enumerate(inputs) if out is fresh[n]), None)
    return written, aliased, ident, rec.rng, tuple(rec.ops)
