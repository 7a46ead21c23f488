"""Clickable graph views: the pan/zoom viewer of :mod:`optimus_lens.viz.viewer` as a bidirectional
Streamlit component (``st.components.v2``).

The server-rendered SVG panes (before | after, stacked, or the diff) are mounted in the
page by the same ``lensMount`` script the HTML report uses, so zoom, pan, pane sync and
the buttons behave as in the report. On top of it the component

* sends back the FX node name of a clicked node (the ``<title>`` of its SVG ``g.node``,
  which Graphviz writes from the DOT node id) and the pane it was clicked in — a press
  that moved the pointer more than a few pixels is a pan, not a click;
* draws the selected node (``selected``) with a thick orange outline in every pane that
  has it, and the nodes of ``partial`` (a why-not panel's best partial match) with a
  dashed purple one.

A new drawing (another step, picture or option) remounts the viewer, opened on the
step's focus; a new selection only moves the outlines, so the zoom stays.

:func:`on_pick` is what a click does, a plain function of the session state so tests
can drive it: a click on a folded module (DOT id ``mod:<qualified.path>``) adds the
path to ``state["unfolded_modules"]``; a click on an FX node of the step's graphs
selects it in the inspector (:func:`optimus_lens.app.inspector.select`), on the side it was clicked.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping

import streamlit as st

from optimus_lens.viz.viewer import VIEWER_CSS, VIEWER_JS, viewer_block

DRAG_PX = 4  # a press that moves more than this is a pan

_CSS = (
    VIEWER_CSS
    + """
