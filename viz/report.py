"""A standalone HTML report of a Trace: what ``optimus report TRACE -o report.html`` writes
and the app offers for download.

One self-contained file that works offline: a summary, a node-count chart and a
per-step time chart (inline SVG, each point a link to its step), optional timing of the
passes, and one section per step — its facts and verification and its before | after and
diff pictures on one layout (:func:`optimus_lens.viz.picture.step_picture`) in the pan/zoom viewer.
One step is shown at a time; the left and right arrow keys move between steps, and moving
animates the change (nodes that moved slide, created ones fade in, erased ones fade out).

Size: the viewer's script and style are included once; each drawing is stored once, gzip-
compressed and base64-encoded, and unpacked by the browser (``DecompressionStream``)
when its step is first shown — recsys_towers' 12 steps make a file of about 0.8 MB.

The patterns' descriptions come from the caller (``catalogue``): the report draws what the
trace holds and looks nothing up.
"""

from __future__ import annotations

import base64
import gzip
import html
import json
from dataclasses import replace
from pathlib import Path

from optimus_lens.core.trace import Trace
from optimus_lens.viz.figures import bench_rows, method_text
from optimus_lens.viz.fit import PaneSizes, fit_step
from optimus_lens.viz.layout import Layout, RenderError, draw_pinned
from optimus_lens.viz.options import DEFAULT, ViewOptions
from optimus_lens.viz.picture import trace_layout
from optimus_lens.viz.render import render_view
from optimus_lens.viz.text import step_facts, trace_summary, verify_text
from optimus_lens.viz.viewer import VIEWER_CSS, VIEWER_JS, svg_body, viewer_block
from optimus_lens.viz.views import snapshot_view

#: px of the window above a step's viewer (header, the sticky step bar, the step's title):
#: the viewer takes the rest of the window's height
VIEWER_ABOVE_PX = 215
#: a step's panes at 1280x800 (CSS px of each pane's drawing area; measured in chromium by
#: tests/test_browser_fit.py): what :func:`optimus_lens.viz.fit.fit_step` fits each step's picture to
REPORT_PANES = PaneSizes(pair=(600.0, 470.0), stacked=(1220.0, 222.0), single=(1220.0, 470.0))

_CSS = """
body{font-family:Helvetica,Arial,sans-serif;margin:0;color:#222}
header{padding:8px 22px 4px;display:flex;flex-wrap:wrap;gap:4px 18px;align-items:flex-start}
header .title{flex:1 1 360px;min-width:0} h1{font-size:19px;margin:0 0 4px} header p{margin:2px 0;font-size:13px}
h2{font-size:16px;margin:4px 0 5px;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.charts{display:flex;gap:10px;flex-wrap:wrap} .chart{border:1px solid #eee;border-radius:6px;padding:2px}
.chart a circle:hover{stroke:#000;stroke-width:2}
nav{position:sticky;top:0;background:#fff;z-index:5;padding:5px 22px;border-bottom:1px solid #ddd;display:flex;gap:8px;
    align-items:center;flex-wrap:wrap;font-size:13px}
nav select{font-size:13px} nav button{font-size:13px;padding:2px 10px}
section.step,section.captured{padding:2px 22px 6px;scroll-margin-top:40px} section.step[hidden]{display:none} section.bench{padding:6px 22px}
table.facts{margin-top:8px} table.facts td{padding:2px 10px 2px 0;vertical-align:top;font-size:13px}
table.facts td:first-child{color:#666;white-space:nowrap}
.viewer{height:calc(100vh - %(above)dpx);min-height:360px}
.err{color:#c62828} .failed{color:#c62828;font-weight:bold} .ok{color:#2e7d32}
table.bench{border-collapse:collapse;font-size:13px} table.bench td,table.bench th{border:1px solid #ddd;padding:3px 8px}
""" % {"above": VIEWER_ABOVE_PX}

