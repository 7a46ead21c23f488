"""Pass toggles that behave: a pass panel that stays open, a stale marker while the
selection differs from the trace on screen, and, after a run, the nearest step of the
pass that was on screen. Which passes run: ours (the Optimus Lens pipeline) or PyTorch
Inductor's own pre-grad passes (:func:`optimus_lens.inductor.observe.observe`).

The decisions are plain functions of the trace and the selection (tested directly);
``pass_panel`` and ``stale_marker`` draw them.
"""

from __future__ import annotations

from collections.abc import MutableMapping

import streamlit as st

from optimus_lens.core.trace import Trace

OURS, INDUCTOR = "Optimus Lens passes", "PyTorch Inductor passes"
STALE = "passes changed: Run to update"


def trace_passes(trace: Trace) -> list[str]:
    """The passes the trace was run with: our enabled passes, or the
    ``pre_grad_fusion_options`` names of an observed upstream run."""
    return [p["name"] for p in trace.passes if p.get("enabled", True)]


def is_stale(trace: Trace | None, source: str, selected: list[str]) -> bool:
    """True when ``trace`` was made with another pass source or other passes than the
    current selection (a trace that records no passes is never stale)."""
    if trace is None or not trace.passes:
        return False
    upstream = bool(trace.capture.get("upstream"))
    if upstream != (source == INDUCTOR):
        return True
    return set(trace_passes(trace)) != set(selected)


def nearest_step(trace: Trace, pass_name: str | None, index: int) -> int:
    """The step of ``trace`` to show after a re-run that was on step ``index`` of pass
    ``pass_name``: the step of the same pass closest to ``index`` (earlier one on a tie),
    else the step closest to ``index``; 0 when the trace has no step."""
    if not trace.steps:
        return 0
    same = [s.index for s in trace.steps if s.pass_name == pass_name]
    pool = same or [s.index for s in trace.steps]
    return min(pool, key=lambda i: (abs(i - index), i))


def place(state: MutableMapping) -> tuple[str | None, int]:
    """(pass, step index) on screen now, for :func:`keep_place` after the next run."""
    trace, cur = state.get("trace"), state.get("cur_step", 0)
    if trace is None or not 1 <= cur <= len(trace.steps):
        return None, 0
    return trace.step(cur).pass_name, cur


def keep_place(state: MutableMapping, before: tuple[str | None, int]) -> None:
    """After a run replaced ``state["trace"]``, move ``cur_step`` to the nearest step of
    the pass that was on screen (``before`` from :func:`place`); a pass filter on a pass
    that no longer made a step is dropped."""
    pass_name, index = before
    trace = state["trace"]
    if pass_name is not None:
        state["cur_step"] = nearest_step(trace, pass_name, index)
    pf = state.get("pass_filter")
    if pf not in (None, "all passes") and not trace.steps_of_pass(pf):
        state["pass_filter"] = "all passes"


USE_PATTERN = "use_pattern"  # the carried Pattern Lab pattern's toggle (first value True)


def selection(state: MutableMapping, pipeline, pattern: dict | None = None) -> tuple[str, list[str]]:
    """(pass source, selected pass names) as the pass panel's widgets left them; with a
    ``pattern`` carried from the Pattern Lab (``{"name", "source", "passes"}``) and its toggle on,
    its passes (:func:`optimus_lens.app.state.pattern_passes`) are the last ones selected."""
    from optimus_lens.app.state import pattern_passes
    from optimus_lens.inductor.observe import default_options

    source = state.get("pass_source", OURS)
    if source == INDUCTOR:
        return source, list(state.get("upstream_passes", default_options()))
    names = [p.name for p in pipeline.passes if state.get(f"pass:{p.name}", True)]
    if pattern is not None and state.get(USE_PATTERN, True):
        names += pattern_passes(pattern)
    return source, names


def pass_panel(pipeline, pattern: dict | None = None) -> tuple[str, list[str]]:
    """The sidebar's pass panel: pass source, then one checkbox per pass of ours (and one for
    a ``pattern`` carried from the Pattern Lab) or a multiselect of upstream's pass names. Its
    label never changes, so toggling a pass keeps it open; every toggle keeps its value across
    page switches. Returns (source, selected pass names)."""
    from optimus_lens.app.lab_runner import pass_name
    from optimus_lens.app.state import KEEP
    from optimus_lens.inductor.observe import default_options, known_pre_grad_passes

    state = st.session_state
    with st.expander("Passes", key="passes_panel"):
        source = st.radio(
            "Which passes",
            (OURS, INDUCTOR),
            key="pass_source",
            persist_state=KEEP,
            help="Ours: the Optimus Lens pipeline. Inductor: PyTorch's own pre_grad_passes with "
            "these pre_grad_fusion_options, one recorded and verified step per upstream rewrite.",
        )
        if source == INDUCTOR:
            state.setdefault("upstream_passes", list(default_options()))
            st.multiselect(
                "pre_grad_fusion_options", known_pre_grad_passes(), key="upstream_passes", persist_state=KEEP
            )
        else:
            for p in pipeline.passes:
                state.setdefault(f"pass:{p.name}", True)
                st.checkbox(p.name, key=f"pass:{p.name}", persist_state=KEEP, help=p.description)
            if pattern is not None:
                state.setdefault(USE_PATTERN, True)
                st.checkbox(
                    f"{pass_name(pattern['name'])} (your pattern, from the Pattern Lab)",
                    key=USE_PATTERN,
                    persist_state=KEEP,
                    help="Run your pattern file as the last pass. Its code runs in a separate `optimus` "
                    "process with the Lab's time limit, never in the app's own.",
                )
        source, selected = selection(state, pipeline, pattern)
        st.caption(panel_count(source, selected, pipeline, pattern))
    return source, selected


