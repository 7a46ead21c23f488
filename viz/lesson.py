"""A pattern's walkthrough (:func:`optimus_lens.teach.walk.walkthrough`) drawn: the pictures of each
slide on one geometry, and the lesson file ``optimus lesson`` writes.

Pictures: the graph before, the match (sites marked) and the graph after (created nodes,
and the diff with provenance arrows) are drawn on one layout of the trace
(:func:`optimus_lens.viz.picture.trace_layout`, else the step's union layout of
:func:`optimus_lens.viz.picture.step_picture`), so a node stays under the same pixel from slide to
slide, as in the step viewer. The search frames are drawn pinned to one layout of the
graph searched; the exercise's variant gets its own.

The lesson file is one self-contained HTML page with no network access: the viewer's
script and style (:mod:`optimus_lens.viz.viewer`) are inline, every drawing is inline SVG. Previous /
Next buttons and the left / right keys move between slides; a range slider scrubs the
search frames; the exercise's answer is behind a "Show the answer" button.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from optimus_lens.core.trace import GraphSnapshot
from optimus_lens.teach.data import Frame, Search, Walkthrough
from optimus_lens.viz.dot import emit
from optimus_lens.viz.labels import box_sizes
from optimus_lens.viz.layout import LAYOUT_BUDGET_S, Layout, bounded_layout, draw_pinned
from optimus_lens.viz.marks import Marks
from optimus_lens.viz.options import ViewOptions
from optimus_lens.viz.picture import step_picture, trace_layout
from optimus_lens.viz.select import drawn_graph
from optimus_lens.viz.viewer import VIEWER_CSS, VIEWER_JS, viewer_block

#: a lesson's graphs are small: every node drawn, nothing folded but the parameters
_WHOLE = ViewOptions(full=True, fold=False, modules=False)
#: pinned drawings leave the legend to the viewer
_PINNED = ViewOptions(legend_in_graph=False)


@dataclass
class Picture:
    """One drawing of a slide: pane title, SVG text, the node names the viewer opens on,
    and the legend rows / notes the viewer keeps on screen."""

    title: str
    svg: str
    focus: list[str] = field(default_factory=list)
    legend: list = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class LessonPictures:
    """Every drawing of a walkthrough: per slide kind a list of panes shown together
    (``before``, ``match``, ``after``, ``exercise``), and per search frame one picture
    (``frames``; ``dependent``: the frames of the search on the variant with a dependency)."""

    panes: dict[str, list[Picture]]
    frames: list[Picture]
    dependent: list[Picture]


def _pinned(snap: GraphSnapshot, marks: Marks, layout: Layout | None, title: str, timeout_s: float) -> Picture:
    """``snap`` with ``marks``, pinned to ``layout`` (its own layout when ``layout`` lacks a drawn node)."""
    d = drawn_graph(snap, marks, _WHOLE)
    if layout is None or any(n not in layout.nodes for n in d.order):
        layout = graph_layout(snap)
    g, legend, notes = emit(d, marks, _PINNED, layout=layout)
    # these marks are search frames, anchors or the node asked about, not a step's sites
    legend = [replace(e, text=e.text.removeprefix("pattern site: ")) for e in legend]
    focus = [n for n in d.order if n in marks.names()] or list(d.order)  # nothing marked: open on the whole graph
    return Picture(
        title, draw_pinned(g.source, timeout_s), focus, legend, notes + ([layout.note] if layout.note else [])
    )


def graph_layout(snap: GraphSnapshot, budget_s: float = LAYOUT_BUDGET_S) -> Layout:
    """One bounded layout of the whole of ``snap`` (parameters folded, nothing cut), for
    drawing several markings of it at the same place."""
    d = drawn_graph(snap, None, _WHOLE)
    g, _, _ = emit(d, Marks(), _PINNED)
    return bounded_layout(g.source, d.order, d.inputs, box_sizes(d, {}), budget_s)


def frame_marks(frame: Frame) -> Marks:
    """A search frame's marking: each marked node in its frame group's colour."""
    return Marks(groups=dict(frame.marks), group_labels=list(frame.labels))


def _frames(search: Search | None, snap: GraphSnapshot, layout: Layout | None, timeout_s: float) -> list[Picture]:
    if search is None:
        return []
    graph = search.graph if search.graph is not None else snap
    return [_pinned(graph, frame_marks(f), layout, f.title, timeout_s) for f in search.frames]


def lesson_pictures(w: Walkthrough, timeout_s: float = 20.0) -> LessonPictures:
    """Draw every picture of ``w`` (see the module docstring). Raises RenderError when
    Graphviz is missing or fails."""
    trace = w.trace
    before = trace.graph_at(0)
    shared = trace_layout(trace)
    panes: dict[str, list[Picture]] = {}
    if trace.steps:
        pics = [step_picture(trace, i, layout=shared) for i in range(1, len(trace.steps) + 1)]
        layout = shared or pics[0].layout
        panes["before"] = [_pinned(before, Marks(), layout, f"Before: {w.model}, {len(before)} nodes", timeout_s)]
        panes["match"] = [
            Picture(
                f"Match: step {p.index} sites",
                draw_pinned(p.before.source, timeout_s),
                p.before.focus,
                p.before.legend,
                p.before.notes,
            )
            for p in pics
        ]
        last = pics[-1]
        panes["after"] = [
            Picture(
                f"After: {trace.nodes_after} nodes",
                draw_pinned(last.after.source, timeout_s),
                last.after.focus,
                last.after.legend,
                last.after.notes,
            )
        ]
        panes["after"] += [
            Picture(
                f"Provenance: step {p.index}",
                draw_pinned(p.diff.source, timeout_s),
                p.before.focus + p.after.focus,
                p.diff.legend,
                p.diff.notes,
            )
            for p in pics
        ]
    else:
        layout = graph_layout(before)
        panes["before"] = [_pinned(before, Marks(), layout, f"Before: {w.model}", timeout_s)]
    if w.search is None and w.anchors:
        hits = {n: 0 if r is None else 1 for n, r in w.anchors.items()}
        panes["search"] = [
            _pinned(
                before,
                Marks(groups=hits, group_labels=["anchor: matches", "anchor: no match"]),
                layout,
                "Where it looks: the anchor nodes",
                timeout_s,
            )
        ]
    if w.exercise is not None:
        e = w.exercise
        m = Marks(groups={e.node: 0}, group_labels=[f"asked about: {e.node}"], created=set(e.added))
        pic = _pinned(e.graph, m, graph_layout(e.graph), "The variant (the exercise)", timeout_s)
        rec = e.graph.nodes.get(e.node)
        pic.focus = [e.node] + (list(rec.inputs) if rec is not None else [])  # open on the node asked about
        panes["exercise"] = [pic]
    frames = _frames(w.search, before, layout, timeout_s)
    dependent = _frames(w.dependent, before, None, timeout_s)
    return LessonPictures(panes, frames, dependent)


# ----------------------------------------------------------------------------- the file

_CSS = """
body{font-family:Helvetica,Arial,sans-serif;margin:0;color:#222;font-size:calc(15px * var(--scale))}
header{padding:8px 18px;border-bottom:1px solid #ddd;display:flex;gap:12px;align-items:center;flex-wrap:wrap}
header h1{font-size:1.3em;margin:0;flex:1}
header button{font-size:1em;padding:3px 12px} #count{color:#666}
section.slide{padding:6px 18px} section.slide[hidden]{display:none}
section.slide h2{font-size:1.2em;margin:6px 0}
ul.lines{margin:4px 0 8px 0;padding-left:1.2em} ul.lines li{margin:1px 0}
.cols{display:flex;gap:14px;align-items:flex-start}
.cols .text{flex:0 0 34%;max-height:calc(100vh - 110px);overflow:auto}
.cols .pics{flex:1;min-width:0}
.viewer{height:calc(100vh - 130px);min-height:340px} .viewer[hidden],.ftext[hidden]{display:none}
.scrub{display:flex;gap:10px;align-items:center;margin:4px 0} .scrub input{flex:1}
.leftout{color:#8a4b00;font-size:.92em} .answer{background:#eef6ee;border:1px solid #9c9;border-radius:6px;padding:6px 10px}
table.gain{border-collapse:collapse;margin:6px 0} table.gain td,table.gain th{border:1px solid #ddd;padding:3px 10px;text-align:right}
table.gain th:first-child,table.gain td:first-child{text-align:left}
.hint{color:#777;font-size:.85em}
"""

_JS = """
const SLIDES = Array.from(document.querySelectorAll('section.slide'));
let cur = 0;
function mount(box){
  if (!box || box.dataset.done) return;
  box.dataset.done = '1';
  lensMount(box.querySelector('.lens'), JSON.parse(box.dataset.focus || '[]'), SCALE);
}
function showFrame(sec, k){
  const texts = Array.from(sec.querySelectorAll('.ftext')), views = Array.from(sec.querySelectorAll('.fview'));
  texts.forEach((f, j) => f.hidden = j !== k);
  views.forEach((f, j) => f.hidden = j !== k);
  const out = sec.querySelector('.frameno'); if (out) out.textContent = (k + 1) + ' / ' + texts.length;
  mount(views[k]);
}
function show(i){
  cur = Math.max(0, Math.min(SLIDES.length - 1, i));
  SLIDES.forEach((s, j) => s.hidden = j !== cur);
  document.getElementById('count').textContent = 'slide ' + (cur + 1) + ' / ' + SLIDES.length;
  const sec = SLIDES[cur];
  sec.querySelectorAll('.viewer:not(.fview)').forEach(mount);
  const r = sec.querySelector('input[type=range]');
  if (r) showFrame(sec, +r.value);
  history.replaceState(null, '', '#' + sec.id);
}
SLIDES.forEach(sec => { const r = sec.querySelector('input[type=range]');
  if (r) r.addEventListener('input', () => showFrame(sec, +r.value)); });
document.querySelectorAll('button.reveal').forEach(b => b.onclick = () => {
  b.nextElementSibling.hidden = false; b.hidden = true; });
document.getElementById('prev').onclick = () => show(cur - 1);
document.getElementById('next').onclick = () => show(cur + 1);
document.addEventListener('keydown', e => {
  if (e.target.tagName === 'INPUT' || e.target.tagName === 'SELECT') return;
  if (e.key === 'ArrowRight') { show(cur + 1); e.preventDefault(); }
  if (e.key === 'ArrowLeft') { show(cur - 1); e.preventDefault(); }
});
const m = /^#slide-(\\d+)$/.exec(location.hash);
show(m ? +m[1] - 1 : 0);
"""


def _viewer(pics: list[Picture], hidden: bool = False, cls: str = "viewer") -> str:
    focus = list(dict.fromkeys(n for p in pics for n in p.focus))
    legend = list({(e.fill, e.border, e.text, e.dashed): e for p in pics for e in p.legend}.values())
    notes = list(dict.fromkeys(n for p in pics for n in p.notes))
    block = viewer_block([(p.title, p.svg) for p in pics], legend, notes)
    return (
        f"<div class='{cls}'{' hidden' if hidden else ''} data-focus='{html.escape(json.dumps(focus), quote=True)}'>"
        f"{block}</div>"
    )


def lines_html(lines: list[str], style: str = "") -> str:
    """A slide's lines as a list; lines starting with "• " form a nested list under the line before."""
    out, sub = [], []
    for x in lines:
        if x.startswith("• "):
            sub.append(f"<li>{html.escape(x[2:])}</li>")
            continue
        if sub:
            out[-1] = out[-1][:-5] + "<ul>" + "".join(sub) + "</ul></li>"
            sub = []
        out.append(f"<li>{html.escape(x)}</li>")
    if sub:
        out[-1] = out[-1][:-5] + "<ul>" + "".join(sub) + "</ul></li>"
    return f"<ul class='lines'{f' style={chr(39)}{style}{chr(39)}' if style else ''}>" + "".join(out) + "</ul>"


def _lines(lines: list[str]) -> str:
    return lines_html(lines)


def _frames_html(search: Search, pics: list[Picture]) -> tuple[str, str]:
    """(text column: slider and one text per frame, picture column: one viewer per frame)."""
    text = [
        f"<div class='scrub'><span>frame</span><input type='range' min='0' max='{len(pics) - 1}' value='0' "
        f"aria-label='search frame'><span class='frameno'></span></div>"
    ]
    views = []
    for f, p in zip(search.frames, pics):
        left = "".join(f"<li>{html.escape(n)}: {html.escape(r)}</li>" for n, r in f.left_out.items())
        text.append(
            f"<div class='ftext' hidden><b>{html.escape(f.title)}</b> — {html.escape(f.text)}"
            + (f"<p>Left out:</p><ul class='leftout'>{left}</ul>" if left else "")
            + "</div>"
        )
        views.append(_viewer([p], True, "viewer fview"))
    return "".join(text), "".join(views)


def _bar(label: str, t: tuple[float, float, float], top: float) -> str:
    w = 300

    def x(v: float) -> float:
        return 4 + w * v / top

    return (
        f"<svg width='{w + 10}' height='18' role='img' aria-label='{html.escape(label)}'>"
        f"<rect x='4' y='4' width='{x(t[0]) - 4:.1f}' height='10' fill='#90caf9'/>"
        f"<line x1='{x(t[1]):.1f}' x2='{x(t[2]):.1f}' y1='9' y2='9' stroke='#333' stroke-width='1.5'/>"
        f"<line x1='{x(t[1]):.1f}' x2='{x(t[1]):.1f}' y1='5' y2='13' stroke='#333'/>"
        f"<line x1='{x(t[2]):.1f}' x2='{x(t[2]):.1f}' y1='5' y2='13' stroke='#333'/></svg>"
    )


def gain_figure(w: Walkthrough, height: int = 240):
    """Latency before and after as a plotly bar chart (median, whiskers p10-p90, ms); None when not measured."""
    import plotly.graph_objects as go

    g = w.gain
    if g is None:
        return None
    rows = [("before", g.before_ms), ("after", g.after_ms)]
    fig = go.Figure(
        go.Bar(
            y=[k for k, _ in rows],
            x=[t[0] for _, t in rows],
            orientation="h",
            marker_color=["#90a4ae", "#42a5f5"],
            error_x=dict(type="data", array=[t[2] - t[0] for _, t in rows], arrayminus=[t[0] - t[1] for _, t in rows]),
            text=[f"{t[0]:.3f} ms" for _, t in rows],
            textposition="inside",
            insidetextanchor="start",
        )
    )
    fig.update_layout(
        height=height,
        margin=dict(l=10, r=30, t=30, b=30),
        xaxis_title="latency per call (ms), median with p10-p90",
        title=f"{w.pattern} on {w.model}: {g.speedup:.2f}x ({g.method})",
        yaxis=dict(autorange="reversed"),
    )
    return fig


def gain_html(w: Walkthrough) -> str:
    """The "what it bought" table: nodes, latency median with its p10-p90 spread (bar and
    whisker), peak memory, before and after."""
    g = w.gain
    if g is None:
        return "<p>Not measured.</p>"
    top = max(g.before_ms[2], g.after_ms[2]) or 1.0
    rows = [("before", g.nodes_before, g.before_ms, g.peak_before), ("after", g.nodes_after, g.after_ms, g.peak_after)]
    body = "".join(
        f"<tr><td>{k}</td><td>{n}</td><td>{t[0]:.3f}</td><td>{t[1]:.3f}–{t[2]:.3f}</td>"
        f"<td>{_bar(k, t, top)}</td><td>{p:,}</td></tr>"
        for k, n, t, p in rows
    )
    return (
        "<table class='gain'><tr><th></th><th>nodes</th><th>latency median (ms)</th><th>p10–p90 (ms)</th>"
        f"<th>median and spread</th><th>peak memory (bytes, {html.escape(g.peak_source)})</th></tr>{body}</table>"
    )


def lesson_html(w: Walkthrough, pictures: LessonPictures | None = None, text_scale: float = 1.0) -> str:
    """The lesson on ``w`` as one self-contained HTML page (see the module docstring).
    ``text_scale`` scales the text and the viewer's opening zoom (1.7 suits a projector)."""
    pics = pictures or lesson_pictures(w)
    title = f"{w.pattern} — an Optimus Lens lesson"
    out = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>:root{{--scale:{float(text_scale)!r}}}html,body{{height:100%}}{_CSS}{VIEWER_CSS}</style></head><body>",
        f"<header><h1>{html.escape(w.pattern)} <small style='color:#666;font-weight:normal'>on "
        f"{html.escape(w.model)}</small></h1><button id='prev' title='Previous slide (left arrow key)'>&larr; "
        f"Previous</button><span id='count'></span><button id='next' title='Next slide (right arrow key)'>Next "
        f"&rarr;</button><span class='hint'>&larr; / &rarr; keys move between slides</span></header>",
    ]
    for i, s in enumerate(w.slides, 1):
        text, views = [_lines(s.lines)], ""
        if s.kind in ("before", "match", "after") and pics.panes.get(s.kind):
            views = _viewer(pics.panes[s.kind])
        elif s.kind == "search" and pics.panes.get("search"):
            views = _viewer(pics.panes["search"])
        elif s.kind in ("search", "dependent"):
            search, frames = (w.search, pics.frames) if s.kind == "search" else (w.dependent, pics.dependent)
            if search is not None:
                t, views = _frames_html(search, frames)
                text.append(t)
        elif s.kind == "gain":
            text = [_lines(s.lines), gain_html(w)]
        elif s.kind == "exercise" and w.exercise is not None:
            views = _viewer(pics.panes["exercise"])
            text.append(
                "<button class='reveal'>Show the answer</button><div class='answer' hidden>"
                f"<b>optimus why {html.escape(w.exercise.node)}</b>: {html.escape(w.exercise.answer)}</div>"
            )
        body = (
            "".join(text)
            if not views
            else f"<div class='cols'><div class='text'>{''.join(text)}</div><div class='pics'>{views}</div></div>"
        )
        out.append(
            f"<section class='slide' id='slide-{i}' data-kind='{s.kind}' hidden><h2>{i}. "
            f"{html.escape(s.title)}</h2>{body}</section>"
        )
    out.append(f"<script>const SCALE = {float(text_scale)!r};\n{VIEWER_JS}\n{_JS}</script></body></html>")
    return "\n".join(out)


def write_lesson(w: Walkthrough, path: str | Path, text_scale: float = 1.0) -> int:
    """Write :func:`lesson_html` to ``path``; returns the bytes written."""
    text = lesson_html(w, text_scale=text_scale)
    Path(path).write_text(text, encoding="utf-8")
    return len(text.encode())


__all__ = [
    "LessonPictures",
    "Picture",
    "frame_marks",
    "gain_figure",
    "gain_html",
    "graph_layout",
    "lesson_html",
    "lesson_pictures",
    "lines_html",
    "write_lesson",
]
