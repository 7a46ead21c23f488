"""The Pattern Lab page: write a pattern, preview where it matches, ask why it does not,
apply it as a pass and step through the result.

User code runs only when a button is pressed, in a child process with a time limit
(:mod:`optimus_lens.app.lab_runner`); the page says so. Session-state keys (all prefixed ``lab_``):
``lab_source`` (the editor's text, never lost on an error), ``lab_name`` (file name),
``lab_spec`` (model), ``lab_result`` (the last LabResult), ``lab_action`` ("preview" /
"apply"), ``lab_time_limit`` (s).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import streamlit as st

from optimus_lens import sample_models, viz
from optimus_lens.app import lab_runner
from optimus_lens.app.graphview import show_view

STARTERS = {
    "pattern / replacement functions": "functions.py",
    "declarative rule (optimus_lens.core.lang)": "rule.py",
    "BatchPattern class": "batch.py",
}
_STARTER_DIR = Path(str(resources.files("optimus_lens.frontend") / "starters"))


def starter(kind: str) -> str:
    """The starter source for ``kind`` (a key of ``STARTERS``)."""
    return (_STARTER_DIR / STARTERS[kind]).read_text(encoding="utf-8")


def init(state) -> None:
    defaults = {
        "lab_source": starter("pattern / replacement functions"),
        "lab_name": "swish",
        "lab_spec": "sample:swish_mlp",
        "lab_result": None,
        "lab_action": None,
        "lab_time_limit": lab_runner.TIME_LIMIT_S,
    }
    for k, v in defaults.items():
        state.setdefault(k, v)


def _editor(source: str, annotations: list[dict]) -> str:
    """The code editor (Ace, Python highlighting; Ctrl+Enter or Apply saves), or a text
    area where the component is not installed."""
    try:
        from streamlit_ace import st_ace
    except ImportError:
        return st.text_area("Pattern source", source, height=360, key="lab_textarea")
    out = st_ace(
        value=source,
        language="python",
        theme="chrome",
        font_size=14,
        min_lines=18,
        max_lines=40,
        annotations=annotations or None,
        auto_update=True,
        key="lab_ace",
    )
    return source if out is None else out


def controls(state) -> None:
    c1, c2, c3 = st.columns([3, 2, 2])
    names = sample_models.names()
    spec = state["lab_spec"]
    options = [f"sample:{n}" for n in names]
    idx = options.index(spec) if spec in options else 0
    state["lab_spec"] = c1.selectbox("Model", options, index=idx, key="lab_model_select")
    state["lab_name"] = c2.text_input(
        "Pattern file name",
        state["lab_name"],
        key="lab_name_input",
        help="the pass and (for the functions form) the pattern are named after it",
    )
    kind = c3.selectbox("Start from", list(STARTERS), key="lab_starter_kind")
    if c3.button("Load starter", key="lab_load_starter"):
        state["lab_source"] = starter(kind)
        state["lab_result"] = None


def page() -> None:
    """Draw the Pattern Lab."""
    state = st.session_state
    init(state)
    st.subheader("Pattern Lab")
    st.caption(
        f"Your code runs only when you press **Preview** or **Apply**, in a separate `optimus` process "
        f"limited to {state['lab_time_limit']:g} s; a pattern that raises, loops or breaks the graph is "
        "reported and changes nothing here."
    )
    controls(state)
    errs = lab_runner.syntax_errors(state["lab_source"])
    left, right = st.columns([6, 5])
    with left:
        state["lab_source"] = _editor(state["lab_source"], errs)
        errs = lab_runner.syntax_errors(state["lab_source"])
        for e in errs:
            st.error(f"Syntax error, {e['text']}")
        b1, b2, b3 = st.columns(3)
        if b1.button("Preview", type="primary", disabled=bool(errs), key="lab_preview"):
            with st.spinner("Matching in a separate process…"):
                state["lab_result"] = lab_runner.preview(
                    state["lab_spec"], state["lab_source"], state["lab_name"], time_limit_s=state["lab_time_limit"]
                )
            state["lab_action"] = "preview"
        if b2.button("Apply as a pass", disabled=bool(errs), key="lab_apply"):
            with st.spinner("Running the pattern as a pass, verifying every step…"):
                state["lab_result"] = lab_runner.apply(
                    state["lab_spec"], state["lab_source"], state["lab_name"], time_limit_s=state["lab_time_limit"]
                )
            state["lab_action"] = "apply"
        b3.download_button(
            "Save .py",
            state["lab_source"].encode(),
            file_name=f"{state['lab_name'] or 'pattern'}.py",
            mime="text/x-python",
            key="lab_save",
        )
        up = st.file_uploader("Load a pattern file (.py)", type=["py"], key="lab_upload")
        if up is not None and state.get("lab_upload_id") != up.file_id:
            state["lab_upload_id"] = up.file_id
            try:
                state["lab_source"] = up.getvalue().decode("utf-8")
                state["lab_name"] = Path(up.name).stem
                st.rerun()
            except UnicodeDecodeError:
                st.error(f"{up.name} is not UTF-8 text; the editor keeps its code.")
    with right:
        result(state)


def result(state) -> None:
    r = state.get("lab_result")
    if r is None:
        st.info("Press **Preview** to see every place the pattern matches (the graph is not changed).")
        return
    if r.error:
        st.error(f"**{r.error[0]}**\n\n{r.error[1]}")
    if state.get("lab_action") == "preview" and r.preview is not None:
        preview_panel(r)
    elif state.get("lab_action") == "apply" and r.trace is not None:
        apply_panel(state, r)
    with st.expander("process output"):
        st.code(r.log or "(nothing printed)", language="text")


def preview_panel(r) -> None:
    pv, snap = r.preview, r.trace.initial_graph
    st.markdown(
        f"**{len(pv.matches)} match(es)**, {len(pv.near_misses)} near miss(es) — in {r.seconds:.1f} s; "
        "the graph is unchanged."
    )
    marks = viz.Marks(group_labels=[f"{m.pattern} at {m.anchor}" for m in pv.matches])
    for i, m in enumerate(pv.matches):
        for n in m.sites:
            marks.groups.setdefault(n, i)
    near = {f"{m.node} ({m.pattern})": m for m in pv.near_misses}
    pick = st.selectbox(
        "Why not here?",
        ["—"] + list(near),
        key="lab_why_node",
        help="nodes whose op the pattern starts from, where it does not match",
    )
    if pick != "—":
        m = near[pick]
        st.warning(f"**{m.pattern}** does not match at `{m.node}`: {m.reason}")
        marks = viz.Marks(
            groups={n: 0 for n in m.partial or [m.node]}, group_labels=[f"best partial match of {m.pattern}"]
        )
    show_view(viz.graph_view(snap, marks, "", viz.ViewOptions(legend_in_graph=False)), height=520)


def apply_panel(state, r) -> None:
    t = r.trace
    st.markdown(f"**{len(t.steps)} step(s)**, {t.nodes_before} → {t.nodes_after} nodes, in {r.seconds:.1f} s.")
    rows = [
        {
            "step": s.index,
            "pattern": s.pattern,
            "sites": ", ".join(s.sites[:6]),
            "verify": "—" if s.verify is None else ("ok" if s.verify.ok else "FAILED"),
        }
        for s in t.steps
    ]
    if rows:
        st.dataframe(rows, hide_index=True)
    if t.steps:
        c1, c2 = st.columns(2)
        c1.button("Open in the step viewer", key="lab_open", on_click=open_in_viewer, args=(state, t))
        if c2.button("Time it", key="lab_time"):
            with st.spinner("Timing in a separate process (one thread, interleaved rounds)…"):
                state["lab_bench"] = lab_runner.bench(state["lab_spec"], state["lab_source"], state["lab_name"])
        b = state.get("lab_bench")
        if b is not None and not b.ok:
            st.error(f"**{b.error[0]}**\n\n{b.error[1]}")
        elif b is not None:
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
            st.caption(
                f"{data.get('device', 'cpu')}, {data.get('method', '')}; ratios from one run, stages interleaved"
            )


def open_in_viewer(state, trace) -> None:
    """Button callback: show ``trace`` in the step viewer page (on the next run,
    :func:`optimus_lens.app.state.go_to`). The viewer cannot re-run or time a user pattern
    (that would run its code in the app's process), so the trace is shown as a file is:
    time it here with "Time it"."""
    from optimus_lens.app.state import VIEWER, go_to, set_trace

    set_trace(state, trace, None, f"Pattern Lab: {state['lab_name']}.py on {state['lab_spec']}")
    go_to(state, VIEWER)
