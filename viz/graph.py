"""Trace / Step -> Graphviz DOT: before/after graphs of a step with its pattern sites highlighted.

Marks (what the colours mean, also drawn as a legend inside every graph):

* **pattern site** — the nodes the step matched, filled with their fused group's
  colour. A step is one group; a whole-pass overview gives each step's group its own
  colour (:data:`GROUP_COLOURS`, cycled).
* **created** — nodes the rewrite added: green border on a light-green fill (in a pass
  overview, the fill is the creating step's group colour).
* **erased** — nodes the rewrite removed, drawn red and dashed in the *before* view.
* **rewired** — existing nodes whose inputs the rewrite pointed at new nodes (blue border).

Big graphs: Graphviz ``dot`` needs about 2 s for 2,000 nodes and 17 s for 5,000, so a
view with more than ``max_nodes`` drawable nodes (default 300) shows only the marked
nodes and their ``hops``-hop neighbourhood (edges followed both ways), with a note node
giving how many nodes are not shown. Parameter placeholders can be folded into their
users (``fold_params``), which keeps a lifted-parameter graph readable.
"""
from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field

import graphviz

from optimus.trace import GraphSnapshot, NodeRecord, Step, Trace, arg_text

#: fill colours of fused groups (pattern sites), one per step in a pass overview
GROUP_COLOURS = ("#ffd54f", "#81d4fa", "#ce93d8", "#ffab91", "#f48fb1", "#80cbc4", "#e6ee9c", "#b39ddb",
                 "#ffcc80", "#90caf9")
CREATED_FILL, CREATED_BORDER = "#c8e6c9", "#2e7d32"
ERASED_BORDER = "#c62828"
REWIRED_BORDER = "#1565c0"
PLAIN_FILL, INPUT_FILL = "#ffffff", "#eeeeee"

#: default number of drawable nodes above which a view is cut to the marked nodes' neighbourhood
MAX_NODES = 300
#: default neighbourhood radius (hops along edges, both directions) of a cut view
HOPS = 2

_DTYPE_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "int64": "i64",
                "int32": "i32", "int8": "i8", "uint8": "u8", "bool": "bool"}


class RenderError(RuntimeError):
    """Graphviz could not lay out a graph: it ran past its time limit, or ``dot`` failed."""


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
    legend as data, for a viewer that keeps it on screen while zoomed.
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


def node_label(rec: NodeRecord, folded: int = 0) -> str:
    """Label lines (DOT ``\\n``-joined): name; op and short target (getitem: its index);
    shape and dtype; ``+N params`` when parameters were folded into this node.
    Placeholders show their readable name and shape."""
    sd = " ".join(x for x in (shape_text(rec.shape), _DTYPE_SHORT.get(rec.dtype or "", rec.dtype or "")) if x)
    if rec.op == "placeholder":
        lines = [display_name(rec), sd]
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
    return "\\n".join(_esc(x) for x in lines if x)


def node_tooltip(rec: NodeRecord) -> str:
    """Hover text: name, op, full target and arguments, module and source line."""
    lines = [f"{rec.name}  ({rec.op})", f"{rec.target}({rec.args_text(200)})"]
    if rec.module:
        lines.append(f"module: {rec.module}" + (f" ({rec.module_type})" if rec.module_type else ""))
    if rec.source:
        lines.append(rec.source)
    return "\\n".join(_esc(x) for x in lines)


# --------------------------------------------------------------------------- selection


def neighbourhood(snap: GraphSnapshot, seeds: set[str], hops: int, max_nodes: int) -> tuple[set[str], int]:
    """The ``seeds`` plus every node within ``hops`` edges of them (both directions).

    Grows one hop at a time and stops before a hop would take the set past
    ``max_nodes`` (the seeds themselves are always kept). Returns (nodes, hops used).
    """
    users = snap.users()
    keep = {s for s in seeds if s in snap.nodes}
    frontier = set(keep)
    used = 0
    for _ in range(hops):
        nxt = set()
        for n in frontier:
            nxt.update(snap.nodes[n].inputs)
            nxt.update(users.get(n, ()))
        nxt = {n for n in nxt if n in snap.nodes} - keep
        if not nxt:  # the seeds' whole component is already in
            return keep, hops
        if len(keep) + len(nxt) > max_nodes:
            break
        keep |= nxt
        frontier = nxt
        used += 1
    return keep, used


