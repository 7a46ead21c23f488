"""The step viewer's pictures: a step's before | after (or stacked) on one layout, or its
diff, or a whole pass, in one clickable pan/zoom viewer (:func:`optimus_lens.app.graphclick.clickable_view`),
with a line on what was drawn and the folded-modules control under it.

Pictures and the trace-wide layout are cached per session for the trace on screen (a new
trace clears them); the pinned SVGs are cached by their DOT source across sessions."""

from __future__ import annotations

from dataclasses import replace

import streamlit as st

from optimus_lens import viz
from optimus_lens.app import modules as app_modules
from optimus_lens.app import why_panel
from optimus_lens.app.graphclick import clickable_view, on_pick, selection_line
from optimus_lens.app.graphview import drawn_note
from optimus_lens.app.view_controls import Screen


@st.cache_data(max_entries=512, show_spinner=False)
def _pinned_svg(dot_source: str) -> str:
    return viz.draw_pinned(dot_source)


def _cached(kind: str, key: tuple, make):
    """Per-session cache of pictures and layouts of the trace on screen (a new trace clears it)."""
    ss = st.session_state
    cache = ss.setdefault("_viz_cache", {})
    if cache.get("_trace") is not ss.trace:
        cache.clear()
        cache["_trace"] = ss.trace
    k = (kind, *key)
    if k not in cache:
        if len(cache) > 64:
            for old in [x for x in cache if x != "_trace"][:16]:
                del cache[old]
        cache[k] = make()
    return cache[k]


def pass_pictures(trace, cur: int, pass_filter: str, opts: viz.ViewOptions, screen: Screen, height: int) -> None:
    """The whole pass ``pass_filter``: before its first step | after its last, each side
    laid out on its own."""
    ss = st.session_state
    views = [
        viz.pass_view(trace, pass_filter, side, replace(opts, legend_in_graph=False)) for side in ("before", "after")
    ]
    rendered = [viz.render_view(v) for v in views]
    panes = [(f"Before pass {pass_filter}", rendered[0].svg), (f"After pass {pass_filter}", rendered[1].svg)]
    notes = views[1].notes + [r.note for r in rendered if r.note]
    steps = trace.steps_of_pass(pass_filter)
    clickable_view(
        panes,
        views[0].focus + views[1].focus,
        views[1].legend,
        notes,
        key="pass_view",
        height=height,
        stacked=screen.picture == "Stacked",
        text_scale=opts.text_scale,
        selected=ss.get("inspect_node"),
        on_pick=lambda v: on_pick(ss, v, trace, cur, [steps[0].index - 1, steps[-1].index]),
    )
    st.caption(
        f"Whole pass: each side laid out on its own. Before: {drawn_note(views[0])}. After: {drawn_note(views[1])}."
    )
    app_modules.module_control(ss, list(dict.fromkeys(views[0].modules + views[1].modules)))


def graphs(trace, cur: int, pass_filter: str | None, mode: str, opts: viz.ViewOptions, screen: Screen) -> None:
    """The step's picture: before | after (or stacked) on one layout, or the diff, in one
    pan/zoom viewer; a whole pass when ``mode`` is "Whole pass"."""
    ss = st.session_state
    height = screen.height + (160 if screen.presentation else 0)
    if mode == "Whole pass" and pass_filter is not None:
        pass_pictures(trace, cur, pass_filter, opts, screen, height)
        return
    keep = opts.stable_layout and opts.modules is not True
    try:
        shared = (
            None
            if not keep
            else _cached(
                "trace_layout",
                (opts.fold_params, opts.clusters),
                lambda: viz.trace_layout(trace, opts),
            )
        )
        drawing = replace(opts, text_scale=1.0)  # the text size changes the viewer, not the drawing
        pic = _cached("picture", (cur, drawing), lambda: viz.step_picture(trace, cur, drawing, layout=shared))
        if screen.picture == "Diff":
            panes = [(f"Diff of step {cur}", _pinned_svg(pic.diff.source))]
        else:
            panes = [
                (f"Before step {cur}", _pinned_svg(pic.before.source)),
                (f"After step {cur}", _pinned_svg(pic.after.source)),
            ]
    except Exception as e:  # noqa: BLE001 - a drawing failure is shown in place, never as a traceback
        st.error(f"Step {cur} could not be drawn: {type(e).__name__}: {e}")
        return
    focus = list(dict.fromkeys(pic.before.focus + pic.after.focus))
    sides = [None] if screen.picture == "Diff" else [cur - 1, cur]
    with st.container(key="lens_graph"):
        clickable_view(
            panes,
            focus,
            pic.diff.legend,
            pic.diff.notes,
            key="step_view",
            stacked=screen.picture == "Stacked",
            text_scale=opts.text_scale,
            height=height * (2 if screen.picture == "Stacked" else 1),
            selected=ss.get("inspect_node"),
            picked=selection_line(trace, [cur, cur - 1], ss.get("inspect_node")),
            partial=why_panel.partial(ss, trace, cur),
            animate_key=f"{trace.model}|{'diff' if screen.picture == 'Diff' else 'pair'}",
            fill_window=bool(ss.get("presentation")),
            on_pick=lambda v: on_pick(ss, v, trace, cur, sides),
        )
    how = "one layout for all steps" if pic.layout is shared else "one layout for before and after"
    st.caption(
        f"Before: {drawn_note(pic.before)}. After: {drawn_note(pic.after)}. Layout: {pic.layout.method}, "
        f"{how}" + (f" — {pic.layout.note}" if pic.layout.note else "") + "."
    )
    app_modules.module_control(ss, pic.diff.modules)
