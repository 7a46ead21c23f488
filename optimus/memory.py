"""Static peak-memory estimate of an FX graph by tensor liveness (bytes).

Walk the nodes in execution order; a node's output is allocated when it runs and freed
after its last user has run. Views (getitem of split/unbind, reshape/view/transpose,
...: ``optimus.passes.common.PURE_VIEW_FUNCTIONS`` / ``PURE_VIEW_METHODS``) allocate
nothing and keep their base alive. Placeholders (inputs and lifted
parameters) are live for the whole run. This is what the CPU timing path reports
instead of ``torch.cuda.max_memory_allocated``; it ignores allocator rounding and
kernel workspaces.
"""
from __future__ import annotations

import torch
from torch.fx import Graph, Node

from optimus import meta
from optimus.passes.common import is_pure_view

def nbytes(v) -> int:
    """Bytes of a tensor value (sum over a tuple of them); 0 for anything else."""
    if isinstance(v, torch.Tensor):
        return v.numel() * v.element_size()
    if isinstance(v, (list, tuple)):
        return sum(nbytes(x) for x in v)
    return 0


def peak_bytes(graph: Graph) -> dict:
    """Estimate of peak live tensor memory while running ``graph`` once.

    Returns ``{"peak_bytes", "inputs_bytes", "peak_node"}``: the peak (bytes) including
    the always-live placeholders, the placeholders' share, and the node at which the
    peak is reached. Nodes without example values count as 0 bytes.
    """
    nodes = list(graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    base: dict[Node, Node] = {}

    def root(n: Node) -> Node:
        while n in base:
            n = base[n]
        return n

    # storage owner of every view
    for n in nodes:
        if is_pure_view(n) and n.all_input_nodes:
            base[n] = n.all_input_nodes[0]
    last_use: dict[Node, int] = {}
    for n in nodes:
        for i in n.all_input_nodes:
            r = root(i)
            last_use[r] = max(last_use.get(r, -1), order[n])
    live = inputs = 0
    peak, peak_node = 0, None
    frees: dict[int, list[Node]] = {}
    for n in nodes:
        if n.op == "placeholder":
            b = nbytes(meta.value(n))
            inputs += b
            live += b
        elif n.op not in ("output", "get_attr") and n not in base:
            live += nbytes(meta.value(n))
            frees.setdefault(last_use.get(n, order[n]), []).append(n)
        if live > peak:
            peak, peak_node = live, n.name
        for f in frees.pop(order[n], []):
            if f.op != "placeholder":
                live -= nbytes(meta.value(f))
    return {"peak_bytes": peak, "inputs_bytes": inputs, "peak_node": peak_node}