_JS = """
const SVGS = JSON.parse(document.getElementById('svgs').textContent);
const STEPS = Array.from(document.querySelectorAll('section.step'));
let cur = 0, mode = 'pair';
async function unpack(b64){
  const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'));
  return await new Response(stream).text();
}
const TEXTS = {};  // "step:side" -> the promise of its unpacked SVG: each drawing unpacked once
function svgText(key, side){
  const k = key + ':' + side, d = SVGS[key] || {};
  if (!(k in TEXTS)) TEXTS[k] = d[side] ? unpack(d[side]) : Promise.resolve('');
  return TEXTS[k];
}
function prefetch(j){  // the neighbours' drawings unpacked ahead, so moving to them shows them at once
  const s = STEPS[j]; if (s) ['before', 'after', 'diff'].forEach(side => svgText(s.dataset.key, side));
}
function inView(sec, box){  // the step's viewer wholly in the window: else its title goes to just under the step bar
  const nav = document.querySelector('nav'), top = nav ? nav.getBoundingClientRect().bottom : 0;
  const r = box.getBoundingClientRect();
  if (r.top < top - 1 || r.bottom > window.innerHeight + 1) window.scrollBy(0, sec.getBoundingClientRect().top - top);
}
async function show(i){
  if (!STEPS.length) return;
  cur = Math.max(0, Math.min(STEPS.length - 1, i));
  STEPS.forEach((s, j) => s.hidden = j !== cur);
  const sec = STEPS[cur], key = sec.dataset.key;
  document.getElementById('pick').value = String(cur);
  // the address names the step shown (not on opening: a fragment set while the page loads scrolls to it)
  if (location.hash || cur) history.replaceState(null, '', '#' + sec.id);
  for (const which of ['pair', 'diff']) {
    const box = sec.querySelector('.viewer.' + which);
    box.hidden = which !== mode;
    if (box.hidden) continue;
    if (!box.dataset.done) {
      const names = which === 'pair' ? ['before', 'after'] : ['diff'];
      const texts = await Promise.all(names.map(n => svgText(key, n)));
      if (STEPS[cur] !== sec) return;  // moved on meanwhile
      if (!box.dataset.done) {
        const panes = box.querySelectorAll('.pane');
        texts.forEach((t, j) => panes[j].insertAdjacentHTML('beforeend', t));
        box.dataset.done = '1';
        inView(sec, box);
        lensMount(box.querySelector('.lens'), JSON.parse(sec.dataset.focus), 1.0);
      }
    }
    inView(sec, box);
    // from the step shown before: what moved slides, what is new fades in, what is gone fades out
    lensAnimatePanes(box.querySelector('.lens'), 'lens:report:' + document.title + ':' + which);
  }
  prefetch(cur + 1); prefetch(cur - 1);
}
document.getElementById('prev').onclick = () => show(cur - 1);
document.getElementById('next').onclick = () => show(cur + 1);
document.getElementById('pick').onchange = e => show(+e.target.value);
document.querySelectorAll('input[name=mode]').forEach(r => r.onchange = e => { mode = e.target.value; show(cur); });
document.addEventListener('keydown', e => {
  if (e.target.tagName === 'SELECT' || e.target.tagName === 'INPUT') return;
  if (e.key === 'ArrowRight') { show(cur + 1); e.preventDefault(); }
  if (e.key === 'ArrowLeft') { show(cur - 1); e.preventDefault(); }
});
function fromHash(){ const m = /^#step-(\\d+)$/.exec(location.hash);
  const j = m ? STEPS.findIndex(s => s.id === 'step-' + m[1]) : -1; show(j >= 0 ? j : 0); }
window.addEventListener('hashchange', fromHash);
fromHash();
"""


def _pack(svg: str) -> str:
    """An SVG as gzip + base64 text (what the report's script unpacks)."""
    return base64.b64encode(gzip.compress(svg.encode(), 9, mtime=0)).decode("ascii")


