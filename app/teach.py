"""The Teach page: a guided walk through one predefined pattern, slide by slide.

Pick a pattern; the page shows :func:`optimus_lens.teach.walk.walkthrough` on its teaching model
(drawn by :mod:`optimus_lens.viz.lesson`, on the step viewer's geometry): what it looks for, the
search (frames on a slider), the match, the graph after, what it bought, and an exercise
whose answer is what ``optimus why`` says. With ``st.session_state["presentation"]``
True the text and the drawings are larger. The same lesson, as an offline file, is
offered for download (``optimus lesson``).

Session-state keys (all prefixed ``teach_``): ``teach_pattern``, ``teach_search``
("global" / "upstream"), ``teach_slide`` (0-based), ``teach_frame`` and
``teach_dep_frame`` (1-based slider positions), ``teach_revealed`` (patterns whose
exercise answer is shown).
"""

from __future__ import annotations

import streamlit as st

from optimus_lens import viz
from optimus_lens.passes import pattern_named
from optimus_lens.teach.lookup import predefined
from optimus_lens.teach.walk import walkthrough
from optimus_lens.viz.lesson import (
    LessonPictures,
    Picture,
    gain_figure,
    lesson_html,
    lesson_pictures,
    lines_html,
)

PRESENTATION_SCALE = 1.6  # text and drawing scale when st.session_state["presentation"] is True
REPEATS = 7  # latency samples per graph on the "what it bought" slide
GRAPH_HEIGHT = 540  # px of a slide's drawing: beside the text, above the fold at 1280x800


@st.cache_resource(show_spinner="Running the pattern on its teaching model and timing it …", max_entries=64)
def _walk(pattern: str, search: str):
    return walkthrough(pattern, repeats=REPEATS, search=search if pattern_named(pattern).kind == "batch" else None)


@st.cache_resource(show_spinner="Drawing the lesson …", max_entries=64)
def _pictures(pattern: str, search: str) -> LessonPictures:
    return lesson_pictures(_walk(pattern, search))


def init(state) -> None:
    defaults = {
        "teach_pattern": predefined()[0],
        "teach_search": "global",
        "teach_slide": 0,
        "teach_frame": 1,
        "teach_dep_frame": 1,
        "teach_revealed": set(),
    }
    for k, v in defaults.items():
        state.setdefault(k, v)


def _scale(state) -> float:
    return PRESENTATION_SCALE if state.get("presentation") else 1.0


def _show(pics: list[Picture], scale: float, height: int) -> None:
    focus = list(dict.fromkeys(n for p in pics for n in p.focus))
    legend = list({(e.fill, e.border, e.text, e.dashed): e for p in pics for e in p.legend}.values())
    notes = list(dict.fromkeys(n for p in pics for n in p.notes))
    st.iframe(
        viz.panes_html([(p.title, p.svg) for p in pics], focus, legend, notes, text_scale=scale),
        height=int(height * (1.15 if scale > 1 else 1.0)),
    )


def _lines(lines: list[str], scale: float) -> None:
    st.markdown(lines_html(lines, f"font-size:{0.95 * scale:.2f}rem;margin-bottom:.3rem"), unsafe_allow_html=True)


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _frames(search, pics: list[Picture], key: str, scale: float, pic_col) -> None:
    n = len(search.frames)
    k = (
        st.slider(
            "Search frame",
            1,
            n,
            key=key,
            help="scrub the search: candidates, key classes, independent layers or depth rings, groups",
        )
        if n > 1
        else 1
    )
    f = search.frames[k - 1]
    _lines([f"Frame {k} / {n} — {f.title}: {f.text}"] + [f"left out: {n_}: {r}" for n_, r in f.left_out.items()], scale)
    with pic_col:
        _show([pics[k - 1]], scale, GRAPH_HEIGHT)


