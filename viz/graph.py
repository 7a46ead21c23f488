"""Trace / Step -> Graphviz DOT: before/after graphs of a step with its pattern sites highlighted.

Marks (what the colours mean, also drawn as a legend inside every graph):

* **pattern site** — the nodes the step matched, filled with their fused group's
  colour. A step is one group; a whole-pass overview gives each step's group its own
  colour (:data:`GROUP_COLOURS`, cycled).
* **created** — nodes the rewrite added: green border on a light-green fill (in a pass
  overview, the fill is the creating step's group colour).
* **erased** — nodes the rewrite removed, drawn red and dashed in the *before* view.
* **rewired** — existing nodes whose inputs the rewrite pointed at new nodes (blue border).

Big graphs: a view with more than ``max_nodes`` drawable nodes (default 300) shows only
the marked nodes and their ``hops``-hop neighbourhood (edges followed both ways), with a
note giving how many nodes are not shown. Parameter placeholders fold into their users
(``fold_params``), and k parallel copies of the same computation (towers, heads, the k
sites of one fusion) fold into one node with an "×k" badge (``fold``, :mod:`viz.fold`;
on by default above :data:`FOLD_ABOVE` drawable nodes). Folding happens before the cut,
so the neighbourhood is counted in drawn nodes.

Layout is bounded (:mod:`viz.layout`): ``dot`` with size-scaled limits and a time
budget, else a layered fallback that the view names. A step's before, after and diff
views share one layout of their union (:func:`step_picture`), so a node the step did not
touch sits at the same coordinates in all three.
"""

from __future__ import annotations

import functools
import re
import subprocess
import time
from collections import ChainMap
from dataclasses import dataclass, field, replace

import graphviz

from optimus_lens.core.trace import GraphSnapshot, NodeRecord, Step, Trace, arg_text
from optimus_lens.viz.fold import MODULE_MIN, _connected, module_owners, parallel_classes
from optimus_lens.viz.index import users_at
from optimus_lens.viz.layout import (
    LAYOUT_BUDGET_S,
    Layout,
    RenderError,
    anchors,
    bounded_layout,
    dot_limits,
    draw_pinned,
    layered_layout,
)
from optimus_lens.viz.palette import STANDARD, Palette

#: fill colours of fused groups (pattern sites), one per step in a pass overview
GROUP_COLOURS = STANDARD.groups
CREATED_FILL, CREATED_BORDER = STANDARD.created_fill, STANDARD.created_border
ERASED_BORDER = STANDARD.erased_border
REWIRED_BORDER = STANDARD.rewired_border
PLAIN_FILL, INPUT_FILL = "#ffffff", "#eeeeee"

#: default number of drawable nodes above which a view is cut to the marked nodes' neighbourhood
MAX_NODES = 300
#: default neighbourhood radius (hops along edges, both directions) of a cut view
HOPS = 2
#: parallel-copy folding is on by default when a view has more drawable nodes than this
#: (recsys_towers' views, 40-70 nodes, stay unfolded; a 64-tower model's 500 fold)
FOLD_ABOVE = 120
GHOST_FILL, GHOST_TEXT = STANDARD.ghost_fill, STANDARD.ghost_text
PROVENANCE_COLOUR = STANDARD.provenance
CHANGED_OLD, CHANGED_NEW = STANDARD.changed_old, STANDARD.changed_new

_DTYPE_SHORT = {
    "float32": "f32",
    "float16": "f16",
    "bfloat16": "bf16",
    "float64": "f64",
    "int64": "i64",
    "int32": "i32",
    "int8": "i8",
    "uint8": "u8",
    "bool": "bool",
}


@dataclass
class Marks:
    """What to highlight in one graph view.

    ``groups`` maps a node name to its group index (colour); ``group_labels[i]`` names
    group ``i`` in the legend (e.g. "step 3: batch_linear"). ``created``/``erased``/
    ``rewired`` are node-name sets.
    """

    groups: dict[str, int] = field(default_factory=dict)
    group_labels: list[str] = field(default_factory=list)
    created: set[str] = field(default_factory=set)
    erased: set[str] = field(default_factory=set)
    rewired: set[str] = field(default_factory=set)

    def names(self) -> set[str]:
        return set(self.groups) | self.created | self.erased | self.rewired


@dataclass
class LegendEntry:
    """One legend row: a swatch (fill colour, border colour, dashed border) and its text."""

    fill: str
    border: str
    text: str
    dashed: bool = False


@dataclass
class GraphView:
    """A DOT graph ready to render, and what it leaves out.

    ``total`` nodes in the graph, ``shown`` drawn, ``elided`` cut away by the
    neighbourhood limit, ``folded`` parameter placeholders folded into their users.
    ``hops`` is the neighbourhood radius actually used (None: the whole graph is shown;
    it can be below the requested radius when a wider one would pass ``max_nodes``).
    ``focus`` lists the drawn sites and created nodes (else the other marked nodes), in
    graph order: what a viewer zooms to. ``legend`` and ``notes`` repeat the in-graph
    legend as data, for a viewer that keeps it on screen while zoomed. ``shown`` counts
    drawn nodes; a folded "×k" node counts once (``parallel`` counts the nodes it stands for).
    """

    dot: graphviz.Digraph
    title: str
    total: int
    shown: int
    elided: int
    folded: int
    hops: int | None
    focus: list[str] = field(default_factory=list)
    legend: list[LegendEntry] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: the drawn nodes and edges (to re-emit the view with pinned positions)
    drawn: Drawn | None = None
    #: True when every node carries a position (draw with ``neato -n2``)
    pinned: bool = False
    #: nodes drawn as an "×k" representative, and the k's (nodes represented in all)
    parallel: int = 0
    #: seconds spent folding parallel copies, and building the rest of the DOT
    fold_s: float = 0.0
    build_s: float = 0.0
    marks: Marks | None = None
    #: paths of the modules drawn folded (``mod:<path>`` nodes; :func:`module_path`)
    modules: list[str] = field(default_factory=list)
    palette: Palette = STANDARD

    @property
    def source(self) -> str:
        return self.dot.source


# --------------------------------------------------------------------------- labels


def shape_text(shape) -> str:
    """``[32, 16]`` -> ``32×16``; ``[]`` -> ``scalar``; a list of equal shapes -> ``8×(32×16)``."""
    if shape is None:
        return ""
    if not shape:
        return "scalar"
    if all(isinstance(s, list) for s in shape):
        parts = [shape_text(s) for s in shape]
        if len(set(parts)) == 1:
            return f"{len(parts)}×({parts[0]})"
        return "(" + ", ".join(parts[:3]) + (", …" if len(parts) > 3 else "") + ")"
    return "×".join(str(d) for d in shape)