def embedded_svgs(report: str) -> dict[str, dict[str, str]]:
    """The drawings stored in a report written by :func:`html_report`, unpacked: step
    number ("1", "2", …) -> {"before", "after", "diff"} -> SVG text."""
    start = report.index('<script type="application/json" id="svgs">') + len(
        '<script type="application/json" id="svgs">'
    )
    data = json.loads(report[start : report.index("</script>", start)])
    return {k: {side: gzip.decompress(base64.b64decode(v)).decode() for side, v in d.items()} for k, d in data.items()}


def _line_chart(trace: Trace, width: int = 380, height: int = 112) -> str:
    """Nodes after each step as an inline SVG polyline; each point links to its step,
    failed verifications are red crosses."""
    ys = [trace.nodes_before] + [s.nodes_after for s in trace.steps]
    lo, hi = min(ys), max(ys)
    span = max(hi - lo, 1)
    n = max(len(ys) - 1, 1)
    x = lambda i: 40 + (width - 55) * i / n  # noqa: E731
    y = lambda v: 14 + (height - 40) * (1 - (v - lo) / span)  # noqa: E731
    pts = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(ys))
    marks = [
        f'<circle cx="{x(0):.1f}" cy="{y(ys[0]):.1f}" r="3.5" fill="#616161"><title>captured: {ys[0]} nodes</title></circle>'
    ]
    for s in trace.steps:
        cx, cy = x(s.index), y(s.nodes_after)
        tip = f"step {s.index}: {html.escape(s.pattern)} — {s.nodes_after} nodes after"
        if s.verify is not None and s.verify.ok is False:
            marks.append(
                f'<a href="#step-{s.index}"><path d="M{cx - 5:.1f},{cy - 5:.1f}l10,10m0,-10l-10,10" '
                f'stroke="#c62828" stroke-width="2.5"><title>{tip} (verify FAILED)</title></path></a>'
            )
        else:
            marks.append(
                f'<a href="#step-{s.index}"><circle cx="{cx:.1f}" cy="{cy:.1f}" r="3.5" fill="#1565c0">'
                f"<title>{tip}</title></circle></a>"
            )
    return (
        f'<svg class="chart" width="{width}" height="{height}" font-size="11" font-family="Helvetica">'
        f'<text x="8" y="11" font-weight="bold">Nodes after each step</text>'
        f'<text x="4" y="{y(hi) + 4:.1f}">{hi}</text><text x="4" y="{y(lo) + 4:.1f}">{lo}</text>'
        f'<text x="{width / 2:.0f}" y="{height - 4}">step</text>'
        f'<polyline points="{pts}" fill="none" stroke="#9e9e9e" stroke-width="1.5"/>{"".join(marks)}</svg>'
    )


def _time_chart(trace: Trace, width: int = 380, height: int = 112) -> str:
    """Match + rewrite milliseconds of each step as inline SVG bars linking to the step."""
    ms = [(s.match_s + s.rewrite_s) * 1e3 for s in trace.steps]
    top = max(ms + [1e-3])
    bw = (width - 55) / max(len(ms), 1)
    bars = []
    for s, v in zip(trace.steps, ms):
        h = (height - 40) * v / top
        bars.append(
            f'<a href="#step-{s.index}"><rect x="{40 + bw * (s.index - 1):.1f}" y="{height - 26 - h:.1f}" '
            f'width="{max(bw - 1, 1):.1f}" height="{h:.1f}" fill="#81d4fa"><title>step {s.index}: '
            f"{html.escape(s.pattern)} — match {s.match_s * 1e3:.2f} ms, rewrite {s.rewrite_s * 1e3:.2f} ms"
            f"</title></rect></a>"
        )
    return (
        f'<svg class="chart" width="{width}" height="{height}" font-size="11" font-family="Helvetica">'
        f'<text x="8" y="11" font-weight="bold">Match + rewrite time per step (ms)</text>'
        f'<text x="4" y="18">{top:.2f}</text><text x="4" y="{height - 26}">0</text>'
        f'<text x="{width / 2:.0f}" y="{height - 4}">step</text>{"".join(bars)}</svg>'
    )


