"""Self-contained HTML pan/zoom viewers for Graphviz SVGs.

:func:`panes_html` shows several drawings of one layout (a step's before and after, or
its diff) side by side or stacked, under one shared viewBox: they open at the same zoom
on the step's focus nodes, and panning or zooming one moves the others, so a node the
step did not touch stays under the same pixel in every pane. The legend and the buttons
sit in a bar above the panes and pane titles in a strip above each drawing, never over a
label. The mouse wheel zooms around the pointer, dragging pans; hovering a node shows
its tooltip (target, arguments, module, source line). No network access: the script is
inline. The app shows the page in an iframe (``st.iframe``); the HTML report includes
:data:`VIEWER_CSS` and :data:`VIEWER_JS` once and mounts a viewer per step.
"""

from __future__ import annotations

import html
import json
import re

from optimus_lens.viz.fit import LEGIBLE, PAD_PT

#: transitions between steps: their length (ms), and the most nodes a pane may have to get one
#: (the views' default cut; a bigger "whole graph" drawing changes without animation)
ANIMATE_MS = 300
ANIMATE_MAX = 300

VIEWER_CSS = """
.lens{display:flex;flex-direction:column;height:100%;font-family:Helvetica,Arial,sans-serif}
.lens .top{display:flex;align-items:flex-start;gap:8px;padding:3px 4px;font-size:12px;color:#333;flex:none}
.lens .keys{flex:1;min-width:0}
.lens .legend{display:flex;flex-wrap:wrap;gap:2px 14px;line-height:15px;max-height:32px;overflow:hidden;cursor:pointer}
.lens .legend.open{max-height:none}
.lens .legend span.sw{display:inline-block;width:16px;height:10px;margin-right:5px;vertical-align:middle;border:1.5px solid}
.lens .notes{color:#777;white-space:nowrap;overflow:hidden;text-overflow:ellipsis;cursor:pointer;margin-top:1px}
.lens .notes.open{white-space:normal}
.lens .notes .note+.note::before{content:" \\00b7  "}
.lens .bar{flex:none;white-space:nowrap}
.lens .bar button{font-size:12px;margin-left:4px;padding:2px 8px;border:1px solid #bbb;background:#fafafa;border-radius:4px;cursor:pointer}
.lens .panes{flex:1;display:flex;gap:6px;min-height:0}
.lens .panes.stacked{flex-direction:column}
.lens .pane{flex:1;display:flex;flex-direction:column;overflow:hidden;cursor:grab;border:1px solid #e0e0e0;border-radius:6px;
  background:#fff;min-width:0;min-height:0}
.lens .pane.drag{cursor:grabbing}
.lens .pane h4{flex:none;margin:0;padding:2px 8px;font-size:13px;border-bottom:1px solid #eee;background:#fafafa}
.lens .pane svg{flex:1;width:100%;height:100%;min-height:0;display:block}
.lens .hint{font-size:11px;color:#888;padding:2px 4px;flex:none;white-space:nowrap;overflow-x:auto}
.lens .hint .off{color:#8a4b00;border-left:3px solid #ef6c00;padding-left:5px;margin-right:10px}
.lens .hint .off a{color:#8a4b00;text-decoration:underline;cursor:pointer}
"""