def is_param(rec: NodeRecord) -> bool:
    """A lifted parameter or buffer (Dynamo placeholder ``l_self_..._parameters_...``) or a
    ``get_attr`` node (symbolic tracing)."""
    if rec.op == "get_attr":
        return True
    return rec.op == "placeholder" and ("_parameters_" in rec.name or "_buffers_" in rec.name)


def display_name(rec: NodeRecord) -> str:
    """A placeholder's readable name: Dynamo's ``l_self_modules_towers_modules_0_modules_fc1_parameters_weight_``
    -> ``towers.0.fc1.weight``; ``l_x_`` -> ``x``; other nodes keep their name."""
    name = rec.name
    if rec.op != "placeholder":
        return name
    m = re.fullmatch(r"l_(?:self_)?(.*?)_?", name)
    if not m:
        return name
    core = m.group(1)
    core = re.sub(r"^modules_", "", core)
    core = re.sub(r"_(?:modules|parameters|buffers)_", ".", core)
    return core or name


def _esc(text: str) -> str:
    """Text for a DOT label: backslashes doubled so only our own ``\\n`` are escapes."""
    return str(text).replace("\\", "\\\\")


def _cut(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, an ellipsis marking the cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def label_lines(rec: NodeRecord, folded: int = 0, count: int = 1) -> list[str]:
    """The label's lines, built from the record's fields (never by parsing display text):
    name; op and short target (getitem: its index); shape and dtype; ``+N params`` when
    parameters were folded into this node; ``×k parallel`` for a folded class."""
    sd = " ".join(x for x in (shape_text(rec.shape), _DTYPE_SHORT.get(rec.dtype or "", rec.dtype or "")) if x)
    if rec.op == "placeholder":
        lines = [display_name(rec), sd]
    elif rec.op == MODULE_OP:
        size = f"{rec.args[0]} nodes" if rec.args else ""
        lines = [rec.module, f"{rec.module_type} · {size}" if rec.module_type else size, sd]
    elif rec.op == "output":
        lines = ["output"]
    elif rec.op == "get_attr":
        lines = [rec.target, sd]
    else:
        t = rec.short_target
        if rec.op == "call_method":
            t = f".{t}()"
        elif rec.op == "call_module":
            t = f"{rec.target} ({rec.module_type or 'module'})"
        if t == "getitem" and len(rec.args) >= 2:
            t = f"getitem [{_cut(arg_text(rec.args[1]), 18)}]"
        redundant = re.fullmatch(re.escape(t) + r"(_\d+)?", rec.name)  # linear_3 is a linear
        lines = [rec.name, sd] if redundant else [rec.name, t, sd]
    if folded:
        lines.append(f"+{folded} param{'s' if folded > 1 else ''}")
    if count > 1:
        lines[0] = f"{lines[0]} … ×{count}"
    return [x for x in lines if x]


def node_label(rec: NodeRecord, folded: int = 0, count: int = 1) -> str:
    """Label text (DOT ``\\n``-joined lines of :func:`label_lines`)."""
    return "\\n".join(_esc(x) for x in label_lines(rec, folded, count))


def arg_changes(old: NodeRecord, new: NodeRecord) -> list[tuple[str, str, str]]:
    """Constant arguments a rewrite changed in place: ``(where, old text, new text)`` for
    each positional argument (``args[i]``) or keyword whose value differs and holds no
    node reference (a changed node reference is a rewiring, marked separately).
    ``normalize_split`` turning ``split(x, 16)`` into ``split(x, [16, 16, 16])`` gives
    ``[("args[1]", "16", "[16, 16, 16]")]``."""
    out = []
    for i in range(max(len(old.args), len(new.args))):
        a = old.args[i] if i < len(old.args) else None
        b = new.args[i] if i < len(new.args) else None
        if a != b and not _has_ref(a) and not _has_ref(b):
            out.append(
                (f"args[{i}]", "—" if i >= len(old.args) else arg_text(a), "—" if i >= len(new.args) else arg_text(b))
            )
    for k in dict.fromkeys([*old.kwargs, *new.kwargs]):
        a, b = old.kwargs.get(k), new.kwargs.get(k)
        if a != b and not _has_ref(a) and not _has_ref(b):
            out.append((k, "—" if k not in old.kwargs else arg_text(a), "—" if k not in new.kwargs else arg_text(b)))
    return out


def _has_ref(a) -> bool:
    if isinstance(a, dict):
        return ("node" in a and len(a) == 1) or any(_has_ref(v) for v in a.values())
    if isinstance(a, list):
        return any(_has_ref(v) for v in a)
    return False


def _html_label(lines: list[str], changes: list[tuple[str, str, str]], palette: Palette = STANDARD) -> str:
    """An HTML-like label: the plain lines, then one line per changed argument with the
    old value struck through (red) and the new one beside it (green; the palette's)."""
    rows = [_html(x) for x in lines]
    for where, old, new in changes:
        rows.append(
            f'{_html(where)}: <FONT COLOR="{palette.changed_old}"><S>{_html(_cut(old, 24))}</S></FONT> '
            f'<FONT COLOR="{palette.changed_new}">{_html(_cut(new, 24))}</FONT>'
        )
    return "<" + "<BR/>".join(rows) + ">"


def node_tooltip(rec: NodeRecord, members: list[str] | None = None) -> str:
    """Hover text: name, op, full target and arguments, module and source line; for a
    folded class, how many parallel copies it stands for and their names."""
    if rec.op == MODULE_OP:
        lines = [
            f"module {rec.module}"
            + (f" ({rec.module_type})" if rec.module_type else "")
            + f": {rec.args[0]} nodes folded into this node"
        ]
    else:
        lines = [f"{rec.name}  ({rec.op})", f"{rec.target}({rec.args_text(200)})"]
    if members:
        lines.insert(0, f"×{len(members)} parallel copies: {_ranges(tuple(members))}")
    if rec.module and rec.op != MODULE_OP:
        lines.append(f"module: {rec.module}" + (f" ({rec.module_type})" if rec.module_type else ""))
    if rec.source:
        lines.append(rec.source)
    return "\\n".join(_esc(x) for x in lines)


@functools.lru_cache(maxsize=256)
def _ranges(names: tuple[str, ...]) -> str:
    return name_ranges(names)


def name_ranges(names) -> str:
    """Every name, numbered runs compressed: ``linear, linear_1, …, linear_127, relu_3`` ->
    ``linear, linear_1…linear_127, relu_3`` (so a folded class of 128 accounts for all
    members in one line)."""
    out: list[str] = []
    run: list[tuple[str, int, str]] = []

    def flush():
        if len(run) > 2:
            out.append(f"{run[0][2]}…{run[-1][2]}")
        else:
            out.extend(r[2] for r in run)
        run.clear()

    for n in names:
        m = _NUMBERED.fullmatch(n)
        if m and run and m.group(1) == run[-1][0] and int(m.group(2)) == run[-1][1] + 1:
            run.append((m.group(1), int(m.group(2)), n))
            continue
        flush()
        if m:
            run.append((m.group(1), int(m.group(2)), n))
        else:
            out.append(n)
    flush()
    return ", ".join(out)


# --------------------------------------------------------------------------- selection


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


#: a marked view of a graph with more nodes than this is drawn from a region around the marks
#: (grown at most ``REGION_FACTOR`` × ``max_nodes`` nodes before folding), so its cost follows
#: the region, not the graph: at 85,000 nodes a whole-graph pass costs more than the 0.1 s budget
LOCAL_ABOVE = 3000
REGION_FACTOR = 12


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
    (:func:`viz.index.users_at`); computed here, O(graph), when not given. Returns
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


_NUMBERED = re.compile(r"(.*?)(\d+)")
_DIGITS = re.compile(r"(\d+)")


@functools.lru_cache(maxsize=1 << 18)
def _natural(name: str) -> tuple:
    """Sort key: ``linear_12`` after ``linear_2``."""
    return tuple(int(p) if p.isdigit() else p for p in _DIGITS.split(name))


def _topo_order(nodes: dict[str, NodeRecord], keep: set[str]) -> list[str]:
    """``keep`` in an order where every node comes after its inputs (Kahn's algorithm,
    ties in natural name order, so tower 2 comes before tower 10)."""
    import heapq

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


MODULE_OP = "module"  # the op of a folded-module node (viz only; never in a Trace)
#: a folded module's node id (DOT node name, SVG ``<title>``) is this prefix + its path
MODULE_ID = "mod:"
#: module folding is on by default when a view has more drawable nodes than this (see
#: docs/ARCHITECTURE.md, "The step viewer", for how it was measured)
MODULES_ABOVE = 100


def module_path(node_id: str) -> str | None:
    """The module path of a folded module's node id (``mod:towers.3`` -> ``towers.3``, as
    the SVG ``<title>`` of a ``class="lens-module"`` node reads); None for any other node."""
    return node_id[len(MODULE_ID) :] if node_id.startswith(MODULE_ID) else None


def collapse_modules(
    snap: GraphSnapshot, names: list[str], keep_open: set[str], unfolded=frozenset(), min_size: int = MODULE_MIN
) -> tuple[GraphSnapshot, list[str], dict[str, int]]:
    """Fold modules (:func:`viz.fold.module_owners`: the outermost closed module of each
    node's ``nn_module_stack`` path; modules holding a ``keep_open`` node or named in
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


def _mark_key(marks: Marks, n: str) -> tuple:
    return (marks.groups.get(n), n in marks.created, n in marks.erased, n in marks.rewired)


def drawn_graph(
    snap: GraphSnapshot,
    marks: Marks | None = None,
    hops: int = HOPS,
    max_nodes: int = MAX_NODES,
    full: bool = False,
    fold_params: bool = True,
    fold: bool | None = None,
    users: dict | None = None,
    n_params: int | None = None,
    modules: bool | None = False,
    unfolded=frozenset(),
    keep_open: set[str] | None = None,
) -> Drawn:
    """Choose what to draw of ``snap``: parameter placeholders folded into their users
    (``fold_params``; marked ones stay), parallel copies folded into "×k" classes
    (``fold``; None: when more than :data:`FOLD_ABOVE` nodes are drawable), then — unless
    ``full`` — the marked classes and their ``hops``-hop neighbourhood, stopping before a
    hop would pass ``max_nodes`` drawn nodes (without marks: the first ``max_nodes``).
    ``modules``: fold modules into one node each (:func:`collapse_modules`; modules
    holding a ``keep_open`` node — default: the marked ones — or named in ``unfolded``
    stay open) before the rest; None: when more than :data:`MODULES_ABOVE` nodes are drawable. Above :data:`LOCAL_ABOVE` nodes a marked view works on a region around the marks
    (:func:`_region`; ``users``/``n_params`` from :func:`viz.index.users_at` keep it
    O(region))."""
    marks = marks or Marks()
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
    if modules is None:
        modules = total - n_params > MODULES_ABOVE
    if modules:
        snap, names, weight = collapse_modules(snap, names, marked if keep_open is None else keep_open, unfolded)
    inside = set(names)
    sel_s = time.perf_counter() - t_sel
    t0, c0 = time.perf_counter(), time.process_time()
    if fold is None:
        fold = len(snap) - n_params > FOLD_ABOVE
    rep = parallel_classes(snap, names, {n: _mark_key(marks, n) for n in marked}) if fold else {}
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
        seeds = {rep.get(n, n) for n in marked if n in snap.nodes}
        if seeds:
            users: dict[str, list[str]] = {}
            for r, ins in q_inputs.items():
                for i in ins:
                    users.setdefault(i, []).append(r)
            shown, used_hops = _grow(q_inputs, users, seeds, hops, max_nodes)
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
    mods = [module_path(m) for r in order if r in weight for m in members[r]]
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


def _cluster_key(module: str | None) -> str | None:
    """Module clusters group nodes by the parent of their innermost module
    (``towers.0.fc1`` -> ``towers.0``), so one tower or block is one box."""
    if not module:
        return None
    return module.rsplit(".", 1)[0] if "." in module else module


def _clusters(d: Drawn) -> dict[str, list[str]]:
    """cluster name -> drawn ids, for modules with >= 2 connected unfolded nodes (and only
    when there are >= 2 such modules)."""
    by: dict[str, list[str]] = {}
    for n in d.order:
        key = _cluster_key(d.recs[n].module) if n not in d.members else None
        if key is not None:
            by.setdefault(key, []).append(n)
    real = {"cluster_" + re.sub(r"\W", "_", k): v for k, v in by.items() if len(v) >= 2 and _connected(d.inputs, v)}
    return real if len(real) >= 2 else {}


# --------------------------------------------------------------------------- DOT


def _graph(title: str, palette: Palette = STANDARD) -> graphviz.Digraph:
    g = graphviz.Digraph(name="G")
    g.attr(
        rankdir="TB",
        newrank="true",
        fontname="Helvetica",
        fontsize="12",
        nodesep="0.25",
        ranksep="0.35",
        label=_esc(title),
        labelloc="t",
        labeljust="l",
    )
    g.attr(
        "node",
        shape="box",
        style="rounded,filled",
        fontname="Helvetica",
        fontsize="10",
        margin="0.08,0.03",
        height="0.3",
        color=palette.border,
        fillcolor=PLAIN_FILL,
        penwidth="1",
    )
    g.attr("edge", color=palette.edge, arrowsize="0.6", penwidth="0.8")
    return g


def emit(
    d: Drawn,
    marks: Marks,
    title: str = "",
    clusters: bool = True,
    legend_in_graph: bool = True,
    layout: Layout | None = None,
    changes: dict[str, list] | None = None,
    ghosts: bool = False,
    provenance: list[tuple[str, str]] = (),
    palette: Palette = STANDARD,
) -> tuple[graphviz.Digraph, list[LegendEntry], list[str]]:
    """The DOT graph of ``d`` with ``marks``; returns (graph, legend rows, notes).

    ``layout``: pin every node (and edge spline) to it, for ``neato -n2`` (the legend and
    note nodes are then left to the viewer). ``changes``: constant arguments changed in
    place per node (:func:`arg_changes`), drawn struck through / new. ``ghosts``: draw
    erased nodes faded (the diff view). ``provenance``: (old, new) pairs drawn as dashed
    purple arrows from a replaced node to its replacement. ``palette``: the marks' colours
    (:mod:`viz.palette`)."""
    changes = changes or {}
    g = _graph(title, palette)
    boxes = _clusters(d) if clusters else {}
    if layout is not None:
        boxes = {k: v for k, v in boxes.items() if k in layout.clusters}
    in_box = {n for v in boxes.values() for n in v}
    for key, names in boxes.items():
        with g.subgraph(name=key) as c:
            c.attr(
                label=_esc(_cluster_key(d.recs[names[0]].module) or ""),
                style="rounded,dashed",
                color="#bbbbbb",
                fontcolor="#888888",
                fontsize="10",
                labeljust="l",
            )
            if layout is not None:
                c.attr(bb=layout.clusters[key])
            for n in names:
                _add_node(c, d, n, marks, layout, changes.get(n), ghosts, palette)
    for n in d.order:
        if n not in in_box:
            _add_node(g, d, n, marks, layout, changes.get(n), ghosts, palette)
    for (src, dst), k in d.edge_mult.items():
        attrs = {}
        if k > 1:
            attrs.update(penwidth="2", tooltip=f"{k} edges")
        if layout is not None:
            pos = layout.edges.get((src, dst))
            if pos is None and (src not in layout.nodes or dst not in layout.nodes):
                continue
            if pos is not None:
                attrs["pos"] = pos
        _edge(g, src, dst, attrs)
    for old, new in provenance:
        if layout is None or (old in layout.nodes and new in layout.nodes):
            _edge(
                g,
                old,
                new,
                {
                    "color": palette.provenance,
                    "style": "dashed",
                    "penwidth": "1.5",
                    "constraint": "false",
                    "arrowhead": "vee",
                    "tooltip": f"{old} replaced by {new}",
                },
            )
    shown = {m for n in d.order for m in d.members.get(n, [n])}
    legend = legend_entries(marks, shown, palette)
    if ghosts and any(n in marks.erased for n in d.order):
        legend = [e if not e.text.startswith("erased") else replace(e, fill=palette.ghost_fill) for e in legend]
    if provenance:
        legend.append(
            LegendEntry("#ffffff", palette.provenance, f"replaced by (dashed arrow, {len(provenance)})", dashed=True)
        )
    if changes:
        legend.append(
            LegendEntry(
                "#ffffff",
                palette.changed_old,
                f"arguments changed in place ({len(changes)}): old struck through, new in green",
            )
        )
    if d.modules:
        legend.append(
            LegendEntry(
                palette.module_fill, palette.module_border, f"folded module ({len(d.modules)}; its node count inside)"
            )
        )
    notes = []
    if d.folded_params:
        notes.append(f"{d.folded_params} parameter placeholders folded into their users")
    if d.members:
        notes.append(
            f"{sum(len(v) for v in d.members.values()):,} parallel nodes drawn as "
            f"{len(d.members)} '… ×k' nodes (hover one for its members)"
        )
    if d.elided:
        around = "the marked nodes" if marks.names() else "the first nodes in graph order"
        notes.append(
            f"… {d.elided:,} nodes not shown (showing {d.hops}-hop neighbourhood of {around}; "
            f"{len(d.order):,} drawn of {d.total:,})"
        )
    if layout is None and legend_in_graph:
        _add_legend(g, legend, [x for x in notes if not x.startswith("…")])
    if layout is None and d.elided:
        around = "the marked nodes" if marks.names() else "the first nodes in graph order"
        g.node(
            "__elided__",
            label=f"… {d.elided:,} nodes not shown\\n(showing {d.hops}-hop neighbourhood of "
            f"{around}; {len(d.order):,} of {d.total:,} drawn)",
            shape="note",
            style="filled",
            fillcolor="#fff8e1",
            color="#999999",
            fontsize="10",
        )
    if layout is not None:
        for a in anchors(layout.bb):
            g.body.append("\t" + a + "\n")
    return g, legend, notes


_BARE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|-?(?:\.\d+|\d+(?:\.\d*)?)")
_KEYWORDS = {"node", "edge", "graph", "digraph", "subgraph", "strict"}


def _value(v: str) -> str:
    """A DOT attribute value: bare when it is an ID or a number, else double-quoted. Text
    values went through :func:`_esc` (every backslash doubled), so no quote in them is
    escaped already; each is escaped here."""
    if _BARE.fullmatch(v) and v.lower() not in _KEYWORDS:
        return v
    return '"' + v.replace('"', '\\"') + '"'


def _id(name: str) -> str:
    """A node id for DOT (``mod:<path>`` is quoted whole: its colon is no port)."""
    return _value(name)


def _attr_text(attrs: dict) -> str:
    """DOT attributes (an HTML-like ``<...>`` label as it is) as ``k=v`` pairs."""
    return " ".join(
        f"{k}={v}" if k == "label" and v[:1] == "<" and v[-1:] == ">" else f"{k}={_value(v)}" for k, v in attrs.items()
    )


def _edge(g: graphviz.Digraph, src: str, dst: str, attrs: dict) -> None:
    g.body.append(f"\t{_id(src)} -> {_id(dst)} [{_attr_text(attrs)}]\n" if attrs else f"\t{_id(src)} -> {_id(dst)}\n")


#: per-record memo of node statements, keyed by the record's identity and how it is drawn: a
#: step draws the same records in its union layout and three views, the next step mostly
#: the same records again (a Trace shares unchanged NodeRecords between its graphs)
_STMTS: dict[tuple, tuple[NodeRecord, str]] = {}
_STMTS_MAX = 100_000


def _node_text(
    rec: NodeRecord,
    marks: Marks,
    params: int,
    members: list[str] | None,
    changes: list | None,
    ghosts: bool,
    palette: Palette,
) -> str:
    key = (
        id(rec),
        params,
        tuple(members) if members else None,
        tuple(changes) if changes else None,
        ghosts,
        _mark_key(marks, rec.name),
        palette.name,
    )
    hit = _STMTS.get(key)
    if hit is not None and hit[0] is rec:
        return hit[1]
    try:
        text = _attr_text(_node_attrs(rec, marks, params, members, changes, ghosts, palette))
    except Exception as e:  # noqa: BLE001 - a node that cannot be labelled is drawn with the reason, not a traceback
        text = _attr_text(
            {
                "label": _esc(rec.name) + "\\n" + _esc(f"cannot label this node: {type(e).__name__}: {e}"),
                "color": palette.erased_border,
                "fontcolor": palette.erased_border,
            }
        )
    if len(_STMTS) > _STMTS_MAX:
        _STMTS.clear()
    _STMTS[key] = (rec, text)  # holding the record keeps its id from being reused while cached
    return text


def _add_node(
    g: graphviz.Digraph,
    d: Drawn,
    n: str,
    marks: Marks,
    layout: Layout | None,
    changes: list | None,
    ghosts: bool,
    palette: Palette = STANDARD,
) -> None:
    text = _node_text(d.recs[n], marks, d.params.get(n, 0), d.members.get(n), changes, ghosts, palette)
    if layout is not None:
        pos = layout.nodes.get(n)
        if pos is None:
            return
        x, y, w, h = pos
        text += f' pos="{x:.2f},{y:.2f}!" width={w:.3f} height={h:.3f} fixedsize=true'
    g.body.append(f"\t{_id(n)} [{text}]\n")


def _node_attrs(
    rec: NodeRecord,
    marks: Marks,
    params: int,
    members: list[str] | None,
    changes: list | None,
    ghosts: bool,
    palette: Palette = STANDARD,
) -> dict:
    count = len(members) if members else 1
    if changes:
        attrs = {"label": _html_label(label_lines(rec, params, count), changes, palette)}
    else:
        attrs = {"label": node_label(rec, params, count)}
    attrs["tooltip"] = node_tooltip(rec, members)
    if count > 1:
        attrs["peripheries"] = "2"
    if rec.op == MODULE_OP:
        attrs.update(
            {
                "shape": "folder",
                "style": "filled",
                "fillcolor": palette.module_fill,
                "color": palette.module_border,
                "class": "lens-module",
            }
        )
    if rec.op in ("placeholder", "output", "get_attr"):
        attrs["fillcolor"] = INPUT_FILL
        if is_param(rec):
            attrs["fontcolor"] = "#555555"
    groups = palette.groups
    if rec.name in marks.groups:
        attrs["fillcolor"] = groups[marks.groups[rec.name] % len(groups)]
        attrs["penwidth"] = "1.5"
        attrs["color"] = "#333333"
    if rec.name in marks.created:
        attrs.update(color=palette.created_border, penwidth="2.5")
        if rec.name not in marks.groups:
            attrs["fillcolor"] = palette.created_fill
    if rec.name in marks.rewired and rec.name not in marks.created:
        attrs.update(color=palette.rewired_border, penwidth="2")
    if changes:
        attrs.update(color=palette.changed_old, penwidth="2")
    if rec.name in marks.erased:
        attrs.update(color=palette.erased_border, penwidth="2", style="rounded,filled,dashed")
        if ghosts:
            attrs.update(fillcolor=palette.ghost_fill, fontcolor=palette.ghost_text)
        elif rec.name not in marks.groups:  # red text on a group fill would be hard to read
            attrs["fontcolor"] = palette.erased_border
    return attrs


def graph_view(
    snap: GraphSnapshot,
    marks: Marks | None = None,
    title: str = "",
    hops: int = HOPS,
    max_nodes: int = MAX_NODES,
    full: bool = False,
    fold_params: bool = True,
    clusters: bool = True,
    legend_in_graph: bool = True,
    fold: bool | None = None,
    users: dict | None = None,
    n_params: int | None = None,
    modules: bool | None = None,
    unfolded=frozenset(),
    palette: Palette = STANDARD,
) -> GraphView:
    """Build the DOT view of ``snap`` with ``marks`` highlighted.

    What is drawn is :func:`drawn_graph` (parameter folding, parallel-copy folding, the
    ``hops``-hop cut with a note "… N nodes not shown"). ``clusters`` draws a dashed box
    per module (see :func:`_cluster_key`) when the drawn nodes come from more than one
    module; ``modules`` folds modules without marked nodes into one node each
    (:func:`collapse_modules`; None: above :data:`MODULES_ABOVE` drawable nodes), except
    those named in ``unfolded``. ``legend_in_graph`` False leaves the legend node out of the drawing (for a
    viewer that shows ``GraphView.legend`` itself); the returned legend and notes are the
    same either way. ``palette``: the marks' colours (:mod:`viz.palette`).
    """
    marks = marks or Marks()
    t0 = time.perf_counter()
    d = drawn_graph(snap, marks, hops, max_nodes, full, fold_params, fold, users, n_params, modules, unfolded)
    g, legend, notes = emit(d, marks, title, clusters, legend_in_graph, palette=palette)
    view = _view(g, title, d, marks, legend, notes, time.perf_counter() - t0)
    view.palette = palette
    return view


def _view(g, title: str, d: Drawn, marks: Marks, legend, notes, seconds: float, pinned: bool = False) -> GraphView:
    primary = set(marks.groups) | marks.created  # sites and new nodes first; erased/rewired when none
    marked = marks.names()
    focus = [n for n in d.order if n in primary] or [n for n in d.order if n in marked]
    return GraphView(
        g,
        title,
        d.total,
        len(d.order),
        d.elided,
        d.folded_params,
        d.hops,
        focus,
        legend,
        notes,
        drawn=d,
        pinned=pinned,
        parallel=sum(len(v) for v in d.members.values()),
        fold_s=d.fold_s,
        build_s=max(0.0, seconds - d.fold_s),
        marks=marks,
        modules=list(d.modules),
    )


def legend_entries(marks: Marks, shown: set[str], palette: Palette = STANDARD) -> list[LegendEntry]:
    """The legend rows for the marks that are present among the ``shown`` nodes."""
    rows = []
    groups = palette.groups
    for i in sorted({i for n, i in marks.groups.items() if n in shown}):
        label = marks.group_labels[i] if i < len(marks.group_labels) else f"group {i + 1}"
        rows.append(LegendEntry(groups[i % len(groups)], "#333333", f"pattern site: {label}"))
    if marks.created & shown:
        fill = palette.created_fill if not (marks.created & set(marks.groups)) else "#ffffff"
        rows.append(LegendEntry(fill, palette.created_border, f"created ({len(marks.created & shown)})"))
    if marks.erased & shown:
        rows.append(LegendEntry("#ffffff", palette.erased_border, f"erased ({len(marks.erased & shown)})", dashed=True))
    rewired = (marks.rewired - marks.created) & shown
    if rewired:
        rows.append(LegendEntry("#ffffff", palette.rewired_border, f"inputs rewired ({len(rewired)})"))
    return rows


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _add_legend(g: graphviz.Digraph, legend: list[LegendEntry], notes: list[str]) -> None:
    """One HTML-table node with the legend rows and the notes on what is left out."""
    rows = []
    for e in legend:
        style = ' STYLE="dashed"' if e.dashed else ""
        rows.append(
            f'<TR><TD BGCOLOR="{e.fill}" COLOR="{e.border}"{style} WIDTH="18" HEIGHT="12"></TD>'
            f'<TD ALIGN="LEFT" BORDER="0">{_html(e.text)}</TD></TR>'
        )
    rows += [f'<TR><TD COLSPAN="2" BORDER="0" ALIGN="LEFT">{_html(n)}</TD></TR>' for n in notes]
    table = (
        '<<TABLE BORDER="0" CELLBORDER="1" CELLSPACING="3" CELLPADDING="2">'
        '<TR><TD COLSPAN="2" BORDER="0" ALIGN="LEFT"><B>Legend</B></TD></TR>' + "".join(rows) + "</TABLE>>"
    )
    g.node("__legend__", label=table, shape="plaintext", style="", fontsize="10")


# --------------------------------------------------------------------------- steps and passes


def step_marks(
    step: Step, side: str, before: GraphSnapshot | None = None, group: int = 0, group_label: str | None = None
) -> Marks:
    """Marks of one step's ``side`` ("before" or "after"): its sites as group ``group``,
    erased nodes (before), created and rewired nodes (after). Raises ValueError for
    another ``side``."""
    if side not in ("before", "after"):
        raise ValueError(f"side must be 'before' or 'after', not {side!r}")
    labels = [""] * group + [group_label or f"step {step.index} ({step.pattern})"]
    m = Marks(groups={s: group for s in step.sites}, group_labels=labels)
    if side == "before":
        m.erased = set(step.erased)
    else:
        m.created = set(step.created)
        m.rewired = {r.name for r in step.delta.upsert} - set(step.created) if step.delta else set()
    return m


def step_view(trace: Trace, index: int, side: str, **kw) -> GraphView:
    """The graph before or after step ``index`` (1-based) with the step's marks.

    Keyword arguments go to :func:`graph_view` (hops, max_nodes, full, fold_params,
    clusters). Raises IndexError for a step the trace does not have."""
    step = trace.step(index)
    k = index - 1 if side == "before" else index
    snap = trace.graph_at(k) if side in ("before", "after") else trace.before(index)
    title = f"{side} step {index}: {step.pattern} ({step.pass_name}) — {len(snap)} nodes"
    users, n_params = _index(trace, k, snap)
    return graph_view(snap, step_marks(step, side), title=title, users=users, n_params=n_params, **kw)


def pass_view(trace: Trace, pass_name: str, side: str, **kw) -> GraphView:
    """Overview of a whole pass: the graph before its first step or after its last,
    each step's group in its own colour (sites in the before view; the nodes each step
    created, where they survive, in the after view). Raises KeyError when the pass made
    no step."""
    steps = trace.steps_of_pass(pass_name)
    if not steps:
        raise KeyError(f"pass {pass_name!r} made no step in this trace")
    if side not in ("before", "after"):
        raise ValueError(f"side must be 'before' or 'after', not {side!r}")
    first, last = steps[0].index, steps[-1].index
    snap = trace.before(first) if side == "before" else trace.after(last)
    m = Marks(group_labels=[f"step {s.index} ({s.pattern})" for s in steps])
    for i, s in enumerate(steps):
        for n in s.sites:
            if n in snap.nodes:
                m.groups.setdefault(n, i)
        if side == "before":
            m.erased |= {n for n in s.erased if n in snap.nodes}
        else:
            for n in s.created:
                if n in snap.nodes:
                    m.created.add(n)
                    m.groups[n] = i
    title = f"{side} pass {pass_name} (steps {first}–{last}, {len(steps)} groups) — {len(snap)} nodes"
    return graph_view(snap, m, title=title, **kw)


def snapshot_view(trace: Trace, k: int = 0, **kw) -> GraphView:
    """The graph after ``k`` steps (0: as captured), nothing marked."""
    snap = trace.graph_at(k)
    what = "captured graph" if k == 0 else f"graph after step {k}"
    return graph_view(snap, None, title=f"{what} — {len(snap)} nodes", **kw)


# --------------------------------------------------------------------------- one geometry per step


@dataclass
class StepPicture:
    """A step's before, after and diff views drawn on one layout.

    The layout is of the union of what the before and after views draw (the diff view's
    nodes), so every node both views draw sits at the same coordinates, and all three
    drawings have the same bounding box (one zoom fits all). ``layout.note`` says when the
    layout is a fallback; ``changes`` lists the constant arguments the step changed in
    place per node (:func:`arg_changes`)."""

    index: int
    before: GraphView
    after: GraphView
    diff: GraphView
    layout: Layout
    changes: dict[str, list[tuple[str, str, str]]]
    #: seconds per phase: ``rebuild_s`` (the trace's before/after graphs), ``index_s`` (moving
    #: the users index along), ``fold_s``, ``dot_build_s`` (selection, labels, DOT of the
    #: union and the three views; ``dot_build_cpu_s``: the same in this process's CPU seconds,
    #: which a busy machine does not inflate), ``layout_s`` (0 when a trace-wide layout was reused)
    timings: dict[str, float] = field(default_factory=dict)

    def views(self) -> dict[str, GraphView]:
        return {"before": self.before, "after": self.after, "diff": self.diff}


class _Timer:
    """Wall-clock and CPU seconds (this process) of the blocks run under it."""

    def __init__(self):
        self.wall = self.cpu = 0.0

    def __enter__(self):
        self._w, self._c = time.perf_counter(), time.process_time()

    def __exit__(self, *exc):
        self.wall += time.perf_counter() - self._w
        self.cpu += time.process_time() - self._c


def _union(a: Drawn, b: Drawn) -> Drawn:
    order = list(dict.fromkeys(a.order + b.order))
    recs = {**a.recs, **b.recs}
    members = {n: max(a.members.get(n, []), b.members.get(n, []), key=len) for n in {*a.members, *b.members}}
    inputs = {n: list(dict.fromkeys(a.inputs.get(n, []) + b.inputs.get(n, []))) for n in order}
    mult = dict(a.edge_mult)
    for e, k in b.edge_mult.items():
        mult[e] = max(k, mult.get(e, 0))
    params = {n: max(a.params.get(n, 0), b.params.get(n, 0)) for n in order}
    return Drawn(
        order,
        recs,
        members,
        inputs,
        mult,
        params,
        max(a.total, b.total),
        min(a.elided, b.elided),
        max(a.folded_params, b.folded_params),
        a.hops,
        a.fold_s + b.fold_s,
        modules=list(dict.fromkeys(a.modules + b.modules)),
    )


def _label_size(label: str) -> tuple[float, float]:
    """Estimated (width, height) in inches of a 10 pt Helvetica box label (plain or HTML)."""
    text = re.sub(r"<[^>]+>", "\n", label.replace("<BR/>", "\n")).replace("\\n", "\n")
    lines = [x for x in text.split("\n") if x.strip()] or [""]
    return max(0.6, 0.075 * max(len(x) for x in lines) + 0.2), 0.17 * len(lines) + 0.12


def _sizes(d: Drawn, changes: dict) -> dict[str, tuple[float, float]]:
    out = {}
    for n in d.order:
        rec, params, count, ch = d.recs[n], d.params.get(n, 0), d.count(n), changes.get(n, [])
        key = ("size", id(rec), params, count, tuple(ch))
        hit = _STMTS.get(key)
        if hit is None or hit[0] is not rec:
            lines = label_lines(rec, params, count) + [f"{w}: {o} {nw}" for w, o, nw in ch]
            hit = _STMTS[key] = (rec, _label_size("\n".join(lines)))
        out[n] = hit[1]
    return out


def _rep_map(d: Drawn) -> dict[str, str]:
    return {m: r for r, ms in d.members.items() for m in ms}


#: a trace whose graphs, all steps together, draw at most this many distinct nodes gets one
#: layout for all its steps (:func:`trace_layout`)
STABLE_MAX = 300


def _index(trace: Trace, k: int, snap: GraphSnapshot) -> tuple[dict | None, int | None]:
    """(users index, parameter count) of a big graph from the trace's running index
    (:func:`viz.index.users_at`); (None, None) for a small one (computed when needed)."""
    if len(snap) <= LOCAL_ABOVE:
        return None, None
    return users_at(trace, k, snap, is_param)


def _drawable(snap: GraphSnapshot, n_params: int | None, fold_params: bool) -> int:
    """Nodes a view of ``snap`` can draw: all but the folded parameter placeholders."""
    if not fold_params:
        return len(snap)
    return len(snap) - (n_params if n_params is not None else sum(1 for r in snap.nodes.values() if is_param(r)))


def trace_layout(
    trace: Trace,
    max_nodes: int = MAX_NODES,
    fold_params: bool = True,
    clusters: bool = True,
    budget_s: float = LAYOUT_BUDGET_S,
) -> Layout | None:
    """One layout for every step of a small trace, so consecutive steps keep every node
    they share where it was (scrubbing the steps moves nothing the steps did not touch).

    It is the layout of the union of all the trace's graphs (captured graph and each
    step's after-graph, parameters folded as in the views). None — each step then gets
    its own before/after layout — when any graph would be cut (more than ``max_nodes``
    drawable nodes), would fold parallel copies, or the union passes :data:`STABLE_MAX`."""
    drawn, changes = [], {}
    for k in range(len(trace.steps) + 1):
        snap = trace.graph_at(k)
        d = drawn_graph(snap, None, max_nodes=max_nodes, fold_params=fold_params, fold=False)
        if d.elided or len(d.order) > FOLD_ABOVE:
            return None
        drawn.append(d)
        if k:
            changes.update(_step_changes(trace.step(k), trace.graph_at(k - 1), snap, d))
    du = drawn[0]
    for d in drawn[1:]:
        du = _union(du, d)
        if len(du.order) > STABLE_MAX:
            return None
    g, _, _ = emit(du, Marks(), "", clusters, legend_in_graph=False, changes=changes)
    return bounded_layout(g.source, du.order, du.inputs, _sizes(du, changes), budget_s)


def _step_changes(step: Step, before: GraphSnapshot, after: GraphSnapshot, da: Drawn) -> dict[str, list]:
    """Constant arguments ``step`` changed, per drawn node of the after side: in a node it
    rewired, or between a replaced node and its replacement of the same op
    (normalize_split: ``split(x, 16)`` -> ``split_1(x, [16, 16, ...])``)."""
    changes = {}
    pairs = [(r.name, r.name) for r in (step.delta.upsert if step.delta else [])]
    pairs += list(step.replaced.items())
    for old, new in pairs:
        o, n = before.nodes.get(old), after.nodes.get(new)
        if o is not None and n is not None and new in da.recs and o.target == n.target:
            ch = arg_changes(o, n)
            if ch:
                changes[new] = ch
    return changes


def step_picture(
    trace: Trace,
    index: int,
    hops: int = HOPS,
    max_nodes: int = MAX_NODES,
    full: bool = False,
    fold_params: bool = True,
    fold: bool | None = None,
    clusters: bool = True,
    budget_s: float = LAYOUT_BUDGET_S,
    layout: Layout | None = None,
    modules: bool | None = None,
    unfolded=frozenset(),
    palette: Palette = STANDARD,
) -> StepPicture:
    """Step ``index``'s before, after and diff views on one shared layout.

    Each side draws what :func:`drawn_graph` selects for it (same options; folding is on
    for both when either side has more than :data:`FOLD_ABOVE` drawable nodes).
    ``layout``: a :func:`trace_layout` to draw on (used when it places every node drawn
    here). ``modules``: fold modules the step did not touch (:func:`collapse_modules`; a
    module holding a node marked on either side stays open on both), except those named in
    ``unfolded``; None: when either side has more than :data:`MODULES_ABOVE` drawable
    nodes. Otherwise their union is laid out once with :func:`viz.layout.bounded_layout` (``budget_s`` seconds of
    ``dot``, else the layered fallback); the diff view draws the union: erased nodes
    ghosted, created nodes marked, a dashed arrow from each replaced node to its
    replacement (``Step.replaced``, provenance), and changed arguments struck through /
    new. ``palette``: the marks' colours (:data:`viz.palette.PRESENTATION` for presentation
    mode). Raises IndexError for a step the trace does not have, RenderError when Graphviz
    is missing or fails."""
    step = trace.step(index)
    clock = time.perf_counter
    t = clock()
    before, after = trace.before(index), trace.after(index)
    rebuild_s = clock() - t
    mb, ma = step_marks(step, "before"), step_marks(step, "after")
    build, moving = _Timer(), _Timer()
    with moving:
        ib = _index(trace, index - 1, before)  # the running index moves on to the after side below: use it first
    if fold is None or modules is None:
        drawable = max(len(before), len(after)) - (len(before) - _drawable(before, ib[1], fold_params))
        fold = drawable > FOLD_ABOVE if fold is None else fold
        modules = drawable > MODULES_ABOVE if modules is None else modules
    touched = mb.names() | ma.names()
    with build:
        db = drawn_graph(
            before,
            mb,
            hops,
            max_nodes,
            full,
            fold_params,
            fold,
            *ib,
            modules=modules,
            unfolded=unfolded,
            keep_open=touched,
        )
    with moving:
        ia = _index(trace, index, after)
    with build:
        da = drawn_graph(
            after,
            ma,
            hops,
            max_nodes,
            full,
            fold_params,
            fold,
            *ia,
            modules=modules,
            unfolded=unfolded,
            keep_open=touched,
        )
        changes = _step_changes(step, before, after, da)
        du = _union(db, da)
        md = Marks(
            groups=dict(mb.groups),
            group_labels=list(mb.group_labels),
            erased=set(mb.erased),
            created=set(ma.created),
            rewired=set(ma.rewired),
        )
        rb, ra = _rep_map(db), _rep_map(da)
        prov = list(
            dict.fromkeys(
                (rb.get(o, o), ra.get(n, n))
                for o, n in step.replaced.items()
                if rb.get(o, o) in du.recs and ra.get(n, n) in du.recs and rb.get(o, o) != ra.get(n, n)
            )
        )
    layout_s = 0.0
    if layout is None or any(n not in layout.nodes for n in du.order):
        with build:
            g, _, _ = emit(du, md, "", clusters, legend_in_graph=False, changes=changes)
            sizes = _sizes(du, changes)
        layout = bounded_layout(g.source, du.order, du.inputs, sizes, budget_s)
        layout_s = layout.seconds
    views = {}
    with build:
        for side, d, m, kw in (
            ("before", db, mb, {}),
            ("after", da, ma, {"changes": changes}),
            ("diff", du, md, {"changes": changes, "ghosts": True, "provenance": prov}),
        ):
            gs, legend, notes = emit(d, m, "", clusters, legend_in_graph=False, layout=layout, palette=palette, **kw)
            if layout.note:
                notes.append(layout.note)
            views[side] = _view(
                gs, f"{side} step {index}: {step.pattern} ({step.pass_name})", d, m, legend, notes, 0.0, pinned=True
            )
            views[side].palette = palette
    fold_s, fold_cpu = db.fold_s + da.fold_s, db.fold_cpu_s + da.fold_cpu_s
    for v in views.values():
        v.build_s = max(0.0, build.wall - fold_s) / 3
    timings = {
        "rebuild_s": rebuild_s,
        "index_s": moving.wall,
        "fold_s": fold_s,
        "dot_build_s": max(0.0, build.wall - fold_s),
        "dot_build_cpu_s": max(0.0, build.cpu - fold_cpu),
        "layout_s": layout_s,
    }
    return StepPicture(index, views["before"], views["after"], views["diff"], layout, changes, timings)


# --------------------------------------------------------------------------- rendering


@dataclass
class Rendered:
    """An SVG and how it was laid out: ``note`` is empty unless a fallback layout was used."""

    svg: str
    note: str = ""
    seconds: float = 0.0


def render_view(
    view: GraphView | graphviz.Digraph | str, budget_s: float = LAYOUT_BUDGET_S, timeout_s: float = 20.0
) -> Rendered:
    """Lay out and draw a view. A pinned view (from :func:`step_picture`) is drawn as laid
    out (``neato -n2``). Otherwise ``dot`` runs with :func:`viz.layout.dot_limits` for the
    view's size; a view that ``dot`` does not finish within ``budget_s`` seconds is drawn
    with the layered fallback and ``note`` says so. DOT source (str or Digraph) has no
    fallback: past ``timeout_s`` it raises RenderError, as when Graphviz fails."""
    t0 = time.perf_counter()
    if isinstance(view, GraphView) and view.pinned:
        return Rendered(draw_pinned(view.source, timeout_s), "", time.perf_counter() - t0)
    source = view if isinstance(view, str) else view.source
    n = view.shown if isinstance(view, GraphView) else source.count("\n")
    limits = [f"-G{k}={v}" for k, v in dot_limits(n).items()]
    wait = budget_s if isinstance(view, GraphView) and view.drawn is not None else timeout_s
    try:
        out = subprocess.run(["dot", "-Tsvg", *limits], input=source.encode(), capture_output=True, timeout=wait)
    except subprocess.TimeoutExpired as e:
        if not (isinstance(view, GraphView) and view.drawn is not None):
            raise RenderError(f"Graphviz layout of this graph did not finish within {wait:g} s") from e
        d = view.drawn
        marks_note = f"Graphviz dot did not lay out {n:,} nodes within {wait:g} s"
        layout = layered_layout(
            d.order,
            d.inputs,
            _sizes(d, {}),
            note=marks_note + "; drawn with a simple layered layout instead (ranks by longest path, straight edges)",
        )
        g, _, _ = emit(d, view.marks or Marks(), "", True, legend_in_graph=False, layout=layout, palette=view.palette)
        return Rendered(draw_pinned(g.source, timeout_s), layout.note, time.perf_counter() - t0)
    except FileNotFoundError as e:
        raise RenderError("Graphviz `dot` is not installed (apt-get install graphviz)") from e
    if out.returncode != 0:
        raise RenderError(f"Graphviz dot failed: {out.stderr.decode(errors='replace').strip()[:500]}")
    return Rendered(out.stdout.decode(), "", time.perf_counter() - t0)


def render_svg(view: GraphView | graphviz.Digraph | str, timeout_s: float = 20.0) -> str:
    """The SVG text of :func:`render_view` (bounded layout; a fallback layout when ``dot``
    runs past its budget). Raises RenderError when Graphviz fails or is missing, or when
    plain DOT source takes longer than ``timeout_s`` seconds."""
    return render_view(view, timeout_s=timeout_s).svg


def responsive_svg(svg: str) -> str:
    """The SVG with its fixed width/height removed (its viewBox kept), so it scales to
    the width of its container; the XML prologue and DOCTYPE are dropped."""
    start = svg.find("<svg")
    svg = svg[start:] if start >= 0 else svg
    return re.sub(r'<svg width="[^"]*" height="[^"]*"', '<svg width="100%"', svg, count=1)
