"""The Pattern Lab page: write a pattern, preview where it matches, ask why it does not,
apply it as a pass and step through the result.

What you see is what runs: Preview and Apply run exactly the editor's text, under the name in
the name field, on the model in the model box (any spec ``optimus`` takes); a loaded file
replaces the editor's text and names it; a result made from other code, another name or
another model is marked stale, and its "Time it" and "Open in the step viewer" are off until
it is made again. User code runs only when a button is pressed, in a child process with a time
limit (:mod:`optimus_lens.app.lab_runner`); the page says so.

Session-state keys (all prefixed ``lab_``, first values in :func:`optimus_lens.app.state.init`):
``lab_source`` (the editor's text, never lost on an error), ``lab_name`` (the pattern's name:
its file and pass), ``lab_spec`` (the model spec), ``lab_stage`` ("auto": post-grad for a file
in Inductor's pattern language, else pre-grad; or the stage chosen) and ``lab_mode``
(inference / training: the backward graph too), ``lab_result`` (the last LabResult) with
``lab_ran`` (the (spec, name, source, stage, mode) it was made from) and ``lab_action`` ("preview" /
"apply"), ``lab_bench`` (what it was made from, LabResult of "Time it"), ``lab_rev`` (bumped
when code replaces the editor's text: a fresh editor shows it), ``lab_loaded`` (where the
editor's text came from), ``lab_time_limit`` (s).
"""

from __future__ import annotations

from collections.abc import MutableMapping
from importlib import resources
from pathlib import Path

import streamlit as st

from optimus_lens import sample_models
from optimus_lens.app import lab_results, lab_runner
from optimus_lens.app import state as S

STARTERS = {
    "pattern / replacement functions": S.LAB_STARTER,
    "declarative rule (optimus_lens.core.lang)": "rule.py",
    "BatchPattern class": "batch.py",
    "Inductor's pattern language (register_replacement)": "inductor.py",
}
#: the pattern's name when a starter is loaded (its file and pass are named after it)
STARTER_NAMES = {
    S.LAB_STARTER: S.LAB_NAME,
    "rule.py": "swish_rule",
    "batch.py": "batch_sigmoid",
    "inductor.py": "addcmul",
}
#: the Stage box: "auto" follows where the file's passes would run (lab_runner.default_stage)
STAGE_CHOICES = ("auto", *lab_runner.STAGES)
SPEC_HELP = (
    "Any model spec `optimus match` takes: sample:NAME, package.module:factory, path/to/file.py:factory "
    "(a callable returning (nn.Module, example_inputs), resolved from the app's directory), "
    "path/to/model.pt2 (torch.export.save), hf:NAME[?layers=N&hidden=N]."
)


def starter(kind: str) -> str:
    """The starter source for ``kind`` (a key of ``STARTERS``)."""
    return (resources.files("optimus_lens.frontend") / "starters" / STARTERS[kind]).read_text(encoding="utf-8")


def stage_of(state: MutableMapping) -> str:
    """The stage Preview and Apply run on: the one chosen, or for "auto" where the source's
    passes would run (post-grad for a ``PatternMatcherPass`` file, else pre-grad)."""
    chosen = state.get("lab_stage", "auto")
    return lab_runner.default_stage(state["lab_source"]) if chosen == "auto" else chosen


def ran_with(state: MutableMapping) -> tuple[str, str, str, str, str]:
    """(model spec, pattern name, source, stage, mode) on screen now: what Preview or Apply would run."""
    mode = state.get("lab_mode", "inference")
    return state["lab_spec"].strip(), state["lab_name"].strip(), state["lab_source"], stage_of(state), mode


def replace_code(state: MutableMapping, source: str, name: str | None, came_from: str) -> None:
    """Put ``source`` in the editor (a fresh one, so it shows), named ``name`` (None: keep
    the name), and forget the results of other code."""
    state["lab_source"] = source
    if name is not None:
        state["lab_name"] = name
    state["lab_rev"] = state.get("lab_rev", 0) + 1
    state["lab_loaded"] = came_from
    state["lab_result"] = state["lab_bench"] = None


