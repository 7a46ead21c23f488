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
    """Per-session cache of pictures and layouts of the trace on screen (a new trace clears it;
    ``key`` names the graph, pre-grad or ATen, where the trace has several)."""
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


#: the step viewer's main column at 1280x800 (CSS px), with the sidebar open and in
#: presentation mode (sidebar hidden), measured in chromium (tests/test_browser_fit.py)
MAIN_WIDTH_PX = {False: 815.0, True: 1090.0}
#: px of the viewer around its panes' drawings: the legend/button bar (two lines of legend, one
#: of notes), the selected node's line, the hint row, a pane's title strip and border, the gap
BAR_PX, PICKED_PX, HINT_PX, TITLE_PX, GAP_PX = 56.0, 22.0, 18.0, 23.0, 6.0
#: the viewer's height in presentation mode at 800 px (calc(100vh - 10.5rem) at 19 px text)
PRESENTATION_HEIGHT_PX = 600.0
#: a stacked picture's viewer fills the window but for this many px (:func:`graphs`), and its
#: height at 800 px
STACKED_MARGIN_PX = 40
STACKED_HEIGHT_PX = 800.0 - STACKED_MARGIN_PX


def app_panes(screen: Screen) -> viz.PaneSizes:
    """The step viewer's panes at 1280x800 (:class:`optimus_lens.viz.fit.PaneSizes`): side by
    side and the diff in a viewer ``screen.height`` px tall, stacked (before above after) in
    one as tall as the window (:data:`STACKED_HEIGHT_PX`, so both panes are on screen at
    once); in presentation mode every picture as tall as the window."""
    w = MAIN_WIDTH_PX[screen.presentation]
    h = PRESENTATION_HEIGHT_PX if screen.presentation else float(screen.height)
    hs = PRESENTATION_HEIGHT_PX if screen.presentation else STACKED_HEIGHT_PX
    inner, inner_s = (x - BAR_PX - PICKED_PX - HINT_PX for x in (h, hs))
    return viz.PaneSizes(
        pair=((w - GAP_PX) / 2 - 2, inner - TITLE_PX - 2),
        stacked=(w - 2, (inner_s - GAP_PX) / 2 - TITLE_PX - 2),
        single=(w - 2, inner - TITLE_PX - 2),
    )


#: the picture modes' pane arrangements, in order of preference
ARRANGEMENTS = {"Side by side": ("pair", "stacked"), "Stacked": ("stacked",), "Diff": ("single",)}


def graphs(trace, cur: int, pass_filter: str | None, mode: str, opts: viz.ViewOptions, screen: Screen) -> None:
    """The step's picture: before | after (or stacked) on one layout, or the diff, in one
    pan/zoom viewer, chosen to fit the viewer (:func:`optimus_lens.viz.fit.fit_step`: a wide step
    side by side is drawn compactly, folded or stacked); a whole pass when ``mode`` is "Whole pass"."""
    ss = st.session_state
    height = screen.height + (160 if screen.presentation else 0)
    if mode == "Whole pass" and pass_filter is not None:
        pass_pictures(trace, cur, pass_filter, opts, screen, height)
        return
    keep = opts.stable_layout and opts.modules is not True
    partial = why_panel.partial(ss, trace, cur)
    try:
        shared = (
            None
            if not keep
            else _cached(
                "trace_layout",
                (trace.graph, opts.fold_params, opts.clusters),
                lambda: viz.trace_layout(trace, opts),
            )
        )
        drawing = replace(opts, also=frozenset(partial))  # a near miss drawn in the view is drawn, not cut away
        sizes, arrangements = app_panes(screen), ARRANGEMENTS.get(screen.picture, ("pair", "stacked"))
        pic, fit = _cached(
            "picture",
            (trace.graph, cur, drawing, sizes, arrangements),
            lambda: viz.fit_step(trace, cur, sizes, drawing, layout=shared, arrangements=arrangements),
        )
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
    sides = [None] if screen.picture == "Diff" else [cur - 1, cur]
    stacked = fit.stacked
    notes = (pic.diff.notes if screen.picture == "Diff" else pic.pair_notes()) + ([fit.note()] if fit.note() else [])
    with st.container(key="lens_graph"):
        clickable_view(
            panes,
            fit.focus,
            pic.diff.legend,
            notes,
            key="step_view",
            stacked=stacked,
            text_scale=opts.text_scale,
            height=height,
            selected=ss.get("inspect_node"),
            picked=selection_line(trace, [cur, cur - 1], ss.get("inspect_node")),
            partial=partial,
            animate_key=f"{trace.model}|{'diff' if screen.picture == 'Diff' else 'pair'}",
            fill_window=True if screen.presentation else (f"{STACKED_MARGIN_PX}px" if stacked else False),
            view_id=f"{trace.model}|{cur}|{screen.picture}",
            on_pick=lambda v: on_pick(ss, v, trace, cur, sides),
        )
    how = "one layout for all steps" if pic.layout is shared else "one layout for before and after"
    st.caption(
        f"Before: {drawn_note(pic.before)}. After: {drawn_note(pic.after)}. Layout: {pic.layout.method}, "
        f"{how}" + (f" — {pic.layout.note}" if pic.layout.note else "") + "."
    )
    app_modules.module_control(ss, pic.diff.modules)
