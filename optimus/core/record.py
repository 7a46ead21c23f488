"""Recording: the changes of one step -> the Step's sets and delta.

The recorder listens instead of diffing. Our engine's steps are recorded by a
:class:`RecordingListener` on the :class:`optimus_lens.core.rewriter.Rewriter` every pattern writes
through, so every create / erase / replace / in-place argument change is seen. The
upstream observer (:mod:`optimus_lens.inductor.observe`) runs PyTorch's own passes, which change the
graph directly; there :func:`recording` listens to the GraphModule's node hooks
(:func:`optimus_lens.core.hooks.node_hooks`) and :meth:`Recording.touched` also
takes in every user of a created node (upstream rewrites sometimes assign ``node.args``).
"""

from __future__ import annotations

import functools
import operator
import os
import re
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.fx import Graph, GraphModule, Node
from torch.fx.node import _get_qualified_name

from optimus_lens.core import effects, meta
from optimus_lens.core.hooks import node_hooks
from optimus_lens.core.memo import keep, kept
from optimus_lens.core.rewriter import Listener
from optimus_lens.core.trace import Delta, GraphSnapshot, NodeRecord, source_of

_MODULE_PREFIX = re.compile(r"^L\['[^']*'\]\.?|^L\[\"[^\"]*\"\]\.?")


def target_name(node: Node) -> str:
    """Qualified name of the node's target: ``torch._C._nn.linear``, ``operator.getitem``,
    a method name for call_method, the attribute path for get_attr / call_module."""
    t = node.target
    if node.op == "call_function":
        try:
            return _function_name(t)
        except TypeError:  # an unhashable target
            return _function_name.__wrapped__(t)
    return str(t)


@functools.lru_cache(maxsize=1 << 12)
def _function_name(t: Any) -> str:
    """:func:`target_name` of a call_function target (a function of the target alone)."""
    try:
        return _get_qualified_name(t)
    except Exception:
        return getattr(t, "__name__", str(t))


def _arg(a: Any) -> Any:
    if isinstance(a, Node):
        return {"node": a.name}
    if isinstance(a, (list, tuple)):
        return [_arg(x) for x in a]
    if isinstance(a, dict):
        return {str(k): _arg(v) for k, v in a.items()}
    if isinstance(a, slice):
        return {"slice": [_arg(a.start), _arg(a.stop), _arg(a.step)]}
    if a is None or isinstance(a, (bool, int, float, str)):
        return a
    if isinstance(a, torch.dtype):
        return str(a).replace("torch.", "")
    return repr(a)