def _cluster_key(module: str | None) -> str | None:
    """Module clusters group nodes by the parent of their innermost module
    (``towers.0.fc1`` -> ``towers.0``), so one tower or block is one box."""
    if not module:
        return None
    return module.rsplit(".", 1)[0] if "." in module else module


def _connected(snap: GraphSnapshot, names: list[str]) -> bool:
    """Whether ``names`` form one weakly connected piece using only edges among
    themselves. A module whose nodes a fusion scattered over the graph is not boxed: its
    box would stretch across the fused nodes and overlap the others."""
    members = set(names)
    adj: dict[str, set[str]] = {n: set() for n in names}
    for n in names:
        for i in snap.nodes[n].inputs:
            if i in members:
                adj[n].add(i)
                adj[i].add(n)
    seen, todo = {names[0]}, [names[0]]
    while todo:
        for m in adj[todo.pop()]:
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return len(seen) == len(members)


def graph_view(snap: GraphSnapshot, marks: Marks | None = None, title: str = "", hops: int = HOPS,
               max_nodes: int = MAX_NODES, full: bool = False, fold_params: bool = True,
               clusters: bool = True, legend_in_graph: bool = True) -> GraphView:
    """Build the DOT view of ``snap`` with ``marks`` highlighted.

    When more than ``max_nodes`` nodes would be drawn and ``full`` is False, only the
    marked nodes and their ``hops``-hop neighbourhood are drawn (without marks: the
    first ``max_nodes`` nodes in graph order), plus a note node "… N nodes not shown".
    ``fold_params`` leaves unmarked parameter placeholders out and counts them on their
    users' labels. ``clusters`` draws a dashed box per module (see :func:`_cluster_key`)
    when the drawn nodes come from more than one module. ``legend_in_graph`` False leaves
    the legend node out of the drawing (for a viewer that shows ``GraphView.legend``
    itself); the returned legend and notes are the same either way.
    """
    marks = marks or Marks()
    marked = marks.names()
    folded_names = {n for n, r in snap.nodes.items() if fold_params and is_param(r) and n not in marked}
    drawable = [n for n in snap.nodes if n not in folded_names]
    used_hops: int | None = None
    if full or len(drawable) <= max_nodes:
        shown = set(drawable)
    else:
        seeds = {n for n in marked if n in snap.nodes}
        if seeds:
            sub = GraphSnapshot(r for n, r in snap.nodes.items() if n not in folded_names)
            shown, used_hops = neighbourhood(sub, seeds, hops, max_nodes)
        else:
            shown, used_hops = set(drawable[:max_nodes]), 0
    elided = len(drawable) - len(shown)

    g = graphviz.Digraph(name="G")
    g.attr(rankdir="TB", newrank="true", fontname="Helvetica", fontsize="12", nodesep="0.25", ranksep="0.35",
           label=_esc(title), labelloc="t", labeljust="l")
    g.attr("node", shape="box", style="rounded,filled", fontname="Helvetica", fontsize="10", margin="0.08,0.03",
           height="0.3", color="#777777", fillcolor=PLAIN_FILL, penwidth="1")
    g.attr("edge", color="#666666", arrowsize="0.6", penwidth="0.8")

    folded_count: dict[str, int] = {}
    for n in shown:
        folded_count[n] = sum(1 for i in dict.fromkeys(snap.nodes[n].inputs) if i in folded_names)

    by_cluster: dict[str | None, list[str]] = {}
    for n in snap.nodes:  # graph order keeps the layout stable from step to step
        if n in shown:
            key = _cluster_key(snap.nodes[n].module) if clusters else None
            by_cluster.setdefault(key, []).append(n)
    real = {k: v for k, v in by_cluster.items() if k is not None and len(v) >= 2 and _connected(snap, v)}
    if len(real) < 2:
        real = {}
    for key, names in by_cluster.items():
        if key in real:
            with g.subgraph(name="cluster_" + re.sub(r"\W", "_", key)) as c:
                c.attr(label=_esc(key), style="rounded,dashed", color="#bbbbbb", fontcolor="#888888",
                       fontsize="10", labeljust="l")
                for n in names:
                    _add_node(c, snap.nodes[n], marks, folded_count[n])
        else:
            for n in names:
                _add_node(g, snap.nodes[n], marks, folded_count[n])

    for src, dst in snap.edges():
        if src in shown and dst in shown:
            g.edge(src, dst)

    legend = legend_entries(marks, shown)
    notes = [f"{len(folded_names)} parameter placeholders folded into their users"] if folded_names else []
    if legend_in_graph:
        _add_legend(g, legend, notes)
    if elided:
        around = "the marked nodes" if marked & shown else "the first nodes in graph order"
        note = (f"… {elided:,} nodes not shown\\n(showing {used_hops}-hop neighbourhood of {around}; "
                f"{len(shown):,} of {len(snap):,} drawn)")
        g.node("__elided__", label=note, shape="note", style="filled", fillcolor="#fff8e1", color="#999999",
               fontsize="10")
        notes.append(note.replace("\\n", " "))
    primary = set(marks.groups) | marks.created  # sites and new nodes first; erased/rewired when none
    focus = [n for n in snap.nodes if n in shown and n in primary] or [n for n in snap.nodes if n in shown and n in marked]
    return GraphView(g, title, len(snap), len(shown), elided, len(folded_names), used_hops, focus, legend, notes)


