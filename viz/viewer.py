"""Self-contained HTML pages that show Graphviz SVGs with pan and zoom.

:func:`panes_html` shows several drawings of one layout (a step's before and after,
or its diff) side by side or stacked, under one shared viewBox: they open at the same
zoom on the step's focus nodes, and panning or zooming one moves the others, so a node
the step did not touch stays under the same pixel in every pane. The legend and the
buttons sit in a bar above the panes, never over a label. :func:`svg_viewer_html` is
the one-pane page.

It opens zoomed to the *focus* nodes (a step's sites, or the nodes it created), so the
part of a wide graph that changed is readable at once; the mouse wheel zooms around the
pointer, dragging pans, and buttons fit the focus or the whole graph. Hovering a node
shows its tooltip (target, arguments, module, source line). No network access: the
script is inline. The app shows it in an iframe (``st.iframe``).
"""
from __future__ import annotations

import html
import json
import re

_PAGE = """<!doctype html><html><head><meta charset="utf-8"><style>
html,body{margin:0;height:100%;font-family:Helvetica,Arial,sans-serif}
#wrap{position:relative;width:100%;height:100%;overflow:hidden;cursor:grab;border:1px solid #e0e0e0;
      border-radius:6px;box-sizing:border-box;background:#fff}
#wrap.drag{cursor:grabbing}
#wrap svg{width:100%;height:100%;display:block}
#bar{position:absolute;top:6px;right:8px;z-index:2}
#bar button{font-size:12px;margin-left:4px;padding:2px 8px;border:1px solid #bbb;background:#fafafa;
            border-radius:4px;cursor:pointer}
#hint{position:absolute;bottom:4px;left:8px;font-size:11px;color:#888;z-index:2}
#legend{position:absolute;top:6px;left:8px;z-index:2;font-size:11px;color:#333;background:rgba(255,255,255,.93);
        padding:3px 6px;border-radius:4px;max-width:55%}
#legend div{margin:2px 0;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
#legend span.sw{display:inline-block;width:16px;height:10px;margin-right:5px;vertical-align:middle;border:1.5px solid}
</style></head><body><div id="wrap"><div id="bar">__BUTTONS__<button id="fa" title="Fit the whole graph">fit all</button>
<button id="zi" title="Zoom in">+</button><button id="zo" title="Zoom out">&minus;</button></div>
__LEGEND__<div id="hint">wheel: zoom &middot; drag: pan &middot; hover a node for details</div>
__SVG__</div><script>
(function(){
const FOCUS = new Set(__FOCUS__), MAX_SCALE = __MAX_SCALE__, MIN_SCALE = __MIN_SCALE__;
const wrap = document.getElementById('wrap'), svg = wrap.querySelector('svg');
if (!svg) return;
const vb0 = svg.viewBox.baseVal, ALL = {x: vb0.x, y: vb0.y, w: vb0.width, h: vb0.height};
let vb = Object.assign({}, ALL);
function set(v){ vb = v; svg.setAttribute('viewBox', v.x + ' ' + v.y + ' ' + v.w + ' ' + v.h); }
function size(){ return {W: svg.clientWidth || 600, H: svg.clientHeight || 400}; }
function focusBox(){
  const g0 = svg.querySelector('g.graph'); const t = g0 && g0.transform.baseVal.consolidate();
  const m = t ? t.matrix : {a: 1, d: 1, e: 0, f: 0};
  let x0 = Infinity, y0 = Infinity, x1 = -Infinity, y1 = -Infinity;
  svg.querySelectorAll('g.node').forEach(function(g){
    const title = g.querySelector('title');
    if (!title || !FOCUS.has(title.textContent)) return;
    const b = g.getBBox();
    const ax = m.a * b.x + m.e, bx = m.a * (b.x + b.width) + m.e, ay = m.d * b.y + m.f, by = m.d * (b.y + b.height) + m.f;
    x0 = Math.min(x0, ax, bx); x1 = Math.max(x1, ax, bx); y0 = Math.min(y0, ay, by); y1 = Math.max(y1, ay, by);
  });
  return isFinite(x0) ? {x: x0, y: y0, w: x1 - x0, h: y1 - y0} : null;
}
function fit(box, pad, minScale){
  const s0 = size();
  const s = Math.max(Math.min(s0.W / (box.w + 2 * pad), s0.H / (box.h + 2 * pad), MAX_SCALE), minScale || 0);
  const w = s0.W / s, h = s0.H / s;
  set({x: box.x + box.w / 2 - w / 2, y: box.y + box.h / 2 - h / 2, w: w, h: h});
}
function fitFocus(){ const b = focusBox(); fit(b || ALL, b ? 40 : 8, b ? MIN_SCALE : 0); }
function zoom(f, px, py){
  const s0 = size(); px = px === undefined ? s0.W / 2 : px; py = py === undefined ? s0.H / 2 : py;
  const ux = vb.x + px / s0.W * vb.w, uy = vb.y + py / s0.H * vb.h, w = vb.w * f, h = vb.h * f;
  set({x: ux - px / s0.W * w, y: uy - py / s0.H * h, w: w, h: h});
}
wrap.addEventListener('wheel', function(e){ e.preventDefault(); const r = svg.getBoundingClientRect();
  zoom(e.deltaY > 0 ? 1.15 : 1 / 1.15, e.clientX - r.left, e.clientY - r.top); }, {passive: false});
let drag = null;
svg.addEventListener('mousedown', function(e){ drag = {x: e.clientX, y: e.clientY, vb: Object.assign({}, vb)}; wrap.classList.add('drag'); });
window.addEventListener('mouseup', function(){ drag = null; wrap.classList.remove('drag'); });
window.addEventListener('mousemove', function(e){ if (!drag) return; const s0 = size();
  set({x: drag.vb.x - (e.clientX - drag.x) * vb.w / s0.W, y: drag.vb.y - (e.clientY - drag.y) * vb.h / s0.H, w: vb.w, h: vb.h}); });
const fs = document.getElementById('fs'); if (fs) fs.onclick = fitFocus;
document.getElementById('fa').onclick = function(){ fit(ALL, 8); };
document.getElementById('zi').onclick = function(){ zoom(1 / 1.3); };
document.getElementById('zo').onclick = function(){ zoom(1.3); };
fitFocus();
})();
</script></body></html>"""