def load_file(state: MutableMapping, file_name: str, data: bytes) -> bool:
    """A loaded pattern file: its text in the editor, its stem as the pattern's name. False,
    with ``lab_upload_error`` set and the editor unchanged, for a file that is not UTF-8."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        state["lab_upload_error"] = f"{file_name} is not UTF-8 text; the editor keeps its code."
        return False
    replace_code(state, text, Path(file_name).stem, f"loaded from {file_name}")
    return True


def _on_upload() -> None:
    state = st.session_state
    up = state.get("lab_upload")
    if up is not None:
        load_file(state, up.name, up.getvalue())


def _on_starter() -> None:
    state = st.session_state
    kind = state["lab_starter_kind"]
    replace_code(state, starter(kind), STARTER_NAMES[STARTERS[kind]], f"starter: {kind}")


def _on_sample() -> None:
    state = st.session_state
    pick = state.get("lab_sample_pick")
    if pick:
        state["lab_spec"] = f"sample:{pick}"
    state["lab_sample_pick"] = None


def _editor(state: MutableMapping, annotations: list[dict]) -> str:
    """The code editor (Ace, Python highlighting), or a text area where the component is not
    installed; a new ``lab_rev`` makes a fresh one showing ``lab_source``. Returns its text."""
    source, rev = state["lab_source"], state.get("lab_rev", 0)
    try:
        from streamlit_ace import st_ace
    except ImportError:
        return st.text_area("Pattern source", source, height=360, key=f"lab_textarea_{rev}")
    out = st_ace(
        value=source,
        language="python",
        theme="chrome",
        font_size=15,  # at 14 px Ace's 16 px lines hide '_' in DejaVu Sans Mono (Linux's monospace)
        min_lines=18,
        max_lines=40,
        annotations=annotations or None,
        auto_update=True,
        key=f"lab_ace_{rev}",
    )
    return source if out is None else out


def controls(state) -> None:
    """The model box (with a sample picker that fills it), the pattern's name, the starters."""
    c1, c1b, c2, c3, c4 = st.columns([3, 1.3, 1.7, 2, 1.1], vertical_alignment="bottom")
    c1.text_input("Model", key="lab_spec", persist_state=S.KEEP, placeholder="sample:swish_mlp", help=SPEC_HELP)
    c1b.selectbox(
        "Samples",
        sample_models.names(),
        index=None,
        key="lab_sample_pick",
        placeholder="pick one",
        on_change=_on_sample,
        help="fills the model box with sample:NAME",
    )
    c2.text_input(
        "Pattern name",
        key="lab_name",
        persist_state=S.KEEP,
        help="the file and the pass are named after it (a loaded file names it)",
    )
    c3.selectbox("Start from", list(STARTERS), key="lab_starter_kind", persist_state=S.KEEP)
    c4.button(
        "Load",
        key="lab_load_starter",
        on_click=_on_starter,
        width="stretch",
        help="put the starter in the editor and name the pattern after it",
    )
    d1, d2, _ = st.columns([2, 1.6, 4.4], vertical_alignment="bottom")
    auto = lab_runner.default_stage(state["lab_source"])
    d1.selectbox(
        "Stage",
        STAGE_CHOICES,
        key="lab_stage",
        persist_state=S.KEEP,
        format_func=lambda s: f"auto: {auto}" if s == "auto" else s,
        help="pre-grad: the Dynamo graph; post-grad: the ATen graphs Inductor's post-grad passes see (forward, "
        "and backward in training). auto: post-grad for a PatternMatcherPass file, where Inductor runs it",
    )
    d2.selectbox(
        "Mode",
        ("inference", "training"),
        key="lab_mode",
        persist_state=S.KEEP,
        help="training: the post-grad stage has a backward graph too",
    )


