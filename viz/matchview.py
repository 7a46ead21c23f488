"""A pattern file's preview drawn: the model's graph with the matches, or with one near miss's
best partial match (its matched nodes, the node where matching stopped), and beside it the
pattern's own graph (what an Inductor search function traced to) with the same marks, so the
decomposition matched against is on screen. Shared by ``optimus match --draw`` (one HTML page,
:func:`match_page`) and the Pattern Lab (:func:`model_view`, :func:`pattern_view`).

Plain data in (node names, snapshots): the preview itself lives in the frontend, which
``viz`` does not import.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field, replace

from optimus_lens.core.trace import GraphSnapshot
from optimus_lens.viz.marks import Marks
from optimus_lens.viz.options import ViewOptions
from optimus_lens.viz.views import GraphView, graph_view

#: the marks' groups: matched before matching stopped, and the node where it stopped
MATCHED, STOPPED = 0, 1


@dataclass
class Miss:
    """One near miss as drawn: the pattern, the anchor node it started from, the model's nodes
    matched before it stopped (``partial``), the node where it stopped (``stopped``, "" when
    unknown or when a check refused a whole match), the reason, and the same in the pattern's
    own graph (``pattern_partial``, ``pattern_stopped``)."""

    pattern: str
    anchor: str
    reason: str
    partial: list[str] = field(default_factory=list)
    stopped: str = ""
    pattern_partial: list[str] = field(default_factory=list)
    pattern_stopped: str = ""


def miss_marks(partial: list[str], stopped: str, label: str) -> Marks:
    """Marks of a best partial match: ``partial`` as group :data:`MATCHED` ("best partial
    match: LABEL"), ``stopped`` as group :data:`STOPPED` ("matching stopped here")."""
    m = Marks(group_labels=[f"best partial match: {label}", f"matching stopped here: {stopped}"])
    for n in partial:
        m.groups[n] = MATCHED
    if stopped:
        m.groups[stopped] = STOPPED
    return m


def matches_marks(matches: list[tuple[str, list[str]]]) -> Marks:
    """Marks of every match: (label, site names) each its own group (a node in two matches
    keeps its first)."""
    m = Marks(group_labels=[label for label, _ in matches])
    for i, (_, sites) in enumerate(matches):
        for n in sites:
            m.groups.setdefault(n, i)
    return m


def model_view(
    snap: GraphSnapshot,
    miss: Miss | None = None,
    matches: list[tuple[str, list[str]]] = (),  # type: ignore[assignment]
    title: str = "",
    opts: ViewOptions | None = None,
    pane: tuple[float, float] | None = None,
) -> GraphView:
    """The model's graph with ``miss``'s best partial match (its anchor counted as matched;
    names not in ``snap`` are dropped), else with ``matches``; the marked nodes are never cut
    away by the neighbourhood limit. With ``pane`` ((width, height) CSS px of the viewer's
    drawing area) the drawing is chosen so that the marked nodes open legible in it without
    zooming (:func:`fit_view`, the step viewer's rule, :mod:`optimus_lens.viz.fit`)."""
    opts = opts or ViewOptions(legend_in_graph=False)
    if miss is not None:
        partial = [n for n in dict.fromkeys([miss.anchor, *miss.partial]) if n in snap.nodes]
        stopped = miss.stopped if miss.stopped in snap.nodes else ""
        marks = miss_marks(partial, stopped, f"{miss.pattern} from {miss.anchor}")
    else:
        marks = matches_marks(list(matches))
    opts = ViewOptions(**{**opts.__dict__, "also": frozenset(marks.groups)})
    if pane is not None:
        return fit_view(snap, marks, pane, title, opts)
    return _short_legend(graph_view(snap, marks, title, opts))


def _short_legend(view: GraphView) -> GraphView:
    """The view with its legend rows said without "pattern site: " (the page says what the
    marks are), so two rows hold them in a narrow pane."""
    view.legend = [replace(e, text=e.text.removeprefix("pattern site: ")) for e in view.legend]
    return view


def fit_view(
    snap: GraphSnapshot, marks: Marks, pane: tuple[float, float], title: str = "", opts: ViewOptions | None = None
) -> GraphView:
    """``snap`` with ``marks`` drawn so that every marked node fits a ``pane`` of (width,
    height) CSS px at a legible zoom (:data:`optimus_lens.viz.fit.LEGIBLE` px per point, labels
    at least 9 px), as the step viewer fits a step (:func:`optimus_lens.viz.fit.fit_step`):
    the drawing as asked, then the marked nodes' 2- then 1-hop neighbourhood on its own layout;
    the first that fits, else the one at the largest zoom. The viewer then opens on the marked
    nodes (``GraphView.focus``). A choice other than the drawing asked for adds a note. Raises
    RenderError when Graphviz is missing or fails."""
    from optimus_lens.viz.fit import LEGIBLE, fit_scale
    from optimus_lens.viz.layout import dot_layout

    opts = opts or ViewOptions(legend_in_graph=False)
    tries = [("as asked", opts)]
    if not opts.full:
        tries += [(f"{h}-hop neighbourhood", replace(opts, local=True, hops=h)) for h in (2, 1) if h <= opts.hops]
    best: tuple[float, str, GraphView] | None = None
    for how, o in tries:
        view = graph_view(snap, marks, title, o)
        scale = fit_scale(dot_layout(view.source, view.shown), view.focus, pane)
        if best is None or scale > best[0]:
            best = (scale, how, view)
        if scale >= LEGIBLE:
            break
    assert best is not None
    _, how, view = best
    if how != "as asked":
        view.notes = [*view.notes, f"drawn to fit the marked nodes: {how}"]
    return _short_legend(view)


def pattern_view(snap: GraphSnapshot, miss: Miss | None = None, title: str = "") -> GraphView:
    """The pattern's own graph, whole, with ``miss``'s matched sub-patterns and the one where
    matching stopped marked in the pattern's terms (its root counted as matched)."""
    marks = Marks()
    if miss is not None:
        root = _root(snap)
        partial = [n for n in dict.fromkeys([*([root] if root else []), *miss.pattern_partial]) if n in snap.nodes]
        stopped = miss.pattern_stopped if miss.pattern_stopped in snap.nodes else ""
        marks = miss_marks(partial, stopped, "in the pattern")
        marks.group_labels[MATCHED] = "matched"
        marks.group_labels[STOPPED] = f"expected here: {stopped}" if stopped else ""
    opts = ViewOptions(legend_in_graph=False, full=True, fold=False, modules=False)
    return _short_legend(graph_view(snap, marks, title, opts))


def _root(snap: GraphSnapshot) -> str:
    """The node the pattern's output returns first (its root)."""
    out = next((r for r in snap.nodes.values() if r.op == "output"), None)
    if out is None:
        return ""
    return next((n for n in out.inputs if n in snap.nodes), "")


@dataclass
class Section:
    """One graph of a match page: its heading, lines of text, and its two views."""

    heading: str
    lines: list[str]
    model: GraphView
    pattern: GraphView | None = None
    pattern_title: str = ""


def match_page(title: str, sections: list[Section], height: int = 560) -> str:
    """One HTML page: per section its heading and text, the model's view and, beside it, the
    pattern's, each in its own pan/zoom viewer (:func:`optimus_lens.viz.viewer.svg_viewer_html`).
    A view that cannot be drawn is its error line."""
    from optimus_lens.viz.layout import RenderError
    from optimus_lens.viz.render import render_view
    from optimus_lens.viz.viewer import svg_viewer_html

    def frame(view: GraphView | None, caption: str) -> str:
        if view is None:
            return ""
        try:
            out = render_view(view)
        except RenderError as e:
            return f"<div class='col'><p class='err'>{html.escape(str(e))}</p></div>"
        page = svg_viewer_html(out.svg, view.focus, view.legend, view.notes + ([out.note] if out.note else []))
        return (
            f"<div class='col'><h3>{html.escape(caption)}</h3><iframe srcdoc=\"{html.escape(page, quote=True)}\" "
            f"style='height:{height}px'></iframe></div>"
        )

    body = []
    for s in sections:
        text = "".join(f"<li>{html.escape(x)}</li>" for x in s.lines)
        body.append(
            f"<section><h2>{html.escape(s.heading)}</h2><ul>{text}</ul><div class='row'>"
            f"{frame(s.model, s.model.title or 'the model graph')}"
            f"{frame(s.pattern, s.pattern_title or 'the pattern')}</div></section>"
        )
    style = (
        "body{font:14px system-ui,sans-serif;margin:16px}.row{display:flex;gap:12px}"
        ".col{flex:1 1 0;min-width:0}.col:first-child{flex:3 1 0}.col:nth-child(2){flex:2 1 0}"
        "iframe{width:100%;border:1px solid #ccc}h3{font-size:14px;margin:4px 0}.err{color:#b00}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body><h1>{html.escape(title)}</h1>{''.join(body)}</body></html>"
    )