def _shape(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return [d if isinstance(d, int) else str(d) for d in v.shape]
    if isinstance(v, (list, tuple)) and v and all(isinstance(x, torch.Tensor) for x in v):
        return [_shape(x) for x in v]
    return None


def _dtype(v: Any) -> str | None:
    if isinstance(v, (list, tuple)) and v:
        v = v[0]
    if isinstance(v, torch.Tensor):
        return _dtype_name(v.dtype)
    return None


@functools.lru_cache(maxsize=64)
def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _device(v: Any) -> str | None:
    if isinstance(v, (list, tuple)) and v:
        v = v[0]
    if isinstance(v, torch.Tensor):
        return meta.device_text(v.device)
    return None


def _value_parts(v: Any) -> tuple[Any, str | None, Any, str | None]:
    """(shape, dtype, stride, device) of an example value as a NodeRecord holds them
    (:func:`_shape`, :func:`_dtype`, :func:`optimus_lens.core.meta.strides`,
    :func:`_device`), read in one go for a tensor with static sizes and strides, the
    common case (every record of a snapshot and of each step's delta reads them)."""
    if isinstance(v, torch.Tensor) and not v._has_symbolic_sizes_strides:
        return list(v.shape), _dtype_name(v.dtype), list(v.stride()), meta.device_text(v.device)
    if (
        isinstance(v, (list, tuple))
        and v
        and all(isinstance(x, torch.Tensor) and not x._has_symbolic_sizes_strides for x in v)
    ):  # the pieces of a split or unbind
        first = v[0]
        shapes, strides = [list(x.shape) for x in v], [list(x.stride()) for x in v]
        return shapes, _dtype_name(first.dtype), strides, meta.device_text(first.device)
    return _shape(v), _dtype(v), meta.strides(v), _device(v)


def module_path(node: Node) -> tuple[str | None, str | None]:
    """(dotted path, class name) of the innermost nn.Module that created ``node``, from
    ``meta["nn_module_stack"]``; (None, None) when the node has none."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None, None
    path, cls = next(reversed(stack.values()))
    try:
        return _module_path(str(path), cls)
    except TypeError:  # an unhashable class entry
        return _module_path.__wrapped__(str(path), cls)


@functools.lru_cache(maxsize=1 << 16)
def _module_path(path: str, cls: Any) -> tuple[str | None, str | None]:
    path = _MODULE_PREFIX.sub("", path)
    path = re.sub(r"\._modules\['([^']*)'\]", r".\1", path)
    name = cls.__name__ if isinstance(cls, type) else str(cls).rsplit(".", 1)[-1].strip("'>")
    return path or None, name


def origins(node: Node) -> list[str] | None:
    """The names of the nodes ``node`` was made from, by ``meta["from_node"]`` (FX's
    provenance, a list of ``NodeSource`` chains that AOTAutograd and graph passes fill):
    the root of every chain, in order, each once; None when the node has none. For a node
    of an ATen graph these are pre-grad (Dynamo) node names."""
    chains = node.meta.get("from_node")
    if not chains:
        return None
    out: dict[str, None] = {}
    todo = list(reversed(chains))
    while todo:
        src = todo.pop()
        parents = getattr(src, "from_node", None)
        if parents:
            todo.extend(reversed(parents))
        else:
            out[str(getattr(src, "name", src))] = None
    return list(out) or None


# --------------------------------------------------------------------------- custom ops


def op_module(target: Any) -> str | None:
    """The module that registers a custom operator ``target`` (an ``OpOverload`` or
    ``OpOverloadPacket`` outside torch's own namespaces): the module of the function
    ``torch.library.custom_op`` decorated, else the module whose file the dispatcher
    names as the op's registration (``torch.library.Library.define``); ``"__main__"`` for
    a script; None for torch's own ops, other targets, or an op whose registration no
    loaded module holds. A rebuild imports it to resolve ``torch.ops.ns.name``."""
    if not isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return None
    return _op_module(target)


@functools.lru_cache(maxsize=1024)
def _op_module(target: Any) -> str | None:
    qualname = target._qualified_op_name if isinstance(target, torch._ops.OpOverloadPacket) else target._schema.name
    ns = qualname.split("::")[0]
    if ns in ("aten", "prim", "prims", "quantized", "profiler", "inductor", "_c10d_functional", "c10d", "higher_order"):
        return None
    from torch._library.custom_ops import OPDEFS

    opdef = OPDEFS.get(qualname)
    if opdef is not None:
        return getattr(opdef._init_fn, "__module__", None)
    try:
        dump = torch._C._dispatch_dump(qualname)
    except RuntimeError:
        return None
    m = re.search(r"registered at (.+?):\d+", dump)
    if not m:
        return None
    file = os.path.realpath(m.group(1))
    if file.startswith(os.path.realpath(os.path.dirname(torch.__file__)) + os.sep):
        return None  # registered by torch itself (its own ops, or a library helper)
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None)
        if f and os.path.realpath(f) == file:
            return name
    return None


# --------------------------------------------------------------------------- program order

#: modules whose plain Python functions are known not to hide side effects (a user's
#: function called in the graph, e.g. through ``allow_in_graph``, may write anything)
_KNOWN_MODULES = ("torch", "operator", "_operator", "math", "builtins", "functools")


def has_side_effects(node: Node, impure: dict | None = None) -> bool:
    """True when ``node``'s place in program order matters beyond its data edges: it writes
    into an input (a mutable schema: ``aten.mul_.Tensor``, a custom op declared with
    ``mutates_args``; ``x.add_()``, ``inplace=True``, ``out=``: :func:`optimus_lens.core.effects.has_side_effects`),
    changes global state (``torch._C._set_grad_enabled``, ``_enter_autocast`` /
    ``_exit_autocast``, an op registered as effectful), draws random numbers, or is a
    call whose effects are unknown (a module call, a plain Python function from outside
    torch). FX's own purity test (``Node.is_impure``, which reads the op's schema) decides
    for ops. Placeholders, ``get_attr`` and the output are not side effects here (the
    rebuilt graph places them first and last anyway). ``impure``: a per-target memo of
    FX's test (the caller's, for one graph's recording), used where FX reads the target
    alone (every target but a higher-order op, whose operands it reads)."""
    if node.op in ("placeholder", "output", "get_attr", "root"):
        return False
    if node.op == "call_function" and node.target is operator.getitem:  # a view of what it indexes:
        return False  # no write, state or random number, and FX calls it pure
    if effects.has_side_effects(node):  # writes, state, random numbers, or unknown (a module call)
        return True
    if node.op != "call_function":
        return False
    if _fx_impure(node, impure):
        return True
    t = node.target
    if isinstance(t, types.FunctionType):
        return (getattr(t, "__module__", None) or "").split(".")[0] not in _KNOWN_MODULES
    return False


def _fx_impure(node: Node, memo: dict | None) -> bool:
    """FX's ``Node.is_impure()`` of a call_function node (False where it raises),
    memoised per target in ``memo`` (when given) for every target but a higher-order op:
    for the others ``torch._library.utils.is_impure`` reads the target alone (its schema,
    effect registration, random tag)."""
    t = node.target
    key = None if memo is None or isinstance(t, torch._ops.HigherOrderOperator) else t
    if key is not None:
        try:
            hit = memo.get(key)
        except TypeError:  # an unhashable target
            key, hit = None, None
        if hit is not None:
            return hit
    try:
        got = bool(node.is_impure())
    except Exception:  # noqa: BLE001 - a target FX cannot judge is judged by the caller
        got = False
    if key is not None:
        memo[key] = got
    return got


class ProgramOrder:
    """Per live graph, for every node the name of the latest node with side effects
    before it in program order (``after``; None before the first), kept so a trace can
    rebuild a graph in an order that computes what the live graph computes
    (:attr:`optimus_lens.core.trace.NodeRecord.after`). ``effect`` caches
    :func:`has_side_effects` per node. :meth:`scan` is O(nodes); a graph with no node
    with side effects is never scanned again (:meth:`changed` is O(1) for it)."""

    def __init__(self) -> None:
        self.after: dict[Node, str | None] = {}
        self.effect: dict[Node, bool] = {}
        self.count = 0  # nodes with side effects, as of the last scan or change
        self.impure: dict = {}  # target -> FX's purity test (see has_side_effects)

    def is_effect(self, n: Node) -> bool:
        hit = self.effect.get(n)
        if hit is None:
            hit = self.effect[n] = has_side_effects(n, self.impure)
        return hit

    def scan(self, graph: Graph) -> list[Node]:
        """Recompute ``after`` for every node of ``graph``; returns the nodes whose value
        changed (or is new)."""
        changed = []
        last: str | None = None
        count = 0
        after = self.after
        for n in graph.nodes:
            if after.get(n, "") != last:
                changed.append(n)
                after[n] = last
            if self.is_effect(n):
                last = n.name
                count += 1
        self.count = count
        return changed

    def changed(self, graph: Graph, created: list[Node], erased: list[Node], touched: list[Node]) -> list[Node]:
        """After a step that created, erased and touched these nodes: the live nodes whose
        ``after`` (or side-effect status) is no longer what the last records said."""
        for n in erased:
            if self.effect.pop(n, False):
                self.count -= 1
            self.after.pop(n, None)
        flipped = []
        for n in touched:
            was = self.effect.pop(n, None)
            now = self.is_effect(n)
            if was is None and now:
                self.count += 1
            elif was is not None and was != now:
                self.count += 1 if now else -1
                flipped.append(n)
        if self.count <= 0:
            for n in created:
                self.after[n] = None
            return flipped
        return flipped + self.scan(graph)


_ORDER = "_optimus_program_order"  # the ProgramOrder kept on a graph (core.memo.keep)


def program_order(graph: Graph) -> ProgramOrder:
    """The :class:`ProgramOrder` kept for ``graph`` (scanned when first asked for)."""
    order = kept(graph, _ORDER)
    if order is None:
        order = keep(graph, _ORDER, ProgramOrder())
        order.scan(graph)
    return order


def node_record(node: Node, order: ProgramOrder | None = None) -> NodeRecord:
    """One live FX node as a plain NodeRecord (see :class:`optimus_lens.core.trace.NodeRecord`);
    ``order`` is its graph's :class:`ProgramOrder` (looked up when not given)."""
    shape, dtype, stride, device = _value_parts(meta.value(node))
    mod, mod_type = module_path(node)
    if order is None:
        order = program_order(node.graph)
    if node not in order.after:
        order.scan(node.graph)
    return NodeRecord(
        name=node.name,
        op=node.op,
        target=target_name(node),
        args=_arg(node.args),
        kwargs=_arg(dict(node.kwargs)) if node.kwargs else {},
        inputs=[n.name for n in node._input_nodes],
        shape=shape,
        dtype=dtype,
        module=mod,
        module_type=mod_type,
        source=source_of(node.meta.get("stack_trace")),
        stride=stride,
        device=device,
        seq_nr=node.meta.get("seq_nr") if isinstance(node.meta.get("seq_nr"), int) else None,
        from_node=origins(node),
        after=order.after.get(node),
        effects=order.is_effect(node),
        target_module=op_module(node.target) if node.op == "call_function" else None,
    )


def snapshot_graph(graph: Graph) -> GraphSnapshot:
    """The whole graph as a GraphSnapshot (O(nodes)); starts keeping ``graph``'s program
    order (:class:`ProgramOrder`) for the deltas of later steps."""
    order = keep(graph, _ORDER, ProgramOrder())
    order.scan(graph)
    return GraphSnapshot(node_record(n, order) for n in graph.nodes)


class Recording:
    """What the hooks saw during one scope: created and erased nodes (by identity, in
    order), the users whose inputs were rewired, and the old->new name map.
    ``erased_inputs`` are the inputs of erased nodes (read before FX clears them) and
    ``rewired_from`` the nodes whose uses were moved away: both lost users."""

    def __init__(self):
        self.created: list[Node] = []
        self.erased: list[Node] = []
        self.rewired: list[Node] = []
        self.replaced: dict[str, str] = {}
        self.erased_inputs: list[Node] = []
        self.rewired_from: list[Node] = []

    def created_alive(self) -> list[Node]:
        gone = {id(n) for n in self.erased}
        return [n for n in self.created if id(n) not in gone]

    def touched(self) -> list[Node]:
        """Live nodes whose record may have changed: created ones, rewired users, and
        every user of a created node (rewrites may point a user at a new node by
        assigning ``node.args`` directly)."""
        seen: dict[int, Node] = {}
        created = self.created_alive()
        for n in [*created, *self.rewired, *(u for c in created for u in c.users)]:
            if not n._erased:
                seen.setdefault(id(n), n)
        return list(seen.values())

    def delta(self) -> Delta:
        """The change as a Delta: erased names (that existed before the scope) and the
        records of every touched live node, and of every live node whose place relative
        to the nodes with side effects changed (:class:`ProgramOrder`: a node moved
        across an in-place write, or a node after a created or erased one)."""
        created_ids = {id(n) for n in self.created}
        removed = [n.name for n in self.erased if id(n) not in created_ids]
        touched = self.touched()
        graph = next((n.graph for n in (*touched, *self.erased)), None)
        order = kept(graph, _ORDER) if graph is not None else None
        if order is not None:
            seen = {id(n) for n in touched}
            created = self.created_alive()
            for n in order.changed(graph, created, self.erased, touched):
                if id(n) not in seen and not n._erased:
                    seen.add(id(n))
                    touched.append(n)
        return Delta(upsert=[node_record(n, order) for n in touched], remove=removed)


class RecordingListener(Listener):
    """Fills a :class:`Recording` from a :class:`optimus_lens.core.rewriter.Rewriter`'s notifications:
    how the engine records its own steps (every change a pattern makes goes through the
    Rewriter, so nothing depends on FX's hooks or on how a pattern rewires). After a
    rollback the Recording is emptied."""

    def __init__(self, rec: Recording):
        self.rec = rec

    def notify_inserted(self, node: Node) -> None:
        self.rec.created.append(node)

    def notify_erased(self, node: Node) -> None:
        self.rec.erased.append(node)
        self.rec.erased_inputs.extend(node._input_nodes)

    def notify_replaced(self, old: Node, new: Node, users: list[Node]) -> None:
        self.rec.rewired.extend(users)
        self.rec.rewired_from.append(old)
        if old.name != new.name:
            self.rec.replaced[old.name] = new.name

    def notify_modified(self, node: Node, old_inputs: list[Node]) -> None:
        self.rec.rewired.append(node)
        self.rec.rewired_from.extend(old_inputs)

    def rolled_back(self) -> None:
        self.rec.__init__()


@contextmanager
def recording(gm: GraphModule) -> Iterator[Recording]:
    """Listen to ``gm``'s node hooks for the duration of the scope.

    Yields a :class:`Recording` that fills as the graph changes. The hooks are removed
    on exit, also when the body raises.
    """
    rec = Recording()

    def on_create(n: Node) -> None:
        rec.created.append(n)

    def on_erase(n: Node) -> None:
        rec.erased.append(n)
        rec.erased_inputs.extend(n.all_input_nodes)

    def on_replace(old: Node, new: str, user: Node) -> None:
        rec.rewired.append(user)
        rec.rewired_from.append(old)
        if old.name != new:
            rec.replaced[old.name] = new

    with node_hooks(gm, on_create, on_erase, on_replace):
        yield rec
