"""One graph view in the app: laid out (bounded), shown in the pan/zoom viewer, with a
note of what was drawn. Shared by the step viewer and the Pattern Lab."""

from __future__ import annotations

import streamlit as st

from optimus_lens import viz


def show_view(
    view: viz.GraphView,
    height: int,
    text_scale: float = 1.0,
    key: str | None = None,
    selected: str | None = None,
    on_pick=None,
) -> None:
    """Lay out ``view`` (bounded; cached by its DOT source) and show it with pan/zoom, opened on its marked nodes.
    With a ``key``, the view is the clickable component of :mod:`optimus_lens.app.graphclick` (``selected``
    outlined, ``on_pick`` called with a clicked node)."""
    try:
        out = viz.render_view(view)
    except viz.RenderError as e:
        st.warning(str(e))
        return
    notes = view.notes + ([out.note] if out.note else [])
    if key is not None:
        from optimus_lens.app.graphclick import clickable_view

        clickable_view(
            [("", out.svg)],
            view.focus,
            view.legend,
            notes,
            key=key,
            height=height,
            text_scale=text_scale,
            selected=selected,
            on_pick=on_pick,
        )
    else:
        st.iframe(viz.panes_html([("", out.svg)], view.focus, view.legend, notes, text_scale=text_scale), height=height)
    st.caption(drawn_note(view))


def drawn_note(view: viz.GraphView) -> str:
    """The line "N drawn of M nodes", with what folding and the neighbourhood cut left out."""
    note = f"{view.shown:,} drawn of {view.total:,} nodes"
    if view.parallel:
        note += f" ({view.parallel:,} parallel copies drawn as ×k)"
    if view.folded:
        note += f"; {view.folded} parameters folded"
    if view.modules:
        note += f"; {len(view.modules)} modules folded"
    if view.elided:
        note += f"; {view.elided:,} not shown ({view.hops}-hop neighbourhood)"
    return note
