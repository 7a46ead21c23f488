"""Which nodes of two graphs are the same node: by structure, by name, by provenance.

Two runs of one model (two torch versions, two configurations, ours and upstream's, a
log's graph and our replay of it) name the nodes they create as they please, so a name
alone does not say which node of one graph is which of the other. :func:`match_nodes`
pairs the nodes of two :class:`~optimus_lens.core.trace.GraphSnapshot` s in three rounds:

1. **structure**: a node's key is its op, target and arguments with every input replaced
   by that input's key, down to the placeholders (named by their target) and constants
   (hash-consing, as common-subexpression elimination numbers values); equal keys are
   the same computation of the same inputs. Repeated keys pair in graph order;
2. **name**: of what is left, nodes with the same name, op and target;
3. **provenance** (with the runs' :func:`origins`): of what is left, nodes with the same op
   and target made from the same nodes of the captured graph (a fusion of the same
   group in both runs).

Plain data in and out, no torch: traces read from JSON compare as well as live runs.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from optimus_lens.core.trace import GraphSnapshot, Trace

HOW = ("structure", "name", "provenance")


def _frozen(a: Any, key_of: dict[str, int]) -> Any:
    if isinstance(a, dict):
        if len(a) == 1 and isinstance(a.get("node"), str):
            return ("#", key_of.get(a["node"], -1))
        return tuple(sorted((str(k), _frozen(v, key_of)) for k, v in a.items()))
    if isinstance(a, list):
        return tuple(_frozen(x, key_of) for x in a)
    return a


def structure_keys(g: GraphSnapshot, intern: dict | None = None) -> dict[str, int]:
    """name -> the structural key of the node (see the module doc): equal keys, equal
    computations. Keys of two graphs compare only when both were numbered with the same
    ``intern`` table (a dict this fills). Records are visited inputs first whatever their
    order in ``g`` (a replayed snapshot appends the nodes a step created)."""
    intern = {} if intern is None else intern
    keys: dict[str, int] = {}
    expanded: set[str] = set()
    nodes = g.nodes
    for root in nodes:
        stack = [root]
        while stack:
            name = stack[-1]
            if name in keys:
                stack.pop()
                continue
            rec = nodes.get(name)
            if rec is None:  # an input the snapshot lacks
                keys[name] = intern.setdefault(("missing", name), len(intern))
                stack.pop()
                continue
            if name not in expanded:  # first its inputs (an input on a cycle keys as -1)
                expanded.add(name)
                stack.extend(i for i in rec.inputs if i not in keys and i not in expanded)
                continue
            stack.pop()
            if rec.op in ("placeholder", "get_attr"):
                k: Any = (rec.op, rec.target)
            else:
                k = (rec.op, rec.target, _frozen(rec.args, keys), _frozen(rec.kwargs, keys))
            keys[name] = intern.setdefault(k, len(intern))
    return keys


def origins(trace: Trace) -> dict[str, frozenset[str]]:
    """name -> the nodes of the trace's captured graph each node of its final graph was
    made from: a captured node is made from itself, a node a step created from what the
    step's sites were made from."""
    out: dict[str, frozenset[str]] = {n: frozenset([n]) for n in trace.initial_graph.nodes}
    for s in trace.steps:
        made = frozenset().union(*(out.get(x, frozenset([x])) for x in s.sites)) if s.sites else frozenset()
        for c in s.created:
            out[c] = made
    return out


@dataclass
class NodeMatch:
    """The nodes of graph ``a`` paired with nodes of graph ``b``: ``pairs`` (a -> b), how
    each pair was found (``how``: ``structure``, ``name`` or ``provenance``), and the nodes
    of each graph left without a partner."""

    pairs: dict[str, str] = field(default_factory=dict)
    how: dict[str, str] = field(default_factory=dict)
    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        """True when every node of each graph is the same computation as one of the other:
        the two graphs are the same node for node (names aside)."""
        return not self.only_a and not self.only_b and all(h == "structure" for h in self.how.values())

    def counts(self) -> dict[str, int]:
        """Pairs per round, and the unpaired nodes of each side."""
        out = {h: 0 for h in HOW}
        for h in self.how.values():
            out[h] += 1
        out["only_a"], out["only_b"] = len(self.only_a), len(self.only_b)
        return out


def match_nodes(
    a: GraphSnapshot,
    b: GraphSnapshot,
    origins_a: dict[str, frozenset[str]] | None = None,
    origins_b: dict[str, frozenset[str]] | None = None,
) -> NodeMatch:
    """Pair the nodes of ``a`` and ``b`` (module doc). ``origins_a`` / ``origins_b`` (from
    :func:`origins`, in one naming of the captured graph) enable the provenance round."""
    shared: dict = {}
    ka, kb = structure_keys(a, shared), structure_keys(b, shared)
    by_key: dict[int, list[str]] = defaultdict(list)
    for name in b.nodes:
        by_key[kb[name]].append(name)
    m = NodeMatch()
    left_a = []
    for name in a.nodes:
        bucket = by_key.get(ka[name])
        if bucket:
            m.pairs[name], m.how[name] = bucket.pop(0), "structure"
        else:
            left_a.append(name)
    taken = set(m.pairs.values())
    left_b = [n for n in b.nodes if n not in taken]
    free_b = set(left_b)
    still = []
    for name in left_a:
        ra, rb = a.nodes[name], b.nodes.get(name)
        if name in free_b and rb is not None and (ra.op, ra.target) == (rb.op, rb.target):
            m.pairs[name], m.how[name] = name, "name"
            free_b.discard(name)
        else:
            still.append(name)
    if origins_a is not None and origins_b is not None:
        by_made: dict[tuple, list[str]] = defaultdict(list)
        for name in left_b:
            if name in free_b and name in origins_b:
                rb = b.nodes[name]
                by_made[(rb.op, rb.target, origins_b[name])].append(name)
        rest = []
        for name in still:
            ra = a.nodes[name]
            bucket = by_made.get((ra.op, ra.target, origins_a.get(name)))
            if bucket and origins_a.get(name):
                other = bucket.pop(0)
                m.pairs[name], m.how[name] = other, "provenance"
                free_b.discard(other)
            else:
                rest.append(name)
        still = rest
    m.only_a = still
    m.only_b = [n for n in left_b if n in free_b]
    return m