.lens-host{height:560px}
.lens .picked{flex:none;font-size:12px;padding:2px 8px;margin:0 0 3px;border-left:4px solid #ff6d00;background:#fff3e0;
  white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.lens svg g.node{cursor:pointer}
.lens svg .lens-picked{stroke:#ff6d00 !important;stroke-width:5px !important}
.lens svg .lens-partial{stroke:#8e24aa !important;stroke-width:4px !important;stroke-dasharray:7 3}
"""
)

_JS = (
    VIEWER_JS
    + """
function lensMarks(box, selected, partial){
  const part = new Set(partial || []);
  box.querySelectorAll('svg g.node').forEach(function(g){  // the node's outline: its first shape
    const t = g.querySelector('title'), name = t ? t.textContent : null, shape = g.querySelector('path, polygon, ellipse');
    if (!shape) return;
    shape.classList.toggle('lens-picked', name !== null && name === selected);
    shape.classList.toggle('lens-partial', name !== null && part.has(name) && name !== selected);
  });
}
function lensClicks(box){
  const panes = Array.from(box.querySelectorAll('.pane'));
  panes.forEach(function(p, i){
    let down = null;
    p.addEventListener('mousedown', function(e){ down = {x: e.clientX, y: e.clientY}; });
    p.addEventListener('click', function(e){
      if (!down || Math.abs(e.clientX - down.x) + Math.abs(e.clientY - down.y) > %(drag)d) return;
      const g = e.target.closest ? e.target.closest('g.node') : null, t = g && g.querySelector('title');
      if (t && box.__send) box.__send('pick', {name: t.textContent, pane: i, at: Date.now()});
    });
  });
}
export default function(component){
  const data = component.data || {}, host = component.parentElement;
  let box = host.querySelector('.lens-host');
  if (!box){ box = document.createElement('div'); box.className = 'lens-host'; host.appendChild(box); }
  box.style.height = data.fill ? 'max(380px, calc(100vh - 10.5rem))' : (data.height || 560) + 'px';
  box.__send = component.setTriggerValue;
  if (box.__html !== data.html){
    box.__html = data.html;
    box.innerHTML = data.html || '';
    const root = box.querySelector('.lens');
    if (root){ lensMount(root, data.focus || [], data.scale || 1, data.anim || null); lensClicks(box); }
  }
  lensMarks(box, data.selected || null, data.partial || []);
  const root = box.querySelector('.lens'), hint = box.querySelector('.lens .hint');
  if (hint && !hint.__base) hint.__base = hint.innerHTML;
  let sel = box.querySelector('.lens .picked');
  if (root && !sel){ sel = document.createElement('div'); sel.className = 'picked'; root.insertBefore(sel, root.querySelector('.panes')); }
  if (sel){ sel.textContent = data.picked || ''; sel.style.display = data.picked ? '' : 'none'; }
  if (hint) hint.innerHTML = hint.__base + ' &middot; click a node: select it in the inspector';
}
"""
    % {"drag": DRAG_PX}
)

_COMPONENT = st.components.v2.component("optimus_lens_graph_view", css=_CSS, js=_JS)


def clickable_view(
    panes: list[tuple[str, str]],
    focus=(),
    legend=(),
    notes=(),
    *,
    key: str,
    height: int,
    stacked: bool = False,
    text_scale: float = 1.0,
    selected: str | None = None,
    picked: str = "",
    partial=(),
    animate_key: str | None = None,
    fill_window: bool = False,
    on_pick: Callable[[dict | None], None] | None = None,
) -> None:
    """Mount the viewer of ``panes`` ((title, SVG) pairs, as :func:`optimus_lens.viz.panes_html` takes)
    as a component of ``height`` px (twice that when ``stacked``), opened on ``focus``.
    ``selected`` (an FX node name) and ``partial`` (names) are outlined, and ``picked`` (a
    line about the selection) is shown above the panes. ``animate_key`` (as
    :func:`optimus_lens.viz.panes_html` takes it) animates a new drawing from the one last shown under
    the same key. ``fill_window`` (presentation mode) makes the view as tall as the
    browser window allows instead of ``height``. A click on a node calls ``on_pick`` with ``{"name": DOT id, "pane": pane index}`` before the rerun."""
    data = {
        "html": viewer_block(panes, legend, notes, stacked),
        "focus": list(focus),
        "scale": float(text_scale),
        "height": int(height),
        "selected": selected,
        "picked": picked,
        "partial": list(partial),
        "anim": ("lens:" + animate_key) if animate_key else None,
        "fill": bool(fill_window),
    }

    def _changed() -> None:
        got = st.session_state.get(key)
        if on_pick is not None:
            on_pick(got.get("pick") if got is not None else None)

    _COMPONENT(key=key, data=data, height="content" if fill_window else int(height), on_pick_change=_changed)


def on_pick(state: MutableMapping, value: dict | None, trace, cur: int, graphs: list[int | None]) -> str:
    """What a click does. ``value``: the component's ``{"name", "pane"}``; ``graphs[pane]``:
    the step count of the graph that pane draws (``cur - 1`` before, ``cur`` after; None
    for the diff, which draws both). Returns what happened:

    * ``"unfolded"`` — a folded module (``mod:<path>``): its path joins
      ``state["unfolded_modules"]`` (a set, created if missing);
    * ``"selected"`` — an FX node of that graph: selected in the inspector, whose graph
      side becomes the pane's (the diff: after the step if the node is there, else before)
      and whose panel opens;
    * ``"ignored"`` — anything else (no value, a layout anchor, a node of no graph here).
    """
    from optimus_lens.app import inspector, modules

    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return "ignored"
    name, pane = value["name"], value.get("pane", 0)
    if modules.unfold_clicked(state, name):  # a folded module (mod:<path>): opened
        return "unfolded"
    if not isinstance(pane, int) or not 0 <= pane < len(graphs):
        return "ignored"
    k = graphs[pane]
    tries = [k] if k is not None else [cur, cur - 1]
    at = next((g for g in tries if 0 <= g <= len(trace.steps) and name in trace.graph_at(g).nodes), None)
    if at is None:
        return "ignored"
    inspector.select(state, name)
    if cur >= 1 and at in (cur - 1, cur):
        state[inspector.SIDE] = "before" if at == cur - 1 else "after"
    state[inspector.PANEL] = True
    return "selected"


def selection_line(trace, graphs: list[int], name: str | None) -> str:
    """One line about the selected node for the bar above the panes, read from the first
    of ``graphs`` (step counts) that has it: ``name = target(args) · shape dtype · stride``;
    "" when none has it (the node does not exist at this step)."""
    from optimus_lens.core.trace import arg_text

    if not name:
        return ""
    rec = next(
        (
            trace.graph_at(k).nodes[name]
            for k in graphs
            if 0 <= k <= len(trace.steps) and name in trace.graph_at(k).nodes
        ),
        None,
    )
    if rec is None:
        return ""
    args = ", ".join([arg_text(a) for a in rec.args] + [f"{k}={arg_text(v)}" for k, v in rec.kwargs.items()])
    args = args if len(args) <= 70 else args[:69] + "…"
    parts = [
        f"Selected: {name} = {rec.short_target}({args})" if rec.op != "placeholder" else f"Selected: {name} (input)"
    ]
    if rec.shape is not None:
        parts.append(f"shape {rec.shape} {rec.dtype or ''}".strip())
    if rec.stride is not None:
        parts.append(f"stride {rec.stride}")
    return " · ".join(parts) + " — details in “Inspect a node” below"