def _add_node(g: graphviz.Digraph, rec: NodeRecord, marks: Marks, folded: int) -> None:
    attrs = {"label": node_label(rec, folded), "tooltip": node_tooltip(rec)}
    if rec.op in ("placeholder", "output", "get_attr"):
        attrs["fillcolor"] = INPUT_FILL
        if is_param(rec):
            attrs["fontcolor"] = "#555555"
    if rec.name in marks.groups:
        attrs["fillcolor"] = GROUP_COLOURS[marks.groups[rec.name] % len(GROUP_COLOURS)]
        attrs["penwidth"] = "1.5"
        attrs["color"] = "#333333"
    if rec.name in marks.created:
        attrs.update(color=CREATED_BORDER, penwidth="2.5")
        if rec.name not in marks.groups:
            attrs["fillcolor"] = CREATED_FILL
    if rec.name in marks.rewired and rec.name not in marks.created:
        attrs.update(color=REWIRED_BORDER, penwidth="2")
    if rec.name in marks.erased:
        attrs.update(color=ERASED_BORDER, penwidth="2", style="rounded,filled,dashed")
        if rec.name not in marks.groups:  # red text on a group fill would be hard to read
            attrs["fontcolor"] = ERASED_BORDER
    g.node(rec.name, **attrs)