def page() -> None:
    """Draw the Pattern Lab."""
    state = st.session_state
    S.init(state)
    st.subheader("Pattern Lab")
    st.caption(
        f"Your code runs only when you press **Preview** or **Apply**, in a separate `optimus` process "
        f"limited to {state['lab_time_limit']:g} s; a pattern that raises, loops or breaks the graph is "
        "reported and changes nothing here."
    )
    controls(state)
    errs = lab_runner.syntax_errors(state["lab_source"])
    left, right = st.columns([6, 5])
    below = st.container()  # a preview's graphs, the whole page wide, under the editor and the result
    with left:
        came_from = state.get("lab_loaded")
        st.markdown(
            f"**`{lab_runner.pass_name(state['lab_name'] or 'my_pattern')}.py`**"
            + (f" <span style='color:#777'>— {came_from}</span>" if came_from else ""),
            unsafe_allow_html=True,
        )
        state["lab_source"] = _editor(state, errs)
        errs = lab_runner.syntax_errors(state["lab_source"])
        for e in errs:
            st.error(f"Syntax error, {e['text']}")
        made_from = ran_with(state)
        spec, name, source, stage, mode = made_from
        blocked = bool(errs) or not spec or not name
        b1, b2, b3, b4 = st.columns([1, 1.6, 1.1, 1.2], gap="small")
        limit = state["lab_time_limit"]
        if b1.button("Preview", type="primary", disabled=blocked, key="lab_preview"):
            with st.spinner("Matching in a separate process…"):
                r = lab_runner.preview(spec, source, name, time_limit_s=limit, stage=stage, mode=mode)
            _keep_result(state, r, "preview", made_from)
        if b2.button("Apply as a pass", disabled=blocked, key="lab_apply"):
            with st.spinner("Running the pattern as a pass, verifying every step…"):
                r = lab_runner.apply(spec, source, name, time_limit_s=limit, stage=stage, mode=mode)
            _keep_result(state, r, "apply", made_from)
        b3.download_button(
            "Save .py",
            source.encode(),
            file_name=f"{lab_runner.pass_name(name or 'pattern')}.py",
            mime="text/x-python",
            key="lab_save",
        )
        with b4.popover("Load .py", help="load a pattern file into the editor"):  # keeps the graphs near the top
            st.file_uploader("Load a pattern file (.py)", type=["py"], key="lab_upload", on_change=_on_upload)
        if not spec or not name:
            st.caption("Name the model and the pattern to preview or apply it.")
        if state.get("lab_upload_error"):
            st.error(state.pop("lab_upload_error"))
    with right:
        result(state, below)


def _keep_result(state: MutableMapping, r, action: str, made_from: tuple) -> None:
    """A new Preview or Apply result replaces the old one and every figure made from it."""
    state["lab_result"], state["lab_action"], state["lab_ran"] = r, action, made_from
    state["lab_bench"] = None


def is_stale(state: MutableMapping) -> bool:
    """True when the result on screen was made from another model, name, code, stage or mode
    than the ones on screen now."""
    return state.get("lab_result") is not None and state.get("lab_ran") != ran_with(state)


def result(state, below=None) -> None:
    r = state.get("lab_result")
    if r is None:
        st.info("Press **Preview** to see every place the pattern matches (the graph is not changed).")
        return
    stale = is_stale(state)
    if stale:
        spec, name, _, stage, mode = state["lab_ran"]
        st.warning(
            f"**Stale**: this result is from earlier code, name, model or stage (`{name}` on `{spec}`, "
            f"{stage}, {mode}). "
            "Preview or Apply again to see what the code on screen does.",
            icon=":material/sync_problem:",
        )
    if r.error:
        st.error(f"**{r.error[0]}**\n\n{r.error[1]}")
    if state.get("lab_action") == "preview" and r.preview is not None:
        lab_results.preview_panel(r, below)
    elif state.get("lab_action") == "apply" and r.trace is not None:
        apply_panel(state, r, stale)
    with st.expander("process output"):
        st.code(r.log or "(nothing printed)", language="text")