VIEWER_JS = """
const LENS_ANIMATE_MAX = %(max)d, LENS_ANIMATE_MS = %(ms)d, LENS_MEMORY = {};
const LENS_LEGIBLE = %(legible)r, LENS_PAD = %(pad)r;  // px per point of the smallest opening zoom; points around the step
function lensRemember(key, value){
  LENS_MEMORY[key] = value;
  try { sessionStorage.setItem(key, JSON.stringify(value)); } catch (e) {}  // full, or none on file://
}
function lensRecall(key){
  if (key in LENS_MEMORY) return LENS_MEMORY[key];
  try { const t = sessionStorage.getItem(key); return t ? JSON.parse(t) : null; } catch (e) { return null; }
}
function lensNodes(svg){  // node title -> centre in the svg's user space, and its drawing
  const g0 = svg.querySelector('g.graph'), t = g0 && g0.transform.baseVal.consolidate();
  const m = t ? t.matrix : {a: 1, d: 1, e: 0, f: 0}, nodes = {};
  const all = svg.querySelectorAll('g.node');
  if (all.length > LENS_ANIMATE_MAX) return {big: true};
  all.forEach(function(g){
    const title = g.querySelector('title'); if (!title) return;
    const b = g.getBBox();
    nodes[title.textContent] = {x: m.a * (b.x + b.width / 2) + m.e, y: m.d * (b.y + b.height / 2) + m.f, html: g.outerHTML};
  });
  return {m: {a: m.a, d: m.d, e: m.e, f: m.f}, nodes: nodes};
}
function lensAnimate(svg, key){
  // Move from the drawing last shown under `key` to this one: nodes that moved slide from
  // their old place, new ones fade in, gone ones fade out where they were; edges at moved or
  // new nodes fade in. Skipped above LENS_ANIMATE_MAX nodes and under prefers-reduced-motion.
  const now = lensNodes(svg), prev = lensRecall(key), out = {moved: [], created: [], erased: [], skipped: ''};
  lensRemember(key, now);
  if (!prev) { out.skipped = 'first'; return out; }
  if (now.big || prev.big) { out.skipped = 'too many nodes'; return out; }
  if (window.matchMedia && window.matchMedia('(prefers-reduced-motion: reduce)').matches) { out.skipped = 'reduced motion'; return out; }
  const g0 = svg.querySelector('g.graph'), opts = {duration: LENS_ANIMATE_MS, easing: 'ease-out'};
  svg.querySelectorAll('g.node').forEach(function(g){
    const title = g.querySelector('title'); if (!title) return;
    const name = title.textContent, a = prev.nodes[name], b = now.nodes[name];
    if (!a) { out.created.push(name); g.animate([{opacity: 0}, {opacity: 1}], opts); return; }
    const dx = (a.x - b.x) / now.m.a, dy = (a.y - b.y) / now.m.d;
    if (Math.abs(dx) + Math.abs(dy) < 0.5) return;
    out.moved.push(name);
    g.animate([{transform: 'translate(' + dx + 'px,' + dy + 'px)'}, {transform: 'translate(0px,0px)'}], opts);
  });
  const changed = new Set(out.moved.concat(out.created));
  svg.querySelectorAll('g.edge').forEach(function(e){
    const t = e.querySelector('title');
    if (t && t.textContent.split('->').some(n => changed.has(n))) e.animate([{opacity: 0}, {opacity: 0}, {opacity: 1}], opts);
  });
  Object.keys(prev.nodes).forEach(function(name){
    if (name in now.nodes || !g0) return;
    out.erased.push(name);
    const ghost = document.createElementNS('http://www.w3.org/2000/svg', 'g');
    ghost.setAttribute('class', 'lens-leaving');
    ghost.setAttribute('transform', 'translate(' + (prev.m.e - now.m.e) / now.m.a + ' ' + (prev.m.f - now.m.f) / now.m.d + ')');
    ghost.innerHTML = prev.nodes[name].html;
    // a picture of the node that left, not a node: not found, outlined or clicked as one of this drawing's nodes
    ghost.querySelectorAll('.node').forEach(n => n.setAttribute('class', 'lens-gone'));
    ghost.querySelectorAll('title').forEach(t => t.remove());
    g0.appendChild(ghost);
    ghost.animate([{opacity: 1}, {opacity: 0}], opts).onfinish = () => ghost.remove();
  });
  return out;
}
function lensAnimatePanes(root, key){
  // animate each pane from the drawing last shown under key:<pane index>; the counts go to data-anim
  const panes = Array.from(root.querySelectorAll('.pane svg'));
  const res = panes.map((s, i) => lensAnimate(s, key + ':' + i));
  root.dataset.anim = JSON.stringify(res.map(r => ({moved: r.moved.length, created: r.created.length,
                                                    erased: r.erased.length, skipped: r.skipped})));
}
if (window.parent !== window) {  // in the app's iframe: the arrow keys go to the page's Previous/Next
  document.addEventListener('keydown', function(e){
    if (e.key !== 'ArrowLeft' && e.key !== 'ArrowRight') return;
    try { if (window.parent.lensStepKeys && window.parent.lensStepKeys(e.key)) e.preventDefault(); } catch (err) {}
  });
}
// the pan in progress, of whichever viewer: one pair of window listeners for the page,
// however often a viewer is mounted again (the app redraws it at every step)
let lensDrag = null;
window.addEventListener('mouseup', function(){ if (lensDrag) lensDrag.p.classList.remove('drag'); lensDrag = null; });
window.addEventListener('mousemove', function(e){ if (lensDrag) lensDrag.move(e); });
function lensMount(root, focusNames, scale, animKey){
  // Open on the step's nodes (focusNames): the largest zoom that shows them all, at most
  // 1.5 x scale; when even that is below LENS_LEGIBLE px per point, open legible on their
  // first part. Whichever of them the view leaves out is listed in the hint row, each name a
  // link that pans to it. Returns the viewer's handle (also root.__lens).
  const FOCUS = new Set(focusNames), SCALE = scale || 1;
  const panes = Array.from(root.querySelectorAll('.pane')), svgs = panes.map(p => p.querySelector('svg')).filter(Boolean);
  if (!svgs.length) return null;
  let ALL = null;
  svgs.forEach(function(s){ const b = s.viewBox.baseVal;
    ALL = ALL ? {x: Math.min(ALL.x, b.x), y: Math.min(ALL.y, b.y), w: Math.max(ALL.w, b.width), h: Math.max(ALL.h, b.height)}
              : {x: b.x, y: b.y, w: b.width, h: b.height}; });
  let vb = Object.assign({}, ALL);
  const boxes = {};  // node title -> its box in the svg's user space (the first pane that draws it)
  svgs.forEach(function(svg){
    const g0 = svg.querySelector('g.graph'); const t = g0 && g0.transform.baseVal.consolidate();
    const m = t ? t.matrix : {a: 1, d: 1, e: 0, f: 0};
    svg.querySelectorAll('g.node').forEach(function(g){
      const title = g.querySelector('title');
      if (!title || title.textContent in boxes || title.textContent.startsWith('__')) return;
      const b = g.getBBox();
      const ax = m.a * b.x + m.e, bx = m.a * (b.x + b.width) + m.e, ay = m.d * b.y + m.f, by = m.d * (b.y + b.height) + m.f;
      boxes[title.textContent] = {x: Math.min(ax, bx), y: Math.min(ay, by), w: Math.abs(bx - ax), h: Math.abs(by - ay)};
    });
  });
  const focus = Array.from(FOCUS).filter(n => n in boxes);
  const off = root.querySelector('.hint .off');
  let offKey = null;
  function offscreen(){  // the focus nodes not wholly inside the view, listed with a link to each
    if (!off) return;
    const out = focus.filter(function(n){ const b = boxes[n];
      return b.x < vb.x - 1 || b.y < vb.y - 1 || b.x + b.w > vb.x + vb.w + 1 || b.y + b.h > vb.y + vb.h + 1; });
    const key = out.join('\\n');
    if (key === offKey) return;
    offKey = key;
    root.dataset.offscreen = String(out.length);
    off.hidden = !out.length;
    if (!out.length) { off.innerHTML = ''; return; }
    off.textContent = out.length + ' of the step\u2019s ' + focus.length + ' nodes off-screen: ';
    out.slice(0, 40).forEach(function(n){
      const a = document.createElement('a'); a.href = '#'; a.textContent = n; a.title = 'Pan to ' + n;
      a.onclick = function(e){ e.preventDefault(); panTo(n); };
      off.appendChild(a); off.appendChild(document.createTextNode(' '));
    });
    if (out.length > 40) off.appendChild(document.createTextNode('\u2026 and ' + (out.length - 40) + ' more'));
  }
  function set(v){ vb = v; svgs.forEach(s => s.setAttribute('viewBox', v.x + ' ' + v.y + ' ' + v.w + ' ' + v.h)); offscreen(); }
  function size(){ return {W: svgs[0].clientWidth || 600, H: svgs[0].clientHeight || 400}; }
  function boxOf(names){
    let x0 = Infinity, y0 = Infinity, x1 = -Infinity, y1 = -Infinity;
    names.forEach(function(n){ const b = boxes[n]; if (!b) return;
      x0 = Math.min(x0, b.x); y0 = Math.min(y0, b.y); x1 = Math.max(x1, b.x + b.w); y1 = Math.max(y1, b.y + b.h); });
    return isFinite(x0) ? {x: x0, y: y0, w: x1 - x0, h: y1 - y0} : null;
  }
  function clamp(c, len, lo, span){  // keep the view inside the drawing where the drawing is larger
    return len >= span ? lo + span / 2 - len / 2 : Math.min(Math.max(c - len / 2, lo), lo + span - len);
  }
  function scaleFor(box, pad){ const s0 = size(); return Math.min(s0.W / (box.w + 2 * pad), s0.H / (box.h + 2 * pad)); }
  function at(s, cx, cy){ const s0 = size(), w = s0.W / s, h = s0.H / s;
    set({x: clamp(cx, w, ALL.x, ALL.w), y: clamp(cy, h, ALL.y, ALL.h), w: w, h: h}); }
  function fit(box, pad, maxS, minS){
    at(Math.max(Math.min(scaleFor(box, pad), maxS), minS || 0), box.x + box.w / 2, box.y + box.h / 2);
  }
  function open(names){  // the opening view of `names`: whole if legible, else legible from their top left
    const b = boxOf(names);
    if (!b) { fit(ALL, 8, 1.5 * SCALE, 0); return; }
    if (scaleFor(b, LENS_PAD) >= LENS_LEGIBLE) { fit(b, LENS_PAD, 1.5 * SCALE, 0); return; }
    const s0 = size(), s = LENS_LEGIBLE, w = s0.W / s, h = s0.H / s;
    at(s, b.w + 2 * LENS_PAD > w ? b.x - LENS_PAD + w / 2 : b.x + b.w / 2,
          b.h + 2 * LENS_PAD > h ? b.y - LENS_PAD + h / 2 : b.y + b.h / 2);
  }
  function panTo(n){ const b = boxes[n]; if (!b) return;
    at(Math.max(size().W / vb.w, LENS_LEGIBLE), b.x + b.w / 2, b.y + b.h / 2); }
  function fitStep(){ const b = boxOf(focus); fit(b || ALL, b ? LENS_PAD : 8, 1.5 * SCALE, 0); }
  function zoom(f, px, py){
    const s0 = size(); px = px === undefined ? s0.W / 2 : px; py = py === undefined ? s0.H / 2 : py;
    const ux = vb.x + px / s0.W * vb.w, uy = vb.y + py / s0.H * vb.h, w = vb.w * f, h = vb.h * f;
    set({x: ux - px / s0.W * w, y: uy - py / s0.H * h, w: w, h: h});
  }
  panes.forEach(function(p){
    const svg = p.querySelector('svg'); if (!svg) return;
    p.addEventListener('wheel', function(e){ e.preventDefault(); const r = svg.getBoundingClientRect();
      zoom(e.deltaY > 0 ? 1.15 : 1 / 1.15, e.clientX - r.left, e.clientY - r.top); }, {passive: false});
    svg.addEventListener('mousedown', function(e){
      const d = {x: e.clientX, y: e.clientY, vb: Object.assign({}, vb), p: p};
      d.move = function(ev){ const s0 = size();
        set({x: d.vb.x - (ev.clientX - d.x) * vb.w / s0.W, y: d.vb.y - (ev.clientY - d.y) * vb.h / s0.H, w: vb.w, h: vb.h}); };
      lensDrag = d; p.classList.add('drag'); });
  });
  const on = (cls, fn) => { const b = root.querySelector(cls); if (b) b.onclick = fn; };
  on('.fs', fitStep); on('.fa', function(){ fit(ALL, 8, 1e9, 0); });
  on('.zi', function(){ zoom(1 / 1.3); }); on('.zo', function(){ zoom(1.3); });
  on('.notes', function(){ this.classList.toggle('open'); }); on('.legend', function(){ this.classList.toggle('open'); });
  open(focus);
  if (animKey) lensAnimatePanes(root, animKey);
  function show(names){ if (boxOf(names)) open(names); }  // names not drawn here: the view stays
  root.__lens = {open: open, show: show, panTo: panTo, fitStep: fitStep, scale: () => size().W / vb.w};
  return root.__lens;
}
""" % {"max": ANIMATE_MAX, "ms": ANIMATE_MS, "legible": LEGIBLE, "pad": PAD_PT}

