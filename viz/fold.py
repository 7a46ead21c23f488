"""Folding repetition: k parallel copies of the same computation drawn once.

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
"""
from __future__ import annotations

from optimus.trace import GraphSnapshot, NodeRecord, arg_text

#: a class folds when it has at least this many members
MIN_K = 3


def _consts(rec: NodeRecord) -> str:
    """The node's non-node arguments as text (a getitem's index left out)."""
    args = rec.args[:1] if rec.target.endswith("getitem") else rec.args
    parts = [arg_text(a) for a in args if not (isinstance(a, dict) and "node" in a and len(a) == 1)]
    parts += [f"{k}={arg_text(v)}" for k, v in sorted(rec.kwargs.items())]
    return "|".join(parts)


def parallel_classes(snap: GraphSnapshot, names: list[str], mark_of: dict[str, tuple] | None = None,
                     min_k: int = MIN_K) -> dict[str, str]:
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
            c = cid((r.op, r.target, repr(r.shape), r.dtype, _consts(r) if r.args or r.kwargs else "", mark_of.get(n, ()),
                     tuple(colour_of(i) for i in r.inputs)))
        colour[n] = c
        members.setdefault(c, []).append(n)
    rep: dict[str, str] = {}
    for ms in members.values():
        first = ms[0] if len(ms) >= min_k else None
        for m in ms:
            rep[m] = first or m
    return rep
