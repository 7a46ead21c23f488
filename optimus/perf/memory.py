"""Static peak-memory estimate of an FX graph by tensor liveness (bytes).

Walk the nodes in execution order; a node's output is allocated when it runs and freed
after its last user has run. Views (getitem of split/unbind, reshape/view/transpose,
...: ``optimus_lens.core.effects.PURE_VIEW_FUNCTIONS`` / ``PURE_VIEW_METHODS``) allocate
nothing and keep their base alive. Placeholders (inputs and lifted
parameters) that some node reads, and constants (``get_attr`` tensors, e.g. weights
pre-packed by :mod:`optimus_lens.perf.prepack`, counted once per storage), are live for the whole
run. A placeholder no node reads costs this graph nothing: after pre-packing, that is
an original parameter whose values now live in a packed constant, which an inference
deployment can free (as Inductor's freezing discards them). This is what the CPU timing path reports
instead of ``torch.cuda.max_memory_allocated``; it ignores allocator rounding and
kernel workspaces.
"""

from __future__ import annotations

import torch
from torch.fx import Graph, Node

from optimus_lens.core import meta
from optimus_lens.core.effects import is_pure_view


def nbytes(v) -> int:
    """Bytes of a tensor value (sum over a tuple of them); 0 for anything else."""
    if isinstance(v, torch.Tensor):
        return v.numel() * v.element_size()
    if isinstance(v, (list, tuple)):
        return sum(nbytes(x) for x in v)
    return 0


def peak_bytes(graph: Graph) -> dict:
    """Estimate of peak live tensor memory while running ``graph`` once.

    Returns ``{"peak_bytes", "inputs_bytes", "constants_bytes", "peak_node"}``: the peak
    (bytes) including the always-live placeholders and constants, the read placeholders'
    share, the constants' share, and the node at which the peak is reached. Nodes without
    example values count as 0 bytes (a get_attr without one is read from the owning
    GraphModule).
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
    constants = _constants_bytes(graph)
    live += constants
    for n in nodes:
        if n.op == "placeholder":
            b = nbytes(meta.value(n)) if n.users else 0
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
    return {"peak_bytes": peak, "inputs_bytes": inputs, "constants_bytes": constants, "peak_node": peak_node}


def _constants_bytes(graph: Graph) -> int:
    """Bytes of the distinct storages the graph's get_attr tensor nodes read."""
    seen: dict[int, int] = {}
    owner = graph.owning_module
    for n in graph.nodes:
        if n.op != "get_attr":
            continue
        v = meta.value(n)
        if not isinstance(v, torch.Tensor) or v.device.type == "meta" or _is_fake(v):
            v = _attr(owner, n.target) if owner is not None else None
        if isinstance(v, torch.Tensor):
            st = v.untyped_storage()
            seen[st.data_ptr() or id(st)] = st.nbytes()
    return sum(seen.values())


def _is_fake(v) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(v, FakeTensor)


def _attr(mod, target: str):
    for part in target.split("."):
        mod = getattr(mod, part, None)
    return mod