_BUTTONS = (
    '<button class="fs" title="Zoom to the nodes the step matched and created">fit step</button>'
    '<button class="fa" title="Fit the whole drawing">fit all</button>'
    '<button class="zi" title="Zoom in">+</button><button class="zo" title="Zoom out">&minus;</button>'
)


def legend_html(legend=(), notes=()) -> str:
    """The legend rows (:class:`optimus_lens.viz.marks.LegendEntry`) and notes as inline HTML:
    the rows wrap onto at most two lines, the notes share one line under them (cut with an
    ellipsis, the whole text on hover); a click on either opens it whole. So the panes keep
    their height whatever the step's legend says."""
    rows = [
        f'<span><span class="sw" style="background:{e.fill};border-color:{e.border};'
        f'border-style:{"dashed" if e.dashed else "solid"}"></span>{html.escape(e.text)}</span>'
        for e in legend
    ]
    out = f'<div class="legend">{"".join(rows)}</div>'
    if notes:
        text = " · ".join(notes)
        out += (
            f'<div class="notes" title="{html.escape(text, quote=True)}">'
            + "".join(f'<span class="note">{html.escape(n)}</span>' for n in notes)
            + "</div>"
        )
    return out


def svg_body(svg: str) -> str:
    """Graphviz SVG without its XML prologue, comments and fixed size (the viewBox stays)."""
    start = svg.find("<svg")
    body = svg[start:] if start >= 0 else svg
    body = re.sub(r"<!--.*?-->\n?", "", body, flags=re.S)
    return re.sub(r'<svg width="[^"]*" height="[^"]*"', "<svg", body, count=1)


