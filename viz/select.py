"""What a view draws of a graph: :func:`drawn_graph` chooses the nodes and edges.

Big graphs: a view with more than ``max_nodes`` drawable nodes (default 300) shows only
the marked nodes and their ``hops``-hop neighbourhood (edges followed both ways), with a
note giving how many nodes are not shown. Parameter placeholders fold into their users
(``fold_params``), and k parallel copies of the same computation (towers, heads, the k
sites of one fusion) fold into one node with an "×k" badge (``fold``, :mod:`optimus_lens.viz.fold`;
on by default above :data:`optimus_lens.viz.options.FOLD_ABOVE` drawable nodes); modules the step did
not touch fold into one node each (``modules``). Folding happens before the cut, so the
neighbourhood is counted in drawn nodes. A marked view of a graph above
:data:`LOCAL_ABOVE` nodes works on a region around its marks, so its cost follows the
region, not the graph.
"""

from __future__ import annotations

import functools
import heapq
import re
import time
from dataclasses import dataclass, field

from optimus_lens.core.trace import GraphSnapshot, NodeRecord, Trace
from optimus_lens.viz.fold import collapse_modules, module_path, parallel_classes
from optimus_lens.viz.index import users_at
from optimus_lens.viz.marks import Marks, mark_key
from optimus_lens.viz.options import DEFAULT, FOLD_ABOVE, MODULES_ABOVE, ViewOptions

#: a marked view of a graph with more nodes than this is drawn from a region around the marks
#: (grown at most ``REGION_FACTOR`` × ``max_nodes`` nodes before folding), so its cost follows
#: the region, not the graph: at 85,000 nodes a whole-graph pass costs more than the 0.1 s budget
LOCAL_ABOVE = 3000
REGION_FACTOR = 12

_DIGITS = re.compile(r"(\d+)")


def is_param(rec: NodeRecord) -> bool:
    """A lifted parameter or buffer (Dynamo placeholder ``l_self_..._parameters_...``) or a
    ``get_attr`` node (symbolic tracing)."""
    if rec.op == "get_attr":
        return True
    return rec.op == "placeholder" and ("_parameters_" in rec.name or "_buffers_" in rec.name)


def _grow(
    inputs: dict[str, list[str]], users: dict[str, list[str]], seeds: set[str], hops: int, max_nodes: int
) -> tuple[set[str], int]:
    keep = {s for s in seeds if s in inputs}
    frontier = set(keep)
    used = 0
    for _ in range(hops):
        nxt = set()
        for n in frontier:
            nxt.update(inputs.get(n, ()))
            nxt.update(users.get(n, ()))
        nxt = {n for n in nxt if n in inputs} - keep
        if not nxt:  # the seeds' whole component is already in
            return keep, hops
        if len(keep) + len(nxt) > max_nodes:
            break
        keep |= nxt
        frontier = nxt
        used += 1
    return keep, used


def neighbourhood(snap: GraphSnapshot, seeds: set[str], hops: int, max_nodes: int) -> tuple[set[str], int]:
    """The ``seeds`` plus every node within ``hops`` edges of them (both directions).

    Grows one hop at a time and stops before a hop would take the set past
    ``max_nodes`` (the seeds themselves are always kept). Returns (nodes, hops used).
    """
    return _grow({n: r.inputs for n, r in snap.nodes.items()}, snap.users(), seeds, hops, max_nodes)


@dataclass
class Drawn:
    """What a view draws: node ids in graph order (a folded class is its first member's
    name), their records, the members each id stands for, the drawn edges with how many
    graph edges each stands for, and the parameter placeholders folded into each node."""

    order: list[str]
    recs: dict[str, NodeRecord]
    members: dict[str, list[str]]
    inputs: dict[str, list[str]]
    edge_mult: dict[tuple[str, str], int]
    params: dict[str, int]
    total: int = 0
    elided: int = 0
    folded_params: int = 0
    hops: int | None = None
    fold_s: float = 0.0
    select_s: float = 0.0
    fold_cpu_s: float = 0.0
    #: paths of the folded modules drawn (each member of a "×k" module node counted)
    modules: list[str] = field(default_factory=list)

    def count(self, n: str) -> int:
        return len(self.members.get(n, (n,)))


