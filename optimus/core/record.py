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
import re
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.fx import Graph, GraphModule, Node
from torch.fx.node import _get_qualified_name

from optimus_lens.core import effects, meta
from optimus_lens.core.aliasing import known_effectful
from optimus_lens.core.hooks import node_hooks
from optimus_lens.core.memo import keep, kept
from optimus_lens.core.op_home import op_module
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
    """One argument of a node as plain data: a node as ``{"node": name}``, lists and
    tuples element by element, a dict's keys as text, a slice as ``{"slice": [...]}``,
    a dtype by name, any other value its ``repr``. The exact types of most arguments
    (nodes, ints, floats, strings, None, tuples) are answered before the ``isinstance``
    chain, which answers them the same way: one dict lookup instead of up to five tests."""
    kind = _EXACT.get(type(a))
    if kind is _PLAIN:
        return a
    if kind is Node:
        return _node_ref(a.name)
    if kind is list:
        return [_arg(x) for x in a]
    if isinstance(a, Node):
        return _node_ref(a.name)
    if isinstance(a, (list, tuple)):
        return [_arg(x) for x in a]
    if isinstance(a, dict):
        return {str(k): _arg(v) for k, v in a.items()}
    if isinstance(a, slice):
        return {"slice": [_arg(a.start), _arg(a.stop), _arg(a.step)]}
    if a is None or isinstance(a, (bool, int, float, str)):
        return a
    if isinstance(a, torch.dtype):
        return _dtype_name(a)
    return repr(a)


_PLAIN = object()  # an argument written as it is
#: ``{"node": name}`` by name, one object for every record that names the node (records are
#: never changed in place, see :class:`_Shared`); emptied at 2**18 names
_REFS: dict[str, dict[str, str]] = {}


def _node_ref(name: str) -> dict[str, str]:
    ref = _REFS.get(name)
    if ref is None:
        if len(_REFS) >= 1 << 18:
            _REFS.clear()
        ref = _REFS[name] = {"node": name}
    return ref


#: exact argument types :func:`_arg` answers first (a subclass takes the isinstance chain)
_EXACT: dict[type, Any] = dict.fromkeys((int, float, bool, str, type(None)), _PLAIN)
_EXACT.update({Node: Node, list: list, tuple: list})