def nav(state, n: int) -> None:
    """Previous / Next and where we are."""
    c1, c2, c3 = st.columns([1, 1, 5])
    if c1.button("← Previous", key="teach_prev", disabled=state["teach_slide"] <= 0, width="stretch"):
        state["teach_slide"] -= 1
    if c2.button("Next →", key="teach_next", disabled=state["teach_slide"] >= n - 1, width="stretch"):
        state["teach_slide"] += 1
    state["teach_slide"] = max(0, min(n - 1, state["teach_slide"]))
    c3.progress((state["teach_slide"] + 1) / n, text=f"slide {state['teach_slide'] + 1} / {n}")


def _on_search() -> None:
    st.session_state["teach_frame"] = 1
    st.session_state["teach_dep_frame"] = 1


def _on_pattern() -> None:
    st.session_state["teach_slide"] = 0
    _on_search()


def page() -> None:
    """The Teach page (see the module docstring)."""
    state = st.session_state
    init(state)
    scale = _scale(state)
    names = predefined()
    c1, c2, c3 = st.columns([3, 2, 2])
    pattern = c1.selectbox(
        "Pattern",
        names,
        key="teach_pattern",
        on_change=_on_pattern,
        format_func=lambda n: f"{n} — {pattern_named(n).description}",
    )
    is_batch = pattern_named(pattern).kind == "batch"
    search = c2.radio(
        "Search",
        ["global", "upstream"],
        key="teach_search",
        horizontal=True,
        disabled=not is_batch,
        on_change=_on_search,
        help="the default global search, or upstream's bounded breadth-first search (optimus run --search upstream)",
    )
    w = _walk(pattern, search)
    pics = _pictures(pattern, search)
    c3.download_button(
        "Lesson file (offline HTML)",
        lesson_html(w, pics, text_scale=scale),
        file_name=f"{pattern}.html",
        mime="text/html",
        key="teach_download",
        help="the same walk as one self-contained HTML file (optimus lesson)",
    )
    n = len(w.slides)
    nav(state, n)
    slide = w.slides[state["teach_slide"]]
    st.markdown(
        f"<h3 style='font-size:{1.5 * scale:.2f}rem;margin:.2rem 0'>{state['teach_slide'] + 1}. "
        f"{_esc(slide.title)}</h3>",
        unsafe_allow_html=True,
    )
    if slide.kind == "gain":
        _lines(slide.lines, scale)
        fig = gain_figure(w)
        if fig is not None:
            g = w.gain
            st.plotly_chart(fig, key="teach_gain")
            st.dataframe(
                [
                    {
                        "graph": k,
                        "nodes": n,
                        "latency median (ms)": round(t[0], 4),
                        "p10 (ms)": round(t[1], 4),
                        "p90 (ms)": round(t[2], 4),
                        f"peak memory (bytes, {g.peak_source})": p,
                    }
                    for k, n, t, p in (
                        ("before", g.nodes_before, g.before_ms, g.peak_before),
                        ("after", g.nodes_after, g.after_ms, g.peak_after),
                    )
                ],
                hide_index=True,
            )
        return
    wide = len(pics.panes.get(slide.kind, [])) > 1  # several panes side by side get more of the width
    text, pic = st.columns([1, 3] if wide else [2, 3])
    with text:
        _lines(slide.lines, scale)
        if slide.kind in ("search", "dependent"):
            search, frames, key = (
                (w.search, pics.frames, "teach_frame")
                if slide.kind == "search"
                else (w.dependent, pics.dependent, "teach_dep_frame")
            )
            if search is not None:
                _frames(search, frames, key, scale, pic)
        elif slide.kind == "exercise" and w.exercise is not None:
            revealed = state["teach_revealed"]
            if pattern in revealed:
                st.success(f"**optimus why {w.exercise.node}**: {w.exercise.answer}")
            else:
                st.button("Reveal the answer", key="teach_reveal", on_click=revealed.add, args=(pattern,))
    kind = "exercise" if slide.kind == "exercise" else slide.kind
    if pics.panes.get(kind):
        with pic:
            _show(pics.panes[kind], scale, GRAPH_HEIGHT)