def viewer_block(
    panes: list[tuple[str, str]], legend=(), notes=(), stacked: bool = False, view_id: str | None = None
) -> str:
    """The viewer's HTML (legend and buttons bar, panes, hint), without its script: ``panes``
    are (title, SVG or an empty string to be filled in later) pairs; ``view_id`` names what
    it shows (the root's ``data-view``, e.g. the app's model, step and picture)."""
    parts = [
        f'<div class="pane">{f"<h4>{html.escape(t)}</h4>" if t else ""}{svg_body(s) if s else ""}</div>'
        for t, s in panes
    ]
    sync = "the panes move together" if len(panes) > 1 else "fit step returns to the change"
    return (
        f'<div class="lens"{f" data-view={chr(34)}{html.escape(view_id, quote=True)}{chr(34)}" if view_id else ""}>'
        f'<div class="top"><div class="keys">{legend_html(legend, notes)}</div>'
        f'<div class="bar">{_BUTTONS}</div></div><div class="panes{" stacked" if stacked else ""}">{"".join(parts)}'
        f'</div><div class="hint"><span class="off" hidden></span><span class="tip">wheel: zoom &middot; drag: pan '
        f"({sync}) &middot; hover a node for its arguments, module and source line</span></div></div>"
    )


def panes_html(
    panes: list[tuple[str, str]],
    focus=(),
    legend=(),
    notes=(),
    stacked: bool = False,
    text_scale: float = 1.0,
    animate_key: str | None = None,
) -> str:
    """One page of several drawings of one layout, zoomed and panned together.

    ``panes``: (title, SVG) pairs, e.g. [("Before", svg1), ("After", svg2)] or
    [("Diff", svg)]. The page opens zoomed onto the nodes named in ``focus`` (found in
    any pane), at most 1.5 × ``text_scale`` screen pixels per point and, for a wide
    focus, at least 1.0 × ``text_scale`` (so labels stay legible; the rest is a pan
    away). ``text_scale`` is the text-size control: 1.0 draws 10 pt labels at 10-15 px;
    1.7 suits a projector. ``stacked`` puts the panes one above the other. ``animate_key``
    names the view (e.g. the model and picture kind): the page remembers each pane's node
    positions under it (``sessionStorage``, which outlives the app's iframe) and animates
    from the drawing last shown under the same key (:data:`ANIMATE_MS` ms; skipped above
    :data:`ANIMATE_MAX` nodes and under ``prefers-reduced-motion``)."""
    return (
        "<!doctype html><html><head><meta charset='utf-8'><style>html,body{margin:0;height:100%}"
        f"{VIEWER_CSS}</style></head><body>{viewer_block(panes, legend, notes, stacked)}"
        f"<script>{VIEWER_JS}\nlensMount(document.querySelector('.lens'), {json.dumps(list(focus))}, "
        f"{float(text_scale)!r}, {json.dumps(animate_key and 'lens:' + animate_key)});</script></body></html>"
    )


def svg_viewer_html(
    svg: str, focus: list[str] | tuple[str, ...] = (), legend=(), notes=(), text_scale: float = 1.0
) -> str:
    """The one-pane page of :func:`panes_html`: ``svg`` opened zoomed onto ``focus``."""
    return panes_html([("", svg)], focus, legend, notes, text_scale=text_scale)
