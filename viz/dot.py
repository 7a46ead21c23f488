"""Graphviz DOT of what a view draws (:class:`optimus_lens.viz.select.Drawn`) with its marks: node
statements (label, hover text, mark colours of the palette), edges (a thick one stands
for several), a dashed box per module, the legend and the notes on what was left out.

:func:`emit` writes DOT text directly (quoting every value itself, :func:`_value`) and
memoises each node's statement per record: a step draws the same records in its union
layout and three views, the next step mostly the same records again. With a
:class:`optimus_lens.viz.layout.Layout` every node and edge is pinned to its position, for
``neato -n2`` (:func:`optimus_lens.viz.layout.draw_pinned`).
"""

from __future__ import annotations

import re
from dataclasses import replace

import graphviz

from optimus_lens.core.trace import NodeRecord
from optimus_lens.viz.fold import MODULE_OP, connected
from optimus_lens.viz.labels import dot_text, html_label, html_text, label_lines, node_label, node_tooltip
from optimus_lens.viz.layout import Layout, anchors
from optimus_lens.viz.marks import LegendEntry, Marks, legend_entries, mark_key
from optimus_lens.viz.options import DEFAULT, ViewOptions
from optimus_lens.viz.palette import STANDARD, Palette
from optimus_lens.viz.select import Drawn, is_param

PLAIN_FILL, INPUT_FILL = "#ffffff", "#eeeeee"


def _cluster_key(module: str | None) -> str | None:
    """Module boxes group nodes by the parent of their innermost module
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
    real = {"cluster_" + re.sub(r"\W", "_", k): v for k, v in by.items() if len(v) >= 2 and connected(d.inputs, v)}
    return real if len(real) >= 2 else {}


def _graph(title: str, palette: Palette = STANDARD) -> graphviz.Digraph:
    g = graphviz.Digraph(name="G")
    g.attr(
        rankdir="TB",
        newrank="true",
        fontname="Helvetica",
        fontsize="12",
        nodesep="0.25",
        ranksep="0.35",
        label=dot_text(title),
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
    opts: ViewOptions = DEFAULT,
    title: str = "",
    layout: Layout | None = None,
    changes: dict[str, list] | None = None,
    ghosts: bool = False,
    provenance: list[tuple[str, str]] | tuple = (),
) -> tuple[graphviz.Digraph, list[LegendEntry], list[str]]:
    """The DOT graph of ``d`` with ``marks``; returns (graph, legend rows, notes).

    From ``opts``: ``clusters`` (a dashed box per module), ``legend_in_graph`` (the legend
    as a node; never with a ``layout``) and ``palette`` (the marks' colours,
    :mod:`optimus_lens.viz.palette`). ``layout``: pin every node (and edge spline) to it, for
    ``neato -n2`` (the legend and note nodes are then left to the viewer). ``changes``:
    constant arguments changed in place per node (:func:`optimus_lens.viz.labels.arg_changes`), drawn
    struck through / new. ``ghosts``: draw erased nodes faded (the diff view).
    ``provenance``: (old, new) pairs drawn as dashed purple arrows from a replaced node to
    its replacement."""
    changes = changes or {}
    palette = opts.palette
    g = _graph(title, palette)
    boxes = _clusters(d) if opts.clusters else {}
    if layout is not None:
        boxes = {k: v for k, v in boxes.items() if k in layout.clusters}
    in_box = {n for v in boxes.values() for n in v}
    for key, names in boxes.items():
        with g.subgraph(name=key) as c:
            c.attr(
                label=dot_text(_cluster_key(d.recs[names[0]].module) or ""),
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
    if layout is None and opts.legend_in_graph:
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


#: the longest attribute value written (characters): Graphviz's scanner refuses a token
#: of more than 16384 bytes ("longer than 16384?"), and a label or tooltip this long is unreadable
MAX_VALUE = 2000
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def bounded(v: str, limit: int = MAX_VALUE) -> str:
    """``v`` made safe inside a quoted DOT string: control characters dropped (a real
    newline or tab becomes a ``\\n`` escape or a space), characters UTF-8 cannot
    encode (lone surrogates) replaced, and cut to ``limit`` characters with an ellipsis,
    never inside a backslash escape (an odd number of trailing backslashes would escape
    the closing quote)."""
    v = v.replace("\r\n", "\\n").replace("\n", "\\n").replace("\t", " ")
    v = _CONTROL.sub("", v)
    if any("\ud800" <= c <= "\udfff" for c in v):
        v = v.encode("utf-8", "replace").decode("utf-8")
    if len(v) > limit:
        v = v[: limit - 1]
        v = v[: len(v) - (len(v) - len(v.rstrip("\\"))) % 2] + "…"
    return v


def _value(v: str) -> str:
    """A DOT attribute value: bare when it is an ID or a number, else double-quoted. Text
    values went through :func:`optimus_lens.viz.labels.dot_text` (every backslash doubled), so no quote
    in them is escaped already; each is escaped here, after :func:`bounded`."""
    if _BARE.fullmatch(v) and v.lower() not in _KEYWORDS:
        return v
    return '"' + bounded(v).replace('"', '\\"') + '"'


def _id(name: str) -> str:
    """A node id for DOT (``mod:<path>`` is quoted whole: its colon is no port)."""
    return _value(name)


def _attr_text(attrs: dict) -> str:
    """DOT attributes (an HTML-like ``<...>`` label as it is) as ``k=v`` pairs."""
    return " ".join(
        f"{k}={v}" if k == "label" and v[:1] == "<" and v[-1:] == ">" and len(v) <= MAX_VALUE else f"{k}={_value(v)}"
        for k, v in attrs.items()
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
        mark_key(marks, rec.name),
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
                "label": dot_text(rec.name) + "\\n" + dot_text(f"cannot label this node: {type(e).__name__}: {e}"),
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
        attrs = {"label": html_label(label_lines(rec, params, count), changes, palette)}
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


def _add_legend(g: graphviz.Digraph, legend: list[LegendEntry], notes: list[str]) -> None:
    """One HTML-table node with the legend rows and the notes on what is left out."""
    rows = []
    for e in legend:
        style = ' STYLE="dashed"' if e.dashed else ""
        rows.append(
            f'<TR><TD BGCOLOR="{e.fill}" COLOR="{e.border}"{style} WIDTH="18" HEIGHT="12"></TD>'
            f'<TD ALIGN="LEFT" BORDER="0">{html_text(e.text)}</TD></TR>'
        )
    rows += [f'<TR><TD COLSPAN="2" BORDER="0" ALIGN="LEFT">{html_text(n)}</TD></TR>' for n in notes]
    table = (
        '<<TABLE BORDER="0" CELLBORDER="1" CELLSPACING="3" CELLPADDING="2">'
        '<TR><TD COLSPAN="2" BORDER="0" ALIGN="LEFT"><B>Legend</B></TD></TR>' + "".join(rows) + "</TABLE>>"
    )
    g.node("__legend__", label=table, shape="plaintext", style="", fontsize="10")
