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
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.fx import Graph, GraphModule, Node
from torch.fx.node import _get_qualified_name

from optimus_lens.core import meta
from optimus_lens.core.hooks import node_hooks
from optimus_lens.core.rewriter import Listener
from optimus_lens.core.trace import Delta, GraphSnapshot, NodeRecord, source_of

_MODULE_PREFIX = re.compile(r"^L\['[^']*'\]\.?|^L\[\"[^\"]*\"\]\.?")


def target_name(node: Node) -> str:
    """Qualified name of the node's target: ``torch._C._nn.linear``, ``operator.getitem``,
    a method name for call_method, the attribute path for get_attr / call_module."""
    t = node.target
    if node.op == "call_function":
        try:
            return _get_qualified_name(t)
        except Exception:
            return getattr(t, "__name__", str(t))
    return str(t)


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
        return str(v.dtype).replace("torch.", "")
    return None


def _device(v: Any) -> str | None:
    if isinstance(v, (list, tuple)) and v:
        v = v[0]
    if isinstance(v, torch.Tensor):
        return str(v.device)
    return None


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


def node_record(node: Node) -> NodeRecord:
    """One live FX node as a plain NodeRecord (see :class:`optimus_lens.core.trace.NodeRecord`)."""
    v = meta.value(node)
    mod, mod_type = module_path(node)
    return NodeRecord(
        name=node.name,
        op=node.op,
        target=target_name(node),
        args=_arg(node.args),
        kwargs=_arg(dict(node.kwargs)),
        inputs=[n.name for n in node.all_input_nodes],
        shape=_shape(v),
        dtype=_dtype(v),
        module=mod,
        module_type=mod_type,
        source=source_of(node.meta.get("stack_trace")),
        stride=meta.strides(v),
        device=_device(v),
        seq_nr=node.meta.get("seq_nr") if isinstance(node.meta.get("seq_nr"), int) else None,
        from_node=origins(node),
    )


def snapshot_graph(graph: Graph) -> GraphSnapshot:
    """The whole graph as a GraphSnapshot (O(nodes))."""
    return GraphSnapshot(node_record(n) for n in graph.nodes)


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
        records of every touched live node."""
        created_ids = {id(n) for n in self.created}
        removed = [n.name for n in self.erased if id(n) not in created_ids]
        return Delta(upsert=[node_record(n) for n in self.touched()], remove=removed)


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
        self.rec.erased_inputs.extend(node.all_input_nodes)

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
