"""Folding repetition: k parallel copies of the same computation drawn once, and modules
drawn as one node each.

Two nodes are *parallel copies* when they do the same thing to parallel inputs: same op,
target, output shape and dtype, same constant arguments (a getitem's index excepted: it
is what tells the copies apart), the same marks in the view, and inputs that are
themselves parallel copies, position by position. This is colour refinement over the
graph in topological (graph) order — one pass, O(nodes + edges) — so the 128 towers of a
recommendation model (``getitem_i -> linear_i -> relu_i -> ...``) become one chain of
classes of 128, and a fused group of 128 pattern sites becomes one class. Nodes at
different depths of a chain never share a class (their inputs' classes differ), and no
node shares a class with its own input.

Classes with at least ``min_k`` members fold: the view draws the first member (the
representative) with an "×k" badge and lists the members on hover.

Module folding (:func:`module_owners`, :func:`collapse_modules`) draws a module the step
did not touch as one node, id ``mod:<path>`` (:func:`module_path` reads it back).
"""

from __future__ import annotations

import functools
import re
from collections import ChainMap
from dataclasses import replace

from optimus_lens.core.trace import GraphSnapshot, NodeRecord, arg_text

#: a class folds when it has at least this many members
MIN_K = 3


def _consts(rec: NodeRecord) -> str:
    """The node's non-node arguments as text (a getitem's index left out)."""
    args = rec.args[:1] if rec.target.endswith("getitem") else rec.args
    parts = [arg_text(a) for a in args if not (isinstance(a, dict) and "node" in a and len(a) == 1)]
    parts += [f"{k}={arg_text(v)}" for k, v in sorted(rec.kwargs.items())]
    return "|".join(parts)


def parallel_classes(
    snap: GraphSnapshot, names: list[str], mark_of: dict[str, tuple] | None = None, min_k: int = MIN_K
) -> dict[str, str]:
    """Map each of ``names`` (graph order) to its class representative (the class's first
    member); classes smaller than ``min_k`` map each member to itself.

    ``mark_of`` gives a node's marks in the view (nodes with different marks never share
    a class). Inputs outside ``names`` (folded parameters, nodes not drawn) count by their
    own op, shape and dtype. Placeholders (the model's real inputs) never fold."""
    mark_of = mark_of or {}
    ids: dict[tuple, int] = {}
    colour: dict[str, int] = {}

    def cid(key: tuple) -> int:
        return ids.setdefault(key, len(ids))

    def colour_of(n: str) -> int:
        c = colour.get(n)
        if c is None:
            r = snap.nodes.get(n)
            c = colour[n] = cid(("outside", r.op if r else "?", repr(r.shape) if r else "", r.dtype if r else ""))
        return c

    members: dict[int, list[str]] = {}
    for n in names:
        r = snap.nodes[n]
        if r.op in ("placeholder", "output"):
            c = cid(("unique", n))
        else:
            c = cid(
                (
                    r.op,
                    r.target,
                    repr(r.shape),
                    r.dtype,
                    _consts(r) if r.args or r.kwargs else "",
                    mark_of.get(n, ()),
                    tuple(colour_of(i) for i in r.inputs),
                )
            )
        colour[n] = c
        members.setdefault(c, []).append(n)
    rep: dict[str, str] = {}
    for ms in members.values():
        first = ms[0] if len(ms) >= min_k else None
        for m in ms:
            rep[m] = first or m
    return rep


# --------------------------------------------------------------------------- module folding

#: a module folds into one node when it has at least this many drawn nodes
MODULE_MIN = 3
#: the op of a folded-module node (viz only; never in a Trace)
MODULE_OP = "module"
#: a folded module's node id (DOT node name, SVG ``<title>``) is this prefix + its path
MODULE_ID = "mod:"


def module_path(node_id: str) -> str | None:
    """The module path of a folded module's node id (``mod:towers.3`` -> ``towers.3``, as
    the SVG ``<title>`` of a ``class="lens-module"`` node reads); None for any other node."""
    return node_id[len(MODULE_ID) :] if node_id.startswith(MODULE_ID) else None


@functools.lru_cache(maxsize=1 << 16)
def module_prefixes(path: str) -> tuple[str, ...]:
    """``towers.3.fc1`` -> ``("towers", "towers.3", "towers.3.fc1")`` (outermost first)."""
    parts = path.split(".")
    return tuple(".".join(parts[: i + 1]) for i in range(len(parts)))


def connected(inputs: dict[str, list[str]], names: list[str]) -> bool:
    """Whether ``names`` (at least one) form one weakly connected piece using only the edges
    among themselves; ``inputs`` maps a node to its input nodes (names outside ``names``
    are ignored). Module folding and the views' module boxes both ask this."""
    members = set(names)
    adj: dict[str, list[str]] = {n: [] for n in names}
    for n in names:
        for i in inputs.get(n, ()):
            if i in members:
                adj[n].append(i)
                adj[i].append(n)
    seen, todo = {names[0]}, [names[0]]
    while todo:
        for m in adj[todo.pop()]:
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return len(seen) == len(members)