def _bench_html(bench) -> str:
    rows = bench_rows(bench)
    head = "".join(f"<th>{html.escape(k)}</th>" for k in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r.values()) + "</tr>" for r in rows)
    return (
        f"<h2>Per-pass timing</h2><p>Speedup vs baseline (cumulative, after each pass); measured on "
        f"{html.escape(method_text(bench))}.</p><table class='bench'><tr>{head}</tr>{body}</table>"
    )


def _step_section(
    trace: Trace, i: int, info: dict, shared: Layout | None, opts: ViewOptions, timeout_s: float
) -> tuple[str, dict]:
    """One step's section and its packed drawings: its title, the before | after viewer (panes
    stacked when :func:`optimus_lens.viz.fit.fit_step` chose so), the diff viewer, the facts; a
    drawing that fails says why in place."""
    st = trace.step(i)
    failed = st.verify is not None and st.verify.ok is False
    rows = "".join(
        f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in step_facts(st, info.get(st.pattern))
    )
    head = (
        f"<section class='step' id='step-{i}' data-key='{i}' data-focus='__FOCUS__' hidden>"
        f"<h2>Step {i}: {html.escape(st.pattern)} <small>({html.escape(st.pass_name)})</small> "
        f"<span class='{'failed' if failed else 'ok'}'>verify {html.escape(verify_text(st.verify))}</span></h2>"
    )
    facts = f"<table class='facts'>{rows}</table>"
    try:
        pic, fit = fit_step(trace, i, REPORT_PANES, opts, layout=shared)
        svgs = {k: draw_pinned(v.source, timeout_s) for k, v in pic.views().items()}
    except Exception as e:  # noqa: BLE001 - a drawing failure is reported in place, never as a traceback
        return head.replace("__FOCUS__", "[]") + (
            f"<p class='err'>Step {i} could not be drawn: "
            f"{html.escape(type(e).__name__)}: {html.escape(str(e))}</p>"
            "<div class='viewer pair'></div><div class='viewer diff'></div>"
            f"{facts}</section>"
        ), {}
    focus = json.dumps(fit.focus)
    extra = [fit.note()] if fit.note() else []
    pair = viewer_block(
        [(f"Before step {i}", ""), (f"After step {i}", "")],
        pic.diff.legend,
        pic.pair_notes() + extra,
        stacked=fit.stacked,
    )
    diff = viewer_block(
        [(f"Diff of step {i}", "")],
        pic.diff.legend,
        pic.diff.notes + ([fit.note(diff=True)] if fit.note(diff=True) else []),
    )
    body = (
        head.replace("__FOCUS__", html.escape(focus, quote=True))
        + f"<div class='viewer pair' data-fit='{html.escape(json.dumps(_fit_data(fit)), quote=True)}'>{pair}</div>"
        f"<div class='viewer diff' hidden>{diff}</div>{facts}</section>"
    )
    return body, {k: _pack(svg_body(v)) for k, v in svgs.items()}


def _fit_data(fit) -> dict:
    """What the report records of a step's fit on its viewer (``data-fit``): the arrangement,
    the zoom it fits at and what was drawn."""
    return {"arrangement": fit.arrangement, "scale": round(fit.scale, 3), "fits": fit.fits, "how": fit.how}