def _shape(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return [d if isinstance(d, int) else str(d) for d in v.shape]
    if isinstance(v, (list, tuple)) and v and all(isinstance(x, torch.Tensor) for x in v):
        return [_shape(x) for x in v]
    return None


def _dtype(v: Any) -> str | None:
    v = v[0] if isinstance(v, (list, tuple)) and v else v
    return _dtype_name(v.dtype) if isinstance(v, torch.Tensor) else None


@functools.lru_cache(maxsize=64)
def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _device(v: Any) -> str | None:
    v = v[0] if isinstance(v, (list, tuple)) and v else v
    return meta.device_text(v.device) if isinstance(v, torch.Tensor) else None


def _value_parts(v: Any) -> tuple[Any, str | None, Any, str | None]:
    """(shape, dtype, stride, device) of an example value as a NodeRecord holds them
    (:func:`_shape`, :func:`_dtype`, :func:`optimus_lens.core.meta.strides`,
    :func:`_device`), read in one go for a tensor with static sizes and strides, the
    common case (every record of a snapshot and of each step's delta reads them)."""
    rec = meta.layout_record(v)  # a FakeTensor's, kept on it (one unbind's pieces share one)
    if rec is not None:
        return _LISTS[rec[0]], _TEXTS[rec[2]], _LISTS[rec[1]], rec[3]
    if isinstance(v, torch.Tensor) and not v._has_symbolic_sizes_strides:
        return _LISTS[v.shape], _TEXTS[v.dtype], _LISTS[v.stride()], _TEXTS[v.device]
    if isinstance(v, (list, tuple)) and v and all(isinstance(x, torch.Tensor) for x in v):  # split, unbind
        recs = [meta.layout_record(x) or _static_parts(x) for x in v]
        if all(recs):
            return [_LISTS[r[0]] for r in recs], _TEXTS[recs[0][2]], [_LISTS[r[1]] for r in recs], recs[0][3]
    return _shape(v), _dtype(v), meta.strides(v), _device(v)


def _static_parts(x: torch.Tensor) -> tuple | None:
    """(shape, stride, dtype, device text) of a tensor with static sizes, as a layout record has them."""
    return None if x._has_symbolic_sizes_strides else (tuple(x.shape), x.stride(), x.dtype, _TEXTS[x.device])


class _Shared(dict):
    """``key -> make(key)``, made once and shared by every record that holds it (records are
    never changed in place: :meth:`optimus_lens.core.trace.GraphSnapshot.copy`). Emptied at
    4096 entries; a graph has a handful of shapes, dtypes and devices, so it stays small."""

    def __init__(self, make: Callable[[Any], Any]):
        super().__init__()
        self.make = make

    def __missing__(self, key: Any) -> Any:
        if len(self) >= 4096:
            self.clear()
        got = self[key] = self.make(key)
        return got


#: shape or stride tuple (``torch.Size``, ``Tensor.stride()``: ints) -> its list, one per
#: shape (the 21k-node towers graph has 11): a record adds no list of its own for the garbage
#: collector to traverse (the first collection after a snapshot visits every container it made)
_LISTS = _Shared(list)
#: dtype -> :func:`_dtype_name`, device -> :func:`optimus_lens.core.meta.device_text`: one
#: dict lookup a record instead of two cached calls
_TEXTS = _Shared(lambda x: _dtype_name(x) if isinstance(x, torch.dtype) else meta.device_text(x))


def module_path(node: Node) -> tuple[str | None, str | None]:
    """(dotted path, class name) of the innermost nn.Module that created ``node``, from
    ``meta["nn_module_stack"]``; (None, None) when the node has none."""
    return _module_of(node.meta.get("nn_module_stack"))


def _module_of(stack: Any) -> tuple[str | None, str | None]:
    """:func:`module_path` of an ``nn_module_stack`` (its innermost entry, a (path, class)
    pair), memoised per entry: a rewrite's nodes share their site's entries (the Rewriter
    carries the stack over), and the entry is a tuple, so equal entries give equal answers."""
    if not stack:
        return None, None
    entry = next(reversed(stack.values()))
    try:
        return _entry_module(entry)
    except TypeError:  # an unhashable entry (a list, an unhashable class)
        return _entry_module.__wrapped__(entry)


@functools.lru_cache(maxsize=1 << 16)
def _entry_module(entry: Any) -> tuple[str | None, str | None]:
    path, cls = entry
    return _module_path(str(path), cls)


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
    what the target alone says (FX's test, a Python function from outside torch; the
    caller's, for one graph's recording), used for every target but a higher-order op,
    whose operands FX reads."""
    if node.op in ("placeholder", "output", "get_attr", "root"):
        return False
    if node.op == "call_function" and node.target is operator.getitem:  # a view of what it indexes:
        return False  # no write, state or random number, and FX calls it pure
    known = known_effectful(node.graph, node)  # the graph's effect analysis, where it has the node
    if known or known is None and effects.has_side_effects(node):  # writes, state, random numbers, unknown
        return True
    if node.op != "call_function":
        return False
    return _target_impure(node, impure)


def _target_impure(node: Node, memo: dict | None) -> bool:
    """Whether a call_function node is a side effect by its target alone: FX's
    ``Node.is_impure()`` (False where it raises), or a plain Python function from outside
    the modules known not to hide effects (:data:`_KNOWN_MODULES`). Memoised per target
    in ``memo`` (when given) for every target but a higher-order op: for the others
    ``torch._library.utils.is_impure`` reads the target alone (its schema, effect
    registration, random tag), and so does the module test."""
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
    if not got and isinstance(t, types.FunctionType):
        got = (getattr(t, "__module__", None) or "").split(".")[0] not in _KNOWN_MODULES
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
        self.impure: dict = {}  # target -> what the target alone says (see has_side_effects)

    def is_effect(self, n: Node) -> bool:
        hit = self.effect.get(n)
        if hit is None:
            hit = self.effect[n] = has_side_effects(n, self.impure)
        return hit

    def scan(self, graph: Graph, visit: Callable[[Node, str | None, bool], object] | None = None) -> list[Node]:
        """Recompute ``after`` for every node of ``graph``; returns the nodes whose value
        changed (or is new). ``visit(node, after, effects)``, when given, is called for
        every node in program order with its place (:func:`snapshot_graph` makes its
        records in the same walk)."""
        if not self.after and not self.effect:
            return self._first_scan(graph, visit)
        changed = []
        last: str | None = None
        count = 0
        after = self.after
        for n in graph.nodes:
            if after.get(n, "") != last:
                changed.append(n)
                after[n] = last
            effect = self.is_effect(n)
            if visit is not None:
                visit(n, last, effect)
            if effect:
                last = n.name
                count += 1
        self.count = count
        return changed

    def _first_scan(self, graph: Graph, visit: Callable[[Node, str | None, bool], object] | None) -> list[Node]:
        """:meth:`scan` of an order that knows no node yet (every node is new, and its
        effect is read for the first time), its tables built in one go at the end: filling
        them node by node costs a cache miss a node in tables of the whole graph."""
        nodes: list[Node] = []
        places: list[str | None] = []
        effects: list[bool] = []
        last: str | None = None
        count = 0
        impure = self.impure
        for n in graph.nodes:
            effect = has_side_effects(n, impure)
            nodes.append(n)
            places.append(last)
            effects.append(effect)
            if visit is not None:
                visit(n, last, effect)
            if effect:
                last = n.name
                count += 1
        self.after = dict(zip(nodes, places))
        self.effect = dict(zip(nodes, effects))
        self.count = count
        return nodes

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
    if order is None:
        order = program_order(node.graph)
    if node not in order.after:
        order.scan(node.graph)
    return _record(node, order.after.get(node), order.is_effect(node))


def _record(node: Node, after: str | None, effects: bool) -> NodeRecord:
    """:func:`node_record` of ``node`` whose place in program order is known (``after``,
    ``effects``): every record of a snapshot and of a step's delta is made here, each field
    read once, straight from ``node.meta``, ``_args`` and ``_kwargs`` (the objects FX's
    ``args`` / ``kwargs`` return), with no call where a dict lookup answers."""
    m = node.meta
    value = m.get("example_value")  # meta.value: example_value, else val
    shape, dtype, stride, device = _value_parts(m.get("val") if value is None else value)
    stack = m.get("nn_module_stack")
    mod, mod_type = _module_of(stack) if stack else (None, None)
    op, target, seq_nr = node.op, node.target, m.get("seq_nr")
    args, kwargs, inputs = node._args, node._kwargs, node._input_nodes
    if op == "call_function":
        try:
            text = _function_name(target)  # target_name
        except TypeError:  # an unhashable target
            text = _function_name.__wrapped__(target)
        target_module = op_module(target) if isinstance(target, _OPS) else None
    else:
        text, target_module = str(target), None
    return NodeRecord(
        node.name,
        op,
        text,
        [_arg(a) for a in args] if args else _NONE,
        {str(k): _arg(v) for k, v in kwargs.items()} if kwargs else _NO_KWARGS,
        [n.name for n in inputs] if inputs else _NONE,
        shape,
        dtype,
        mod,
        mod_type,
        source_of(m.get("stack_trace")),
        stride,
        device,
        seq_nr if isinstance(seq_nr, int) else None,
        origins(node) if m.get("from_node") else None,
        after,
        effects,
        target_module,
    )


_OPS = (torch._ops.OpOverload, torch._ops.OpOverloadPacket)  # the targets op_module may name
#: the arguments and inputs of a node with none (a placeholder), and the keyword arguments of
#: a node with none: one object shared by every such record, as :data:`_LISTS`
_NONE: list = []
_NO_KWARGS: dict = {}


def snapshot_graph(graph: Graph) -> GraphSnapshot:
    """The whole graph as a GraphSnapshot (O(nodes)); starts keeping ``graph``'s program
    order (:class:`ProgramOrder`) for the deltas of later steps. The records are made in
    the same pass as the program order (:meth:`ProgramOrder.scan`), each while its node
    is fresh in the cache: one walk over the graph's nodes and their metadata, not two."""
    order = keep(graph, _ORDER, ProgramOrder())
    snapshot = GraphSnapshot()
    nodes = snapshot.nodes

    def visit(n: Node, after: str | None, effects: bool) -> None:
        nodes[n.name] = _record(n, after, effects)

    order.scan(graph, visit)
    return snapshot


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

    def notify_inserted_each(self, nodes: list[Node]) -> None:
        self.rec.created.extend(nodes)

    def notify_erased(self, node: Node) -> None:
        self.rec.erased.append(node)
        self.rec.erased_inputs.extend(node._input_nodes)

    def notify_erased_each(self, nodes: list[Node]) -> None:
        self.rec.erased.extend(nodes)
        inputs = self.rec.erased_inputs
        for n in nodes:
            inputs.extend(n._input_nodes)

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