def apply_panel(state, r, stale: bool = False) -> None:
    t = r.trace
    st.markdown(lab_results.apply_header(t, r.seconds))
    rows = lab_results.step_rows(t)
    if rows:
        st.dataframe(rows, hide_index=True)
    if not rows:
        return
    why_off = "Preview or Apply the code on screen first: this result is stale." if stale else None
    c1, c2 = st.columns(2)
    c1.button(
        "Open in the step viewer",
        key="lab_open",
        on_click=open_in_viewer,
        args=(state, t),
        disabled=stale,
        help=why_off or "the trace, its model and your pattern: the sidebar names them, Run and Why not? include it",
    )
    if c2.button("Time it", key="lab_time", disabled=stale, help=why_off):
        with st.spinner("Timing in a separate process (one thread, interleaved rounds)…"):
            spec, name, source, stage, mode = state["lab_ran"]
            r = lab_runner.bench(spec, source, name, stage=stage, mode=mode)
            state["lab_bench"] = (state["lab_ran"], r)
    kept = state.get("lab_bench")
    if kept is None or kept[0] != state.get("lab_ran"):
        return
    b = kept[1]
    if not b.ok:
        st.error(f"**{b.error[0]}**\n\n{b.error[1]}")
        return
    data = b.extra["bench"]
    st.dataframe(
        [
            {
                "stage": x["name"],
                "median ms": round(x["latency_ms_median"], 3),
                "p10..p90 ms": f"{x['latency_ms_p10']:.3f}..{x['latency_ms_p90']:.3f}",
                "speedup": f"{x['speedup_vs_baseline']:.2f}x",
                "peak bytes": x["peak_bytes"],
            }
            for x in data["stages"]
        ],
        hide_index=True,
    )
    st.caption(f"{data.get('device', 'cpu')}, {data.get('method', '')}; ratios from one run, stages interleaved")


def file_passes(trace) -> list[str]:
    """The passes of ``trace`` (every graph's) that a pattern file made: those that are not
    shipped passes of the pre-grad or post-grad pipeline (a file's pass may not take a shipped
    name, :func:`optimus_lens.frontend.patternfile.pipeline_with`): the file's own pass, or one
    per ``PatternMatcherPass`` of an Inductor file (``addcmul_fusion``), named apart from the file."""
    from optimus_lens.passes import default_pipeline
    from optimus_lens.passes.post_grad import post_grad_pipeline

    shipped = {*default_pipeline().names(), *post_grad_pipeline().names()}
    return list(dict.fromkeys(p["name"] for t in trace.traces() for p in t.passes if p["name"] not in shipped))


def open_in_viewer(state, trace) -> None:
    """Button callback: show ``trace`` in the step viewer page (on the next run,
    :func:`optimus_lens.app.state.go_to`) with its model and the pattern: the sidebar names the
    model (:func:`optimus_lens.app.state.show_model`), its Stage and Mode are the result's, and it
    ticks the passes of every graph of the trace (the post-grad panel's for the ATen graphs),
    the pattern's own toggle standing for the file's passes (:func:`file_passes`: for an Inductor
    file its ``PatternMatcherPass`` es, not named after the file); the view opens on the first
    graph with a step (the forward ATen graph of a post-grad run). Run, Why not? and the code
    diff work on it. The pattern's code runs there too only in a child process."""
    from optimus_lens.app.toggles import OURS, USE_PATTERN

    spec, name, source, stage, mode = state["lab_ran"]
    state["run_stage"], state["run_mode"] = stage, mode  # Run in the viewer runs the same stage again
    mine = file_passes(trace) or [lab_runner.pass_name(name)]
    state["view_graph"] = next((t.graph for t in trace.traces() if t.steps), trace.graph)
    S.set_trace(state, trace, spec, f"Pattern Lab: {lab_runner.pass_name(name)}.py on {spec}")
    state["pattern"] = {"name": name, "source": source, "passes": mine}
    S.show_model(state, spec)
    ran = [p for t in trace.traces() for p in t.passes]
    state[USE_PATTERN] = any(p.get("enabled", True) for p in ran if p["name"] in mine)
    for p in ran:
        if p["name"] not in mine:
            state[f"pass:{p['name']}"] = bool(p.get("enabled", True))
    state["pass_source"], state["verify"] = OURS, "step"  # the Lab verifies every step
    S.go_to(state, S.VIEWER)