def _region(
    snap: GraphSnapshot,
    seeds: list[str],
    marked: set[str],
    hops: int,
    cap: int,
    fold_params: bool,
    users: dict | None = None,
    n_params: int | None = None,
) -> tuple[list[str], set[str], int]:
    """The seeds and their ``hops``-hop neighbourhood, grown hop by hop while it stays
    within ``cap`` nodes; parameter placeholders are not walked through (they fold into
    their users). ``users``/``n_params``: the graph's users index and parameter count
    (:func:`users_index`); computed here, O(graph), when not given. Returns
    (region in topological order, folded parameters met, parameters in the whole graph)."""
    nodes = snap.nodes
    if users is None:
        users = snap.users()
    if n_params is None:
        n_params = sum(1 for r in nodes.values() if is_param(r))
    if not fold_params:
        n_params = 0

    def folded(n: str) -> bool:
        return fold_params and n not in marked and is_param(nodes[n])

    keep = set(seeds)
    params: set[str] = set()
    frontier = set(seeds)
    for _ in range(hops):
        nxt = set()
        for n in frontier:
            for m in nodes[n].inputs:
                if m in nodes:
                    nxt.add(m)
            nxt.update(users.get(n, ()))
        nxt -= keep
        met = {n for n in nxt if folded(n)}
        params |= met
        nxt -= met
        if not nxt or len(keep) + len(nxt) > cap:
            break
        keep |= nxt
        frontier = nxt
    params |= {i for n in keep for i in nodes[n].inputs if i in nodes and i not in keep and folded(i)}
    return _topo_order(nodes, keep), params, n_params


@functools.lru_cache(maxsize=1 << 18)
def _natural(name: str) -> tuple:
    """Sort key: ``linear_12`` after ``linear_2``."""
    return tuple(int(p) if p.isdigit() else p for p in _DIGITS.split(name))


def _topo_order(nodes: dict[str, NodeRecord], keep: set[str]) -> list[str]:
    """``keep`` in an order where every node comes after its inputs (Kahn's algorithm,
    ties in natural name order, so tower 2 comes before tower 10)."""
    deps = {n: {i for i in nodes[n].inputs if i in keep and i != n} for n in keep}
    users: dict[str, list[str]] = {}
    for n, ds in deps.items():
        for i in ds:
            users.setdefault(i, []).append(n)
    ready = [(_natural(n), n) for n, ds in deps.items() if not ds]
    heapq.heapify(ready)
    out = []
    while ready:
        _, n = heapq.heappop(ready)
        out.append(n)
        for u in users.get(n, ()):
            deps[u].discard(n)
            if not deps[u]:
                heapq.heappush(ready, (_natural(u), u))
    if len(out) < len(keep):  # a cycle cannot happen in an FX graph; keep every node anyway
        out += sorted(keep - set(out), key=_natural)
    return out


