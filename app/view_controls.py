"""The step viewer's controls: the navigator (pass filter, view mode, step slider,
Previous/Next) and the view bar (picture, text size, presentation switch, and the view
options in a popover), read into one :class:`optimus_lens.viz.ViewOptions` and a
:class:`Screen`. Widget keys: ``pass_filter``, ``view_mode``, ``step_slider``, ``prev``,
``next``, ``picture``, ``text_size``, ``hops``, ``fold_params``, ``fold_parallel``,
``clusters``, ``fold_modules``, ``keep_positions``, ``full``, ``graph_height``."""

from __future__ import annotations

from dataclasses import dataclass, replace

import streamlit as st

from optimus_lens import viz
from optimus_lens.app import modules as app_modules
from optimus_lens.app import presentation
from optimus_lens.app import state as S

FULL_VIEW_LIMIT = 2000  # nodes; dot needs ~2 s here, ~17 s at 5,000
TEXT_SIZES = {"small": 0.8, "normal": 1.0, "large": 1.3, "projector": 1.7}
PICTURES = ("Side by side", "Diff", "Stacked")
FOLD_PARALLEL = {"auto": None, "on": True, "off": False}


@dataclass(frozen=True)
class Screen:
    """How the step viewer shows its pictures, beside what they draw: ``picture`` (one of
    :data:`PICTURES`), ``height`` of a pane in px, and whether presentation mode is on."""

    picture: str
    height: int
    presentation: bool


def navigator(trace) -> tuple[int, str | None, str]:
    """Pass filter, view mode, step slider and Previous/Next (in presentation mode: the
    slider, Previous/Next and the presentation switch); returns (step, pass filter, mode)."""
    ss = st.session_state
    if presentation.is_on(ss):
        c = st.columns([6.5, 1.3, 1.1, 1.9], vertical_alignment="bottom")
        presentation.switch(ss, c[3], "presentation_nav")
        c, pass_filter, mode = [None, None, *c[:3]], None, "Step"
    else:
        passes_with_steps = list(dict.fromkeys(s.pass_name for s in trace.steps))
        c = st.columns([2, 2.2, 5, 1.3, 1.1], vertical_alignment="bottom")
        pf = c[0].selectbox("Pass", ["all passes", *passes_with_steps], key="pass_filter")
        pass_filter = None if pf == "all passes" else pf
        mode = c[1].radio(
            "View",
            ("Step", "Whole pass"),
            key="view_mode",
            horizontal=True,
            disabled=pass_filter is None,
            help="Whole pass: before its first step / after its last, "
            "one colour per fused group. Pick a pass to enable.",
        )
        if pass_filter is None:
            mode = "Step"
    options = S.step_options(trace, pass_filter)
    cur = S.clamp_step(ss, options)
    if mode == "Step":
        if len(options) > 1:
            ss.step_slider = cur

            def _sync():
                ss.cur_step = ss.step_slider

            c[2].select_slider(
                "Step",
                options=options,
                key="step_slider",
                on_change=_sync,
                format_func=lambda i: f"{i}: {trace.step(i).pattern}",
            )
        else:
            c[2].markdown(f"Step {cur} of {len(trace.steps)}")
        at = options.index(cur)
        c[3].button(
            "Previous", key="prev", on_click=S.move_step, args=(ss, options, -1), disabled=at == 0, width="stretch"
        )
        c[4].button(
            "Next",
            key="next",
            on_click=S.move_step,
            args=(ss, options, 1),
            disabled=at == len(options) - 1,
            width="stretch",
        )
    return cur, pass_filter, mode


def view_bar(n_nodes: int, model: str | None) -> tuple[Screen, viz.ViewOptions]:
    """The always-visible view controls — picture, text size, presentation switch — and
    the rest in a popover (all hidden, their settings kept, in presentation mode); returns
    (how to show the pictures, how to draw them: with the modules the user opened for
    ``model``)."""
    ss = st.session_state
    c = st.container(key="lens_viewbar").columns([3.2, 3, 1.8, 1.6], vertical_alignment="bottom")
    picture = c[0].radio(
        "Picture",
        PICTURES,
        key="picture",
        horizontal=True,
        help="Side by side: before | after on one layout, zoomed and panned together. Diff: one "
        "picture — erased nodes ghosted, created ones marked, a dashed arrow from each "
        "replaced node to its replacement, changed arguments struck through.",
    )
    presentation.switch(ss, c[2])
    present = presentation.is_on(ss)
    size = c[1].select_slider(
        "Text size", list(TEXT_SIZES), value="normal", key="text_size", disabled=present, help="Kept from step to step."
    )
    with c[3].popover("View options", width="stretch"):
        opts, height = graph_options(n_nodes)
    opts = replace(
        opts,
        unfolded=app_modules.unfolded(ss, model),
        palette=presentation.palette(ss),
        text_scale=presentation.TEXT_SCALE if present else TEXT_SIZES[size],
    )
    return Screen(picture, height, present), opts


def graph_options(n_nodes: int) -> tuple[viz.ViewOptions, int]:
    """The view options' widgets (in the popover); returns (what they say, graph height in px)."""
    hops = st.number_input(
        "Neighbourhood hops",
        0,
        8,
        viz.HOPS,
        key="hops",
        help=f"Graphs with more than {viz.MAX_NODES} drawn nodes show only the pattern "
        "sites, created and erased nodes and this many hops around them.",
    )
    fold = st.checkbox(
        "Fold parameters",
        value=True,
        key="fold_params",
        help="Leave lifted parameter placeholders out; their users say '+N params'.",
    )
    parallel = st.selectbox(
        "Fold parallel copies",
        tuple(FOLD_PARALLEL),
        key="fold_parallel",
        help=f"Draw k parallel copies of the same computation (towers, heads, the sites of "
        f"one fusion) once, with '… ×k'. auto: above {viz.FOLD_ABOVE} drawn nodes.",
    )
    clusters = st.checkbox(
        "Module boxes", value=True, key="clusters", help="Box the nodes of one module (from nn_module_stack) together."
    )
    modules = st.selectbox(
        "Fold modules",
        tuple(app_modules.MODES),
        key="fold_modules",
        help="Draw each module the step did not touch (from nn_module_stack; the outermost one "
        f"that is closed) as one node with its node count. auto: above {viz.MODULES_ABOVE} "
        "drawable nodes. Open one by clicking it or under 'Unfolded modules'.",
    )
    keep = st.checkbox(
        "Keep positions across steps",
        value=True,
        key="keep_positions",
        help=f"Small traces (up to {viz.STABLE_MAX} distinct nodes): one layout for every "
        "step, so scrubbing moves only what changed. Off: each step's before and after get "
        "their own, tighter layout.",
    )
    full = st.checkbox(
        "Whole graph",
        value=False,
        key="full",
        disabled=n_nodes > FULL_VIEW_LIMIT,
        help=f"Draw every node (offered up to {FULL_VIEW_LIMIT:,} nodes; layout is bounded "
        f"to {viz.LAYOUT_BUDGET_S:g} s, then a simpler layered layout is used).",
    )
    height = st.number_input("Graph height (px)", 300, 2000, 560, step=20, key="graph_height")
    opts = viz.ViewOptions(
        hops=int(hops),
        fold_params=fold,
        clusters=clusters,
        modules=app_modules.MODES[modules],
        fold=FOLD_PARALLEL[parallel],
        stable_layout=keep,
        full=bool(full) and n_nodes <= FULL_VIEW_LIMIT,
    )
    return opts, int(height)