def svg_viewer_html(svg: str, focus: list[str] | tuple[str, ...] = (), focus_label: str = "fit sites",
                    max_scale: float = 1.4, min_scale: float = 0.6, legend=(), notes=()) -> str:
    """An HTML page showing ``svg`` (Graphviz output) with pan/zoom, opened zoomed onto
    the nodes named in ``focus`` (graph-wide when empty or none is drawn).

    ``max_scale`` caps the opening zoom in screen pixels per SVG point, so a small focus
    is not blown up; ``legend`` (:class:`viz.graph.LegendEntry` rows) and ``notes`` stay
    on screen in a corner while zoomed. ``min_scale`` keeps labels legible when the focus is very wide (a
    60-way fusion): the view then opens on the focus' centre and the rest is a pan away. The SVG's fixed size is dropped so it fills the page.
    """
    start = svg.find("<svg")
    body = svg[start:] if start >= 0 else svg
    body = re.sub(r'<svg width="[^"]*" height="[^"]*"', '<svg', body, count=1)
    rows = [f'<div><span class="sw" style="background:{e.fill};border-color:{e.border};'
            f'border-style:{"dashed" if e.dashed else "solid"}"></span>{html.escape(e.text)}</div>' for e in legend]
    rows += [f'<div style="color:#777">{html.escape(n)}</div>' for n in notes]
    legend_html = f'<div id="legend">{"".join(rows)}</div>' if rows else ""
    buttons = f'<button id="fs" title="Zoom to the highlighted nodes">{focus_label}</button>' if focus else ""
    return (_PAGE.replace("__BUTTONS__", buttons).replace("__LEGEND__", legend_html).replace("__FOCUS__", json.dumps(list(focus)))
            .replace("__MAX_SCALE__", repr(float(max_scale))).replace("__MIN_SCALE__", repr(float(min_scale))).replace("__SVG__", body))