def panel_count(source: str, selected: list[str], pipeline, pattern: dict | None = None) -> str:
    """The pass panel's count, naming whose passes it counts: "19 of 24 upstream
    pre_grad_fusion_options on" or "22 of 24 Optimus Lens passes on" (+ the carried pattern)."""
    from optimus_lens.inductor.observe import known_pre_grad_passes

    if source == INDUCTOR:
        return f"{len(selected)} of {len(known_pre_grad_passes())} upstream pre_grad_fusion_options on"
    ours = [p.name for p in pipeline.passes]
    on = sum(1 for n in selected if n in ours)
    extra = " + your pattern" if len(selected) > on else ""  # its passes: one toggle
    return f"{on} of {len(ours)} Optimus Lens passes on{extra}"


def stale_marker(state: MutableMapping, pipeline) -> None:
    """A warning above the trace while the pass selection differs from the trace's; not
    for a trace from a file whose model cannot be run again here (``spec`` None)."""
    trace = state.get("trace")
    if state.get("spec") is not None and is_stale(trace, *selection(state, pipeline, state.get("pattern"))):
        st.warning(
            f"**{STALE}** — the view shows the last run ({', '.join(trace_passes(trace)[:6])}"
            f"{' ...' if len(trace_passes(trace)) > 6 else ''}).",
            icon=":material/sync_problem:",
        )


def post_grad_selection(state: MutableMapping, pipeline) -> list[str]:
    """The post-grad passes ticked in :func:`post_grad_panel` (``pass:NAME``; first value: on
    unless ``pipeline`` switches the pass off, as ``decompose_mm_pass``)."""
    return [p.name for p in pipeline.passes if state.get(f"pass:{p.name}", p.name not in pipeline.disabled)]


def post_grad_run(state: MutableMapping, pipeline) -> list[str]:
    """The passes Run enables on the ATen graphs: the ticked post-grad passes, then the carried
    Pattern Lab pattern's (:func:`optimus_lens.app.state.pattern_passes`) while its toggle is on."""
    from optimus_lens.app.state import pattern_passes

    pattern = state.get("pattern")
    mine = pattern_passes(pattern) if pattern is not None and state.get(USE_PATTERN, True) else []
    return post_grad_selection(state, pipeline) + mine


def post_grad_panel(pipeline) -> list[str]:
    """The sidebar's post-grad pass panel (shown when Run rewrites the ATen graphs): one
    checkbox per pass of ``pipeline`` (:func:`optimus_lens.passes.post_grad.post_grad_pipeline`),
    each kept across page switches. Returns the ticked pass names."""
    from optimus_lens.app.state import KEEP

    state = st.session_state
    with st.expander("Post-grad passes", key="post_grad_panel"):
        for p in pipeline.passes:
            state.setdefault(f"pass:{p.name}", p.name not in pipeline.disabled)
            st.checkbox(p.name, key=f"pass:{p.name}", persist_state=KEEP, help=p.description)
        selected = post_grad_selection(state, pipeline)
        st.caption(f"{len(selected)} of {len(pipeline.passes)} post-grad passes on (forward and backward ATen graphs)")
    return selected


def stage_stale(state: MutableMapping, post_pipeline) -> str | None:
    """Why the trace on screen no longer matches the sidebar's stage, mode or post-grad passes
    (one line), or None: a trace that does not record its stage (older files, upstream's) never
    is."""
    trace = state.get("trace")
    if trace is None or state.get("spec") is None or "stage" not in trace.capture:
        return None
    stage, mode = state.get("run_stage", "pre-grad"), state.get("run_mode", "inference")
    if trace.capture["stage"] != stage or (stage != "pre-grad" and trace.capture.get("mode") != mode):
        return f"the trace on screen is stage {trace.capture['stage']}, mode {trace.capture.get('mode')}"
    if stage != "pre-grad" and trace.graphs:
        ran = set(trace_passes(trace.graphs[0]))
        if ran and ran != set(post_grad_run(state, post_pipeline)):
            return "the post-grad passes changed"
    return None