def html_report(
    trace: Trace,
    catalogue: list[dict] | None = None,
    steps: list[int] | None = None,
    opts: ViewOptions = DEFAULT,
    bench=None,
    timeout_s: float = 20.0,
) -> str:
    """The report as one HTML string (see the module docstring).

    ``catalogue``: the patterns' facts, one dict per pattern with its ``name`` and any of
    ``description``, ``preconditions``, ``upstream``, ``source`` (the entries of
    :func:`optimus_lens.passes.pass_catalogue`, which the caller passes); None or a pattern
    missing from it: its steps show only what the trace holds. ``steps``: 1-based step
    indices to include (default all). ``bench``: an optional
    :class:`optimus_lens.perf.timings.BenchResult`, shown as a table. ``opts``: how the
    pictures are drawn (the neighbourhood cut, as in the app; ``opts.stable_layout``: one
    layout for every step of a small trace). Drawing is bounded (:mod:`optimus_lens.viz.layout`);
    ``timeout_s`` bounds drawing one laid-out picture."""
    info = {c["name"]: c for c in catalogue or []}
    s = trace_summary(trace)
    graph = getattr(trace, "graph", None)
    title = html.escape((trace.model or "model") + (f" ({graph} graph)" if graph and graph != "pre-grad" else ""))
    out = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>Optimus Lens — {title}</title>"
        f"<style>{_CSS}{VIEWER_CSS}</style></head><body><header><div class='title'>",
        f"<h1>Optimus Lens trace: {title}</h1>",
        f"<p>{s['nodes_before']:,} → {s['nodes_after']:,} nodes in {s['steps']} steps; "
        f"{s['failed_steps']} failed verification; final check: {html.escape(s['final_verify'])}.</p>",
    ]
    if s["graphs"] > 1:
        breaks = "; ".join(trace.capture.get("breaks", []))
        out.append(
            f"<p class='err' title='{html.escape(breaks, quote=True)}'>The model has {s['graphs']} graphs "
            f"(graph breaks: {html.escape(breaks[:120] + ('…' if len(breaks) > 120 else ''))}); this trace is "
            f"graph {trace.capture.get('graph_index', 0) + 1}.</p>"
        )
    if bench is not None:
        out.append("<p><a href='#timing'>Per-pass timing</a> (below the steps)</p>")
    out.append("</div>")
    if trace.steps:
        out.append(f"<div class='charts'>{_line_chart(trace)}{_time_chart(trace)}</div>")
    out.append("</header>")
    packed: dict[str, dict] = {}
    indices = steps or list(range(1, len(trace.steps) + 1))
    if indices:
        options = "".join(
            f"<option value='{j}'>{i}: {html.escape(trace.step(i).pattern)}</option>" for j, i in enumerate(indices)
        )
        out.append(
            "<nav><button id='prev' title='Previous step (left arrow key)'>&larr; Previous</button>"
            f"<select id='pick'>{options}</select><button id='next' title='Next step (right arrow key)'>"
            "Next &rarr;</button><label><input type='radio' name='mode' value='pair' checked> before | after"
            "</label><label><input type='radio' name='mode' value='diff'> diff</label>"
            "<span style='color:#888'>&larr; / &rarr; keys move between steps</span></nav>"
        )
        shared = trace_layout(trace, opts) if opts.stable_layout else None
        for i in indices:
            body, svgs = _step_section(trace, i, info, shared, opts, timeout_s)
            out.append(body)
            if svgs:
                packed[str(i)] = svgs
    else:
        out.append("<section class='captured'><h2>No step applied: the captured graph</h2>")
        try:
            v = snapshot_view(trace, 0, replace(opts, legend_in_graph=False))
            r = render_view(v)
            notes = v.notes + ([r.note] if r.note else [])
            out.append("<div class='viewer'>" + viewer_block([("Captured graph", r.svg)], v.legend, notes) + "</div>")
        except RenderError as e:
            out.append(f"<p class='err'>{html.escape(str(e))}</p>")
        out.append("</section>")
    if bench is not None:
        out.append(f"<section class='bench' id='timing'>{_bench_html(bench)}</section>")
    out.append(f'<script type="application/json" id="svgs">{json.dumps(packed)}</script>')
    if indices:
        out.append(f"<script>{VIEWER_JS}\n{_JS}</script>")
    else:
        out.append(f"<script>{VIEWER_JS}\nlensMount(document.querySelector('.lens'), [], 1.0);</script>")
    out.append("</body></html>")
    return "\n".join(out)


def write_report(trace: Trace, path: str | Path, **kw) -> int:
    """Write :func:`html_report` to ``path``; returns the bytes written."""
    text = html_report(trace, **kw)
    Path(path).write_text(text, encoding="utf-8")
    return len(text.encode())