_PANES = """<!doctype html><html><head><meta charset="utf-8"><style>
html,body{margin:0;height:100%;font-family:Helvetica,Arial,sans-serif}
#page{display:flex;flex-direction:column;height:100%}
#top{display:flex;align-items:flex-start;gap:8px;padding:3px 4px;font-size:12px;color:#333;flex:none}
#legend{flex:1;display:flex;flex-wrap:wrap;gap:2px 14px}
#legend span.sw{display:inline-block;width:16px;height:10px;margin-right:5px;vertical-align:middle;border:1.5px solid}
#legend .note{color:#777}
#bar{flex:none;white-space:nowrap}
#bar button{font-size:12px;margin-left:4px;padding:2px 8px;border:1px solid #bbb;background:#fafafa;border-radius:4px;cursor:pointer}
#panes{flex:1;display:flex;gap:6px;min-height:0;flex-direction:__DIRECTION__}
.pane{flex:1;display:flex;flex-direction:column;overflow:hidden;cursor:grab;border:1px solid #e0e0e0;border-radius:6px;
  background:#fff;min-width:0;min-height:0}
.pane.drag{cursor:grabbing}
.pane h4{flex:none;margin:0;padding:2px 8px;font-size:13px;border-bottom:1px solid #eee;background:#fafafa}
.pane svg{flex:1;width:100%;min-height:0;display:block}
#hint{font-size:11px;color:#888;padding:2px 4px;flex:none}
</style></head><body><div id="page"><div id="top"><div id="legend">__LEGEND__</div><div id="bar">
<button id="fs" title="Zoom to the nodes the step matched and created">fit step</button>
<button id="fa" title="Fit the whole drawing">fit all</button>
<button id="zi" title="Zoom in">+</button><button id="zo" title="Zoom out">&minus;</button></div></div>
<div id="panes">__PANES__</div>
<div id="hint">wheel: zoom &middot; drag: pan (__SYNC__) &middot; hover a node for its arguments, module and source line</div></div>
<script>
(function(){
const FOCUS = new Set(__FOCUS__), SCALE = __SCALE__, KEY = __KEY__;
const panes = Array.from(document.querySelectorAll('.pane')), svgs = panes.map(p => p.querySelector('svg')).filter(Boolean);
if (!svgs.length) return;
let ALL = null;
svgs.forEach(function(s){ const b = s.viewBox.baseVal;
  ALL = ALL ? {x: Math.min(ALL.x, b.x), y: Math.min(ALL.y, b.y), w: Math.max(ALL.w, b.width), h: Math.max(ALL.h, b.height)}
            : {x: b.x, y: b.y, w: b.width, h: b.height}; });
let vb = Object.assign({}, ALL);
function set(v){ vb = v; svgs.forEach(s => s.setAttribute('viewBox', v.x + ' ' + v.y + ' ' + v.w + ' ' + v.h));
  try { sessionStorage.setItem(KEY, JSON.stringify(v)); } catch (e) {} }
function size(){ return {W: svgs[0].clientWidth || 600, H: svgs[0].clientHeight || 400}; }
function focusBox(){
  let x0 = Infinity, y0 = Infinity, x1 = -Infinity, y1 = -Infinity;
  svgs.forEach(function(svg){
    const g0 = svg.querySelector('g.graph'); const t = g0 && g0.transform.baseVal.consolidate();
    const m = t ? t.matrix : {a: 1, d: 1, e: 0, f: 0};
    svg.querySelectorAll('g.node').forEach(function(g){
      const title = g.querySelector('title');
      if (!title || !FOCUS.has(title.textContent)) return;
      const b = g.getBBox();
      const ax = m.a * b.x + m.e, bx = m.a * (b.x + b.width) + m.e, ay = m.d * b.y + m.f, by = m.d * (b.y + b.height) + m.f;
      x0 = Math.min(x0, ax, bx); x1 = Math.max(x1, ax, bx); y0 = Math.min(y0, ay, by); y1 = Math.max(y1, ay, by);
    });
  });
  return isFinite(x0) ? {x: x0, y: y0, w: x1 - x0, h: y1 - y0} : null;
}
function clamp(c, len, lo, span){  // keep the view inside the drawing where it is larger than the view
  return len >= span ? lo + span / 2 - len / 2 : Math.min(Math.max(c - len / 2, lo), lo + span - len);
}
function fit(box, pad, maxS, minS){
  const s0 = size();
  const s = Math.max(Math.min(s0.W / (box.w + 2 * pad), s0.H / (box.h + 2 * pad), maxS), minS || 0);
  const w = s0.W / s, h = s0.H / s;
  set({x: clamp(box.x + box.w / 2, w, ALL.x, ALL.w), y: clamp(box.y + box.h / 2, h, ALL.y, ALL.h), w: w, h: h});
}
function fitFocus(){ const b = focusBox(); fit(b || ALL, b ? 30 : 8, 1.5 * SCALE, b ? 1.0 * SCALE : 0); }
function zoom(f, px, py){
  const s0 = size(); px = px === undefined ? s0.W / 2 : px; py = py === undefined ? s0.H / 2 : py;
  const ux = vb.x + px / s0.W * vb.w, uy = vb.y + py / s0.H * vb.h, w = vb.w * f, h = vb.h * f;
  set({x: ux - px / s0.W * w, y: uy - py / s0.H * h, w: w, h: h});
}
let drag = null;
panes.forEach(function(p){
  const svg = p.querySelector('svg'); if (!svg) return;
  p.addEventListener('wheel', function(e){ e.preventDefault(); const r = svg.getBoundingClientRect();
    zoom(e.deltaY > 0 ? 1.15 : 1 / 1.15, e.clientX - r.left, e.clientY - r.top); }, {passive: false});
  svg.addEventListener('mousedown', function(e){ drag = {x: e.clientX, y: e.clientY, vb: Object.assign({}, vb), p: p}; p.classList.add('drag'); });
});
window.addEventListener('mouseup', function(){ if (drag) drag.p.classList.remove('drag'); drag = null; });
window.addEventListener('mousemove', function(e){ if (!drag) return; const s0 = size();
  set({x: drag.vb.x - (e.clientX - drag.x) * vb.w / s0.W, y: drag.vb.y - (e.clientY - drag.y) * vb.h / s0.H, w: vb.w, h: vb.h}); });
document.getElementById('fs').onclick = fitFocus;
document.getElementById('fa').onclick = function(){ fit(ALL, 8, 1e9, 0); };
document.getElementById('zi').onclick = function(){ zoom(1 / 1.3); };
document.getElementById('zo').onclick = function(){ zoom(1.3); };
let kept = null;
try { kept = KEY && JSON.parse(sessionStorage.getItem(KEY) || 'null'); } catch (e) {}
if (kept && kept.w > 0) set(kept); else fitFocus();
})();
</script></body></html>"""