def module_owners(
    snap: GraphSnapshot, names: list[str], keep_open: set[str], unfolded=frozenset(), min_size: int = MODULE_MIN
) -> dict[str, str]:
    """Which module each node folds into: node name -> module path, for the nodes of
    ``names`` that fold (the others are drawn as themselves).

    The module hierarchy is the node's ``nn_module_stack`` path (``NodeRecord.module``,
    its innermost module) read as nested prefixes: ``towers.3.fc1`` sits in ``towers.3``,
    which sits in ``towers``. A node folds into its *outermost* module that is closed:
    not in ``unfolded``, holding none of ``keep_open`` (the nodes the step touched: a
    module they are in stays open, all the way up), with at least ``min_size`` nodes
    among ``names``, whose nodes form one connected piece (128 parallel towers under
    ``towers`` do not, so each ``towers.i`` folds instead; a module whose nodes a fusion
    scattered does not either). Unfolding a module shows its children, folded by the
    same rule. Placeholders and the output never fold. O(nodes + module paths x depth)."""
    by_path: dict[str, list[str]] = {}  # innermost module -> its nodes: one dict step per node
    nodes = snap.nodes
    for n in names:
        r = nodes[n]
        if r.module and r.op != "placeholder" and r.op != "output":
            ms = by_path.get(r.module)
            if ms is None:
                by_path[r.module] = [n]
            else:
                ms.append(n)
    if not by_path:
        return {}
    under: dict[str, list[str]] = {}  # module -> the innermost paths under it
    for path in by_path:
        for p in module_prefixes(path):
            under.setdefault(p, []).append(path)
    opened = set(unfolded)
    for n in keep_open:
        r = nodes.get(n)
        if r is not None and r.module:
            opened.update(module_prefixes(r.module))
    closed: dict[str, list[str] | None] = {}

    def members_if_closed(p: str) -> list[str] | None:
        if p not in closed:
            closed[p] = None
            if p not in opened and sum(len(by_path[q]) for q in under[p]) >= min_size:
                ms = [n for q in under[p] for n in by_path[q]]
                if connected({n: nodes[n].inputs for n in ms}, ms):
                    closed[p] = ms
        return closed[p]

    owner = {}
    for path, ns in by_path.items():
        for p in module_prefixes(path):
            if members_if_closed(p) is not None:
                for n in ns:
                    owner[n] = p
                break
    return owner


def collapse_modules(
    snap: GraphSnapshot, names: list[str], keep_open: set[str], unfolded=frozenset(), min_size: int = MODULE_MIN
) -> tuple[GraphSnapshot, list[str], dict[str, int]]:
    """Fold modules (:func:`module_owners`: the outermost closed module of each node's
    ``nn_module_stack`` path; modules holding a ``keep_open`` node or named in
    ``unfolded`` stay open) into one node each, id ``mod:<path>``, labelled with its path,
    class and node count. Its inputs are the members' inputs from outside it (parameters
    included, so "+N params" counts them); users of members now use it. Identical
    modules of parallel towers (``towers.3`` and ``towers.7``) share a target
    (``towers.*``) and node count, so parallel-copy folding draws them once as "×k".

    Returns (a snapshot of the folded graph, its names in order, module node -> how
    many nodes it stands for)."""
    owner = {n: MODULE_ID + p for n, p in module_owners(snap, names, keep_open, unfolded, min_size).items()}
    if not owner:
        return snap, names, {}
    groups: dict[str, list[str]] = {}
    for n in names:  # members in graph order: the module node takes its last member's shape
        v = owner.get(n)
        if v is not None:
            groups.setdefault(v, []).append(n)
    out, order, weight = GraphSnapshot(), [], {}
    for n in names:
        r = snap.nodes[n]
        v = owner.get(n)
        if v is None:
            mapped = list(dict.fromkeys(owner.get(i, i) for i in r.inputs))
            out.nodes[n] = r if mapped == r.inputs else replace(r, inputs=mapped)
            order.append(n)
        elif v not in out.nodes:
            path, ms = v[len(MODULE_ID) :], groups[v]
            ext = list(dict.fromkeys(i for m in ms for i in snap.nodes[m].inputs if owner.get(i) != v))
            last = snap.nodes[ms[-1]]
            cls = next((snap.nodes[m].module_type for m in ms if snap.nodes[m].module == path), None)
            out.nodes[v] = NodeRecord(
                v,
                MODULE_OP,
                re.sub(r"\.\d+(?=\.|$)", ".*", path),
                args=[len(ms)],
                inputs=[owner.get(i, i) for i in ext],
                shape=last.shape,
                dtype=last.dtype,
                module=path,
                module_type=cls,
            )
            order.append(v)
            weight[v] = len(ms)
    out.nodes = ChainMap(out.nodes, snap.nodes)  # parameters and nodes outside the region: as they were
    return out, order, weight