def drawn_graph(
    snap: GraphSnapshot,
    marks: Marks | None = None,
    opts: ViewOptions = DEFAULT,
    *,
    users: dict | None = None,
    n_params: int | None = None,
    keep_open: set[str] | None = None,
) -> Drawn:
    """Choose what to draw of ``snap`` with ``opts`` (:class:`optimus_lens.viz.options.ViewOptions`):
    parameter placeholders folded into their users (``fold_params``; marked ones stay),
    parallel copies folded into "×k" classes (``fold``; None: when more than
    :data:`optimus_lens.viz.options.FOLD_ABOVE` nodes are drawable), then — unless ``full`` — the
    marked classes and their ``hops``-hop neighbourhood, stopping before a hop would pass
    ``max_nodes`` drawn nodes (without marks: the first ``max_nodes``). ``modules``: fold
    modules into one node each (:func:`optimus_lens.viz.fold.collapse_modules`; modules holding a
    ``keep_open`` node — default: the marked ones — or named in ``unfolded`` stay open)
    before the rest; None: when more than :data:`optimus_lens.viz.options.MODULES_ABOVE` nodes are
    drawable. Above :data:`LOCAL_ABOVE` nodes a marked view works on a region around the
    marks (``users``/``n_params`` from :func:`users_index` keep it O(region))."""
    marks = marks or Marks()
    hops, max_nodes, full, fold_params = opts.hops, opts.max_nodes, opts.full, opts.fold_params
    marked = marks.names()
    seeds = [n for n in marked if n in snap.nodes]
    t_sel = time.perf_counter()
    if not full and seeds and len(snap) > LOCAL_ABOVE:
        names, params, n_params = _region(
            snap, seeds, marked, hops, max_nodes * REGION_FACTOR, fold_params, users, n_params
        )
    else:
        params = {n for n, r in snap.nodes.items() if fold_params and n not in marked and is_param(r)}
        names = [n for n in snap.nodes if n not in params]
        n_params = len(params)
    total = len(snap)
    weight: dict[str, int] = {}
    modules = opts.modules
    if modules is None:
        modules = total - n_params > MODULES_ABOVE
    if modules:
        snap, names, weight = collapse_modules(snap, names, marked if keep_open is None else keep_open, opts.unfolded)
    inside = set(names)
    sel_s = time.perf_counter() - t_sel
    t0, c0 = time.perf_counter(), time.process_time()
    fold = opts.fold
    if fold is None:
        fold = len(snap) - n_params > FOLD_ABOVE
    rep = parallel_classes(snap, names, {n: mark_key(marks, n) for n in marked}) if fold else {}
    members: dict[str, list[str]] = {}
    for n in names:
        members.setdefault(rep.get(n, n), []).append(n)
    fold_s = time.perf_counter() - t0 if fold else 0.0
    fold_cpu = time.process_time() - c0 if fold else 0.0
    if fold:
        q_inputs = {}
        for r, ms in members.items():
            q_inputs[r] = list(dict.fromkeys(rep.get(i, i) for m in ms for i in snap.nodes[m].inputs if i in inside))
    else:
        q_inputs = {n: [i for i in dict.fromkeys(snap.nodes[n].inputs) if i in inside] for n in names}
    used_hops: int | None = None
    if full or len(members) <= max_nodes:
        shown = set(members)
    else:
        seed_set = {rep.get(n, n) for n in marked if n in snap.nodes}
        if seed_set:
            q_users: dict[str, list[str]] = {}
            for r, ins in q_inputs.items():
                for i in ins:
                    q_users.setdefault(i, []).append(r)
            shown, used_hops = _grow(q_inputs, q_users, seed_set, hops, max_nodes)
        else:
            shown, used_hops = set(list(members)[:max_nodes]), 0
    order = [r for r in members if r in shown]
    inputs = {r: [i for i in q_inputs[r] if i in shown] for r in order}
    mult: dict[tuple[str, str], int] = {}
    for r in order:
        if len(members[r]) == 1:
            for i in inputs[r]:
                mult[(i, r)] = 1
            continue
        for m in members[r]:
            for i in dict.fromkeys(snap.nodes[m].inputs):
                ri = rep.get(i, i)
                if ri in shown and i in inside:
                    mult[(ri, r)] = mult.get((ri, r), 0) + 1
    per_node = {r: sum(1 for i in dict.fromkeys(snap.nodes[r].inputs) if i in params) for r in order}
    elided = total - n_params - sum(weight.get(m, 1) for r in order for m in members[r])
    if used_hops is None and elided:  # a local region: how far it reached
        used_hops = hops
    mods = [module_path(m) or m for r in order if r in weight for m in members[r]]
    return Drawn(
        order,
        {r: snap.nodes[r] for r in order},
        {r: members[r] for r in order if len(members[r]) > 1},
        inputs,
        mult,
        per_node,
        total,
        elided,
        n_params,
        used_hops,
        fold_s,
        sel_s,
        fold_cpu,
        mods,
    )


def users_index(trace: Trace, k: int, snap: GraphSnapshot) -> tuple[dict | None, int | None]:
    """(users index, parameter count) of ``snap``, the graph after ``k`` steps of ``trace``,
    from the trace's running index (:func:`optimus_lens.viz.index.users_at`) when it is big (above
    :data:`LOCAL_ABOVE` nodes); (None, None) for a small one (:func:`drawn_graph` computes
    what it needs)."""
    if len(snap) <= LOCAL_ABOVE:
        return None, None
    return users_at(trace, k, snap, is_param)


def drawable_count(snap: GraphSnapshot, n_params: int | None, fold_params: bool) -> int:
    """Nodes a view of ``snap`` can draw: all but the folded parameter placeholders
    (``n_params`` of them when known, else counted)."""
    if not fold_params:
        return len(snap)
    return len(snap) - (n_params if n_params is not None else sum(1 for r in snap.nodes.values() if is_param(r)))