def _legend_html(legend, notes) -> str:
    rows = [f'<span><span class="sw" style="background:{e.fill};border-color:{e.border};'
            f'border-style:{"dashed" if e.dashed else "solid"}"></span>{html.escape(e.text)}</span>' for e in legend]
    rows += [f'<span class="note">{html.escape(n)}</span>' for n in notes]
    return "".join(rows)


def _svg_body(svg: str) -> str:
    start = svg.find("<svg")
    body = svg[start:] if start >= 0 else svg
    return re.sub(r'<svg width="[^"]*" height="[^"]*"', '<svg', body, count=1)


def panes_html(panes: list[tuple[str, str]], focus=(), legend=(), notes=(), stacked: bool = False,
               text_scale: float = 1.0, keep_key: str = "") -> str:
    """One page of several drawings of one layout, zoomed and panned together.

    ``panes``: (title, SVG) pairs, e.g. [("Before", svg1), ("After", svg2)] or
    [("Diff", svg)]. The page opens zoomed onto the nodes named in ``focus`` (found in
    any pane), at most 1.5 × ``text_scale`` screen pixels per point and, for a wide
    focus, at least 1.0 × ``text_scale`` (so labels stay legible; the rest is a pan
    away). ``text_scale`` is the text-size control: 1.0 draws 10 pt labels at 10-15
    px; 1.6 suits a projector. ``keep_key``: when not empty, the zoom and pan are kept
    in the browser's session storage under this key, so the next step opens where the
    user left off (its untouched nodes are at the same coordinates). ``stacked`` puts
    the panes one above the other."""
    parts = [f'<div class="pane">{f"<h4>{html.escape(t)}</h4>" if t else ""}{_svg_body(s)}</div>' for t, s in panes]
    sync = "the panes move together" if len(panes) > 1 else "fit step returns to the change"
    return (_PANES.replace("__DIRECTION__", "column" if stacked else "row")
            .replace("__LEGEND__", _legend_html(legend, notes)).replace("__PANES__", "".join(parts))
            .replace("__SYNC__", sync).replace("__FOCUS__", json.dumps(list(focus)))
            .replace("__SCALE__", repr(float(text_scale))).replace("__KEY__", json.dumps(keep_key)))