def legend_entries(marks: Marks, shown: set[str]) -> list[LegendEntry]:
    """The legend rows for the marks that are present among the ``shown`` nodes."""
    rows = []
    for i in sorted({i for n, i in marks.groups.items() if n in shown}):
        label = marks.group_labels[i] if i < len(marks.group_labels) else f"group {i + 1}"
        rows.append(LegendEntry(GROUP_COLOURS[i % len(GROUP_COLOURS)], "#333333", f"pattern site: {label}"))
    if marks.created & shown:
        fill = CREATED_FILL if not (marks.created & set(marks.groups)) else "#ffffff"
        rows.append(LegendEntry(fill, CREATED_BORDER, f"created ({len(marks.created & shown)})"))
    if marks.erased & shown:
        rows.append(LegendEntry("#ffffff", ERASED_BORDER, f"erased ({len(marks.erased & shown)})", dashed=True))
    rewired = (marks.rewired - marks.created) & shown
    if rewired:
        rows.append(LegendEntry("#ffffff", REWIRED_BORDER, f"inputs rewired ({len(rewired)})"))
    return rows


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _add_legend(g: graphviz.Digraph, legend: list[LegendEntry], notes: list[str]) -> None:
    """One HTML-table node with the legend rows and the notes on what is left out."""
    rows = []
    for e in legend:
        style = ' STYLE="dashed"' if e.dashed else ""
        rows.append(f'<TR><TD BGCOLOR="{e.fill}" COLOR="{e.border}"{style} WIDTH="18" HEIGHT="12"></TD>'
                    f'<TD ALIGN="LEFT" BORDER="0">{_html(e.text)}</TD></TR>')
    rows += [f'<TR><TD COLSPAN="2" BORDER="0" ALIGN="LEFT">{_html(n)}</TD></TR>' for n in notes]
    table = ('<<TABLE BORDER="0" CELLBORDER="1" CELLSPACING="3" CELLPADDING="2">'
             '<TR><TD COLSPAN="2" BORDER="0" ALIGN="LEFT"><B>Legend</B></TD></TR>' + "".join(rows) + "</TABLE>>")
    g.node("__legend__", label=table, shape="plaintext", style="", fontsize="10")


# --------------------------------------------------------------------------- steps and passes


def step_marks(step: Step, side: str, before: GraphSnapshot | None = None, group: int = 0,
               group_label: str | None = None) -> Marks:
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
    snap = trace.before(index) if side == "before" else trace.after(index)
    title = f"{side} step {index}: {step.pattern} ({step.pass_name}) — {len(snap)} nodes"
    return graph_view(snap, step_marks(step, side), title=title, **kw)


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
    title = (f"{side} pass {pass_name} (steps {first}–{last}, {len(steps)} groups) — {len(snap)} nodes")
    return graph_view(snap, m, title=title, **kw)


def snapshot_view(trace: Trace, k: int = 0, **kw) -> GraphView:
    """The graph after ``k`` steps (0: as captured), nothing marked."""
    snap = trace.graph_at(k)
    what = "captured graph" if k == 0 else f"graph after step {k}"
    return graph_view(snap, None, title=f"{what} — {len(snap)} nodes", **kw)


# --------------------------------------------------------------------------- rendering


def render_svg(view: GraphView | graphviz.Digraph | str, timeout_s: float = 20.0) -> str:
    """Lay out a view (or DOT source) with Graphviz ``dot`` and return the SVG text.

    Raises RenderError when the layout takes longer than ``timeout_s`` seconds (the
    message says how many nodes and suggests fewer hops) or when ``dot`` fails."""
    source = view if isinstance(view, str) else view.source
    try:
        out = subprocess.run(["dot", "-Tsvg"], input=source.encode(), capture_output=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        shown = f"{view.shown:,} nodes" if isinstance(view, GraphView) else "this graph"
        raise RenderError(f"Graphviz layout of {shown} did not finish within {timeout_s:g} s; "
                          f"draw fewer nodes (fewer hops, or leave the full view off)") from e
    except FileNotFoundError as e:
        raise RenderError("Graphviz `dot` is not installed (apt-get install graphviz)") from e
    if out.returncode != 0:
        raise RenderError(f"Graphviz dot failed: {out.stderr.decode(errors='replace').strip()[:500]}")
    return out.stdout.decode()


def responsive_svg(svg: str) -> str:
    """The SVG with its fixed width/height removed (its viewBox kept), so it scales to
    the width of its container; the XML prologue and DOCTYPE are dropped."""
    start = svg.find("<svg")
    svg = svg[start:] if start >= 0 else svg
    return re.sub(r'<svg width="[^"]*" height="[^"]*"', '<svg width="100%"', svg, count=1)
