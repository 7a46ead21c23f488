"""Copies of FX graphs that keep what the passes and AOTAutograd read: node metas (shared
FakeTensors), the output node's meta, FX's name space (a dry run names nodes as the run it
repeats) and Dynamo's input sources. ``optimus_lens.core.engine`` publishes both functions."""

from __future__ import annotations

from torch.fx import Graph, GraphModule, Node


def copy_graph(graph: Graph, env: dict[Node, Node] | None = None) -> Graph:
    """A copy of ``graph`` (node meta copied shallowly, so FakeTensors are shared, not
    cloned), its output node (and its meta) included; ``env``, if given, receives original node -> copy.
    O(nodes). The copy's name space is the original's (every name ever used, the last
    number per base name), so a node created in the copy gets the name it would get in
    the original: a dry run names nodes as the run it repeats (``optimus why --step``
    asks about the trace's ``getitem_16``)."""
    g = Graph()
    g._codegen = graph._codegen
    env = {} if env is None else env
    rv, out = g.graph_copy(graph, env, return_output_node=True)  # type: ignore[misc]
    g.output(rv, type_expr=getattr(out, "type", None)).meta = dict(out.meta if isinstance(out, Node) else {})
    for old, new in env.items():  # Dynamo's source of each input, which AOTAutograd reads
        if old.op == "placeholder" and hasattr(old, "_dynamo_source"):
            new._dynamo_source = old._dynamo_source
    ns, src = g._graph_namespace, graph._graph_namespace
    ns._used_names |= src._used_names
    ns._base_count = dict(src._base_count)
    return g


#: what Dynamo leaves on its GraphModule for AOTAutograd, kept by :func:`copy_graph_module`
DYNAMO_ATTRS = ("_param_name_to_source", "_source_to_user_stacks")


def copy_graph_module(gm: GraphModule) -> GraphModule:
    """A new GraphModule over :func:`copy_graph` of ``gm``'s graph (same submodules and
    attributes, ``meta`` and Dynamo's input sources, so AOTAutograd sees the copy of a
    Dynamo graph as one: its parameters static inputs). O(nodes)."""
    out = GraphModule(gm, copy_graph(gm.graph))
    out.meta = dict(gm.meta)
    for a in DYNAMO_ATTRS:
        if hasattr(gm, a):
            setattr(out, a, getattr(gm, a))
    return out
