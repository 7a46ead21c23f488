"""GraphSnapshot -> live GraphModule: the inverse of :func:`optimus_lens.core.record.snapshot_graph`.

A trace stores graphs as plain data (:class:`optimus_lens.core.trace.NodeRecord`: op, qualified
target, args with node references, shape, stride, dtype). This module turns one back
into a runnable ``torch.fx.GraphModule`` — for a repro script that needs no user model
code (:mod:`optimus_lens.debug.repro`) and for the Python code of a step's graphs
(:mod:`optimus_lens.debug.codediff`) — and makes random inputs with the recorded metas.

What a record cannot bring back exactly, and how it is read:

* targets are resolved from their qualified names (``torch._C._nn.linear``,
  ``_operator.getitem``, ``torch.ops.aten.view.default``); ``call_module`` nodes (the
  module is not in the trace) raise :class:`RebuildError`;
* arguments were written as JSON: a string naming a dtype (``"float32"``) is read as
  that dtype, ``"device(type='cpu')"`` as a device, ``"torch.contiguous_format"`` and
  friends as the torch object, ``"Ellipsis"`` as ``...``; the index of a ``getitem`` and
  the output's values become tuples again, other lists stay lists;
* ``get_attr`` tensors and placeholder values are random tensors of the recorded shape,
  stride and dtype (:func:`random_inputs`).
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Iterator
from typing import Any

import torch
from torch.fx import Graph, GraphModule, Node

from optimus_lens.core.trace import GraphSnapshot, NodeRecord


class RebuildError(ValueError):
    """A snapshot that cannot be turned back into a runnable graph (unknown target,
    call_module node, placeholder without tensor metadata, a reference to a missing node)."""


# --------------------------------------------------------------------------- targets


def resolve_target(name: str, module: str | None = None) -> Any:
    """The callable a qualified name (as :func:`optimus_lens.core.record.target_name` writes it)
    names: the longest importable module prefix, then attributes. A custom op
    (``torch.ops.ns.name`` or ``torch.ops.ns.name.overload``) exists once the module that
    registers it ran: ``module`` (the record's ``target_module``) is imported first when
    the op is not found (with the current directory on ``sys.path``, as model specs are).
    Raises RebuildError, naming the module to import when a custom op stays unknown."""
    try:
        return _resolve(name)
    except RebuildError:
        if not name.startswith("torch.ops."):
            raise
    op = "::".join(name.split(".")[2:4])
    if module is None:
        raise RebuildError(
            f"cannot resolve target {name!r}: the custom op {op} is not registered, and the trace does not "
            "name the module that registers it; import that module (the one calling torch.library.custom_op "
            "or Library.define for it) before rebuilding"
        ) from None
    why = _import(module)
    _resolve.cache_clear()
    try:
        return _resolve(name)
    except RebuildError:
        raise RebuildError(
            f"cannot resolve target {name!r}: the custom op {op} is registered by module {module!r}; "
            + (f"importing it failed ({why}): make it importable" if why else "importing it did not register it")
            + (
                " (it was the script that ran the model: import its op definitions from a module)"
                if module == "__main__"
                else ""
            )
        ) from None


def _import(module: str) -> str:
    """Import ``module`` with the current directory on ``sys.path``; "" on success, else why not."""
    import os
    import sys

    if module == "__main__":
        return "__main__ is the script that recorded the trace"
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        importlib.import_module(module)
        return ""
    except Exception as e:  # noqa: BLE001 - said in the error
        return f"{type(e).__name__}: {e}"
    finally:
        if added:
            sys.path.remove(cwd)


@functools.lru_cache(maxsize=1024)
def _resolve(name: str) -> Any:
    parts = name.split(".")
    if name.startswith("torch.ops."):
        _register_aten_namespaces()
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            continue
        return obj
    import builtins

    if hasattr(builtins, name):
        return getattr(builtins, name)
    raise RebuildError(f"cannot resolve target {name!r} to a function")


def _register_aten_namespaces() -> None:
    """Register the op namespaces an ATen graph of Inductor's post-grad passes may call
    besides ``aten`` (``torch.ops.prims.*`` from the decompositions, Inductor's own prims),
    which exist only once their modules are imported."""
    import torch._inductor.inductor_prims  # noqa: F401
    import torch._prims  # noqa: F401


_DEVICE = re.compile(r"device\(type='(\w+)'(?:, index=(\d+))?\)")
_TORCH_OBJECTS = ("contiguous_format", "channels_last", "channels_last_3d", "preserve_format", "strided", "sparse_coo")


def _scalar(a: str) -> Any:
    if a == "Ellipsis":
        return ...
    if isinstance(getattr(torch, a, None), torch.dtype):
        return getattr(torch, a)
    m = _DEVICE.fullmatch(a)
    if m:
        return torch.device(m.group(1), int(m.group(2))) if m.group(2) else torch.device(m.group(1))
    if a.startswith("torch.") and a[6:] in _TORCH_OBJECTS:
        return getattr(torch, a[6:])
    return a


def _value(a: Any, nodes: dict[str, Node]) -> Any:
    if isinstance(a, dict):
        if len(a) == 1 and isinstance(a.get("node"), str):
            try:
                return nodes[a["node"]]
            except KeyError:
                raise RebuildError(f"reference to {a['node']!r}, which is not (yet) in the graph") from None
        if len(a) == 1 and isinstance(a.get("slice"), list):
            return slice(*(_value(v, nodes) for v in a["slice"]))
        return {k: _value(v, nodes) for k, v in a.items()}
    if isinstance(a, list):
        return [_value(v, nodes) for v in a]
    if isinstance(a, str):
        return _scalar(a)
    return a


def _args(rec: NodeRecord, nodes: dict[str, Node]) -> tuple[tuple, dict]:
    args = tuple(_value(a, nodes) for a in rec.args)
    kwargs = {k: _value(v, nodes) for k, v in rec.kwargs.items()}
    if (
        rec.op == "call_function"
        and rec.target in ("_operator.getitem", "operator.getitem")
        and len(args) == 2
        and isinstance(args[1], list)
    ):
        args = (args[0], tuple(args[1]))
    if rec.op == "output":
        args = tuple(tuple(a) if isinstance(a, list) else a for a in args)
    return args, kwargs


# --------------------------------------------------------------------------- graphs


def graph_order(snap: GraphSnapshot) -> list[NodeRecord]:
    """The records in an order FX accepts and that computes what the recorded graph
    computed: placeholders first (in snapshot order), then every other node after its
    inputs, depth first in snapshot order (so a node a step created comes just before its
    first user), the output last; and every node kept between the same two nodes with
    side effects as in the live graph (:attr:`NodeRecord.after`, :func:`order_edges`), so
    a read never moves across an in-place write, nor a node into or out of a
    ``no_grad``/autocast region. Raises RebuildError for a reference to a node not in the
    snapshot, or a cycle through data edges. A snapshot whose order marks contradict its
    edges (a trace written by an older recorder) is ordered by its edges alone."""
    extra = order_edges(snap)
    try:
        return _order(snap, extra)
    except RebuildError:
        if not extra:
            raise
        return _order(snap, {})


def order_edges(snap: GraphSnapshot) -> dict[str, list[str]]:
    """name -> the names that must come before it besides its inputs: a node after the
    side-effect node its ``after`` names, and the next side-effect node after every node
    of the stretch before it. Empty when no record has side effects."""
    recs = snap.nodes
    effects = [r for r in recs.values() if r.effects]
    if not effects:
        return {}
    # the chain of side-effect nodes, each after the one its `after` names (snapshot order breaks ties)
    following: dict[str | None, str] = {}
    for r in effects:
        prev = r.after if r.after in recs else None
        while prev in following:  # two claim the same predecessor: chain them in snapshot order
            prev = following[prev]
        following[prev] = r.name
    preceding = {v: k for k, v in following.items()}
    extra: dict[str, list[str]] = {}
    for r in recs.values():
        if r.op in ("placeholder", "output"):
            continue
        prev = r.after if r.after in recs else None
        if r.effects:
            prev = preceding.get(r.name)
        if prev is not None:
            extra.setdefault(r.name, []).append(prev)
        nxt = following.get(prev)
        if nxt is not None and nxt != r.name and not r.effects:
            extra.setdefault(nxt, []).append(r.name)
    return extra


def _order(snap: GraphSnapshot, extra: dict[str, list[str]]) -> list[NodeRecord]:
    recs = snap.nodes
    out: list[NodeRecord] = [r for r in recs.values() if r.op == "placeholder"]
    done = {r.name for r in out}
    active: set[str] = set()

    def before(rec: NodeRecord) -> Iterator[str]:
        yield from rec.inputs
        yield from extra.get(rec.name, ())

    for root in recs.values():
        if root.name in done or root.op == "output":
            continue
        stack = [(root, before(root))]
        active.add(root.name)
        while stack:
            rec, it = stack[-1]
            nxt = next((i for i in it if i not in done), None)
            if nxt is None:
                stack.pop()
                active.discard(rec.name)
                done.add(rec.name)
                out.append(rec)
                continue
            if nxt in active:
                raise RebuildError(f"the snapshot has a cycle through {nxt!r}")
            if nxt not in recs:
                raise RebuildError(f"{rec.name!r} reads {nxt!r}, which is not in the snapshot")
            active.add(nxt)
            stack.append((recs[nxt], before(recs[nxt])))
    out += [r for r in recs.values() if r.op == "output"]
    return out


def graph_module(snap: GraphSnapshot, attrs: dict[str, torch.Tensor] | None = None) -> GraphModule:
    """A GraphModule computing what ``snap`` records, node names kept.

    ``attrs`` gives the tensors of ``get_attr`` nodes by target (default: random ones of
    the recorded metas). Node meta holds no example values; :func:`propagate` adds them.
    Raises RebuildError (see the module docstring)."""
    g = Graph()
    nodes: dict[str, Node] = {}
    root: dict[str, Any] = {}
    for rec in graph_order(snap):
        if rec.op == "call_module":
            raise RebuildError(f"{rec.name!r} calls module {rec.target!r}, which a trace does not hold")
        if rec.op == "get_attr":
            root[rec.target] = (attrs or {}).get(rec.target)
            if root[rec.target] is None:
                root[rec.target] = random_tensor(rec)
        args, kwargs = _args(rec, nodes)
        if rec.op == "output":
            nodes[rec.name] = g.output(args[0] if len(args) == 1 else args)
            continue
        target = resolve_target(rec.target, rec.target_module) if rec.op == "call_function" else rec.target
        n = g.create_node(rec.op, target, args, kwargs, name=rec.name)
        nodes[rec.name] = n
    return GraphModule(root, g, "Rebuilt")


# --------------------------------------------------------------------------- inputs


def random_tensor(rec: NodeRecord, gen: torch.Generator | None = None) -> torch.Tensor:
    """A tensor with ``rec``'s shape, stride and dtype: normal samples for floating
    point, 0 or 1 for integers (safe as indices into any table of 2+ rows), random for
    bool. Raises RebuildError when the record has no single-tensor shape or dtype."""
    shape, dtype = rec.shape, rec.dtype
    if shape is None or dtype is None or any(isinstance(d, (list, str)) for d in shape):
        raise RebuildError(f"{rec.name!r} has no static tensor shape/dtype in the trace")
    dt = getattr(torch, dtype, None)
    if not isinstance(dt, torch.dtype):
        raise RebuildError(f"{rec.name!r} has unknown dtype {dtype!r}")
    if dt.is_floating_point or dt.is_complex:
        data = torch.randn(shape, generator=gen, dtype=dt)
    elif dt == torch.bool:
        data = torch.rand(shape, generator=gen) < 0.5
    else:
        data = torch.randint(0, 2, shape, generator=gen, dtype=dt)
    stride = rec.stride
    if stride is None or any(isinstance(s, (list, str)) for s in stride):
        return data
    out = torch.empty_strided(shape, stride, dtype=dt)
    out.copy_(data)
    return out


def _int_ranges(snap: GraphSnapshot) -> dict:
    """The ranges the graph's ops accept for its integer inputs
    (:func:`optimus_lens.frontend.log_inputs.int_ranges`: embedding indices and offsets,
    gathered and indexed sizes), read from the graph rebuilt with the recorded shapes; none
    when it cannot be rebuilt."""
    from optimus_lens.frontend.log_inputs import int_ranges

    try:
        gm = graph_module(snap)
    except RebuildError:
        return {}
    for n in gm.graph.nodes:
        rec = snap.nodes.get(n.name)
        if rec is None:
            continue
        if isinstance(rec.shape, list) and all(type(d) is int for d in rec.shape):
            n.meta["shape"] = rec.shape
        dt = getattr(torch, rec.dtype, None) if rec.dtype else None
        if isinstance(dt, torch.dtype):
            n.meta["dtype"] = dt
    return int_ranges(gm, {})


def random_inputs(snap: GraphSnapshot, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """One random tensor per placeholder of ``snap`` (graph order), seeded, with the
    recorded shape, stride and dtype (:func:`random_tensor`); an integer input the graph's
    ops bound (an embedding's indices, a bag's offsets, ...) gets values they accept
    (:func:`optimus_lens.frontend.log_inputs.int_values`). For a captured graph the
    placeholders include the lifted parameters, so these are random weights too."""
    from optimus_lens.frontend.log_inputs import int_values

    gen = torch.Generator().manual_seed(seed)
    ranges = _int_ranges(snap)
    out = []
    for r in snap.nodes.values():
        if r.op != "placeholder":
            continue
        t = random_tensor(r, gen)
        rng = ranges.get(r.name)
        if rng is not None and t.dim() >= 1 and (rng.offsets_of is None or t.dim() == 1):
            vals = int_values(t.numel() if rng.offsets_of is None else t.shape[0], t.dtype, rng, gen)
            t.copy_(vals.reshape(t.shape))
        out.append(t)
    return tuple(out)


def propagate(gm: GraphModule, inputs: tuple) -> None:
    """Fill ``meta["example_value"]`` (FakeTensors) of every node by fake propagation
    from ``inputs``, as the captured graph carried them, so patterns can read shapes."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    FakeTensorProp(gm, mode).propagate(*inputs)
    for n in gm.graph.nodes:
        if "val" in n.meta:
            n.meta["example_value"] = n.meta["val"]
