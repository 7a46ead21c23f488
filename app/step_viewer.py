"""The step viewer page: pick a model in the sidebar and run the passes (or open a
trace file), then step through the trace one match at a time — the step's before | after
or diff picture, the node inspector, why-not, the step's facts, timing, export.

Thin by design: widgets and session state only. Capturing and running the pipeline is
:func:`optimus_lens.frontend.run.optimize`, timing is :func:`optimus_lens.perf.bench.bench_pipeline`,
every picture and figure comes from :mod:`optimus_lens.viz`, the session logic is
:mod:`optimus_lens.app.state`, the controls :mod:`optimus_lens.app.view_controls` and the
pictures :mod:`optimus_lens.app.step_pictures`.
"""

from __future__ import annotations

import os
from dataclasses import replace

import pandas as pd
import streamlit as st

from optimus_lens import sample_models, viz
from optimus_lens.app import compare_view, debug, inspector, presentation, toggles, upstream, why_panel
from optimus_lens.app import modules as app_modules
from optimus_lens.app import state as S
from optimus_lens.app.graphclick import on_pick
from optimus_lens.app.graphview import show_view
from optimus_lens.app.step_pictures import graphs
from optimus_lens.app.timing import timing_panel
from optimus_lens.app.view_controls import navigator, view_bar
from optimus_lens.passes import pass_catalogue
from optimus_lens.viz.palette import STANDARD

SOURCES = ("Sample model", "Python factory", "Trace file")
VERIFY_HELP = {
    "step": "check the graph after every step (slowest; pinpoints a failing step)",
    "end": "check once after the whole pipeline",
    "off": "no numeric check",
}
VERIFY_LABEL = {"step": "after each rewrite", "end": "once, at the end", "off": "off"}


@st.cache_resource
def pipeline():
    """The default pipeline (:func:`optimus_lens.passes.default_pipeline`, looked up when first
    asked for), one for every session."""
    from optimus_lens.passes import default_pipeline

    return default_pipeline()


@st.cache_data(show_spinner=False)
def _catalogue() -> dict[str, dict]:
    return {c["name"]: c for c in pass_catalogue()}


ss = st.session_state  # a proxy: every call reads the session of the run it is in


# ============================================================================ sidebar
def sidebar() -> tuple[str | None, bool]:
    """Draw the controls; returns (the spec to run, whether Run was pressed)."""
    with st.sidebar:
        st.title("Optimus Lens")
        st.caption("Optimus pre-grad batch fusions and split/cat cleanups, one match at a time.")
        source = st.radio("Model source", SOURCES, key="source_kind")
        spec = None
        if source == "Sample model":
            names = sample_models.names()
            first = os.environ.get(S.MODEL_ENV, "").removeprefix("sample:")
            name = st.selectbox(
                "Sample model",
                names,
                index=names.index(first if first in names else sample_models.DEFAULT),
                key="sample",
            )
            entry = sample_models.get_entry(name)
            st.caption(f"**{entry.kind}** — {entry.description}")
            spec = f"sample:{name}"
        elif source == "Python factory":
            spec = (
                st.text_input(
                    "Factory",
                    key="factory",
                    placeholder="package.module:factory",
                    help="A callable returning (nn.Module, example_inputs): package.module:factory "
                    "or path/to/file.py:factory, resolved from the current directory; or a "
                    "path/to/model.pt2 saved by torch.export.save.",
                ).strip()
                or None
            )
        else:
            up = st.file_uploader(
                "Trace JSON (saved by `optimus run --trace` or this app)", type=["json"], key="upload"
            )
            if up is not None and up.file_id != ss.upload_id:
                ss.upload_id = up.file_id
                S.accept_upload(ss, up.name, up.getvalue(), sample_models.names())

        toggles.pass_panel(pipeline())
        with st.expander(
            f"Checks: verify {VERIFY_LABEL[ss.get('verify', 'end')]}; {ss.get('capture_method', 'dynamo')} capture"
        ):
            st.radio(
                "Verify",
                ("step", "end", "off"),
                index=1,
                key="verify",
                format_func=VERIFY_LABEL.get,
                help="; ".join(f"{k}: {v}" for k, v in VERIFY_HELP.items()),
            )
            st.checkbox(
                "Compare gradients too",
                key="grads",
                help="Training-mode check: also compare input gradients after a backward pass.",
            )
            st.selectbox(
                "Capture method",
                ("dynamo", "symbolic"),
                key="capture_method",
                help="dynamo: the graph torch.compile hands a backend (what upstream pre_grad_passes "
                "see). symbolic: torch.fx symbolic tracing.",
            )
        run = st.button(
            "Run",
            type="primary",
            width="stretch",
            disabled=spec is None,
            help=None if spec else "Pick a sample model or enter a factory to run.",
        )
    return spec, run


def enabled_passes() -> list[str]:
    return [p.name for p in pipeline().passes if ss.get(f"pass:{p.name}", True)]


def run_spec(spec: str, graph_index: int | None = None) -> None:
    """Capture and optimise ``spec`` with progress; on failure keep the old trace and record the error."""
    from optimus_lens.frontend.run import optimize

    passes = enabled_passes()
    with st.status(f"Capturing {spec} …", expanded=True) as status:
        bar = st.progress(0.0, text="capturing the FX graph")
        done = {"steps": 0}

        def on_capture(c) -> None:
            status.update(label=f"Running {len(passes)} passes over {len(c.gm.graph.nodes)} nodes …")
            bar.progress(0.05, text=c.summary())

        def on_step(step) -> None:
            done["steps"] += 1
            at = passes.index(step.pass_name) if step.pass_name in passes else 0
            bar.progress(
                min(0.99, 0.05 + 0.95 * at / max(len(passes), 1)),
                text=f"{done['steps']} steps — step {step.index}: {step.pattern} ({step.pass_name})",
            )

        try:
            res = optimize(
                spec,
                passes=passes,
                verify=ss.verify,
                grads=ss.grads,
                capture_method=ss.capture_method,
                graph_index=graph_index,
                on_step=on_step,
                on_capture=on_capture,
            )
        except Exception as e:  # noqa: BLE001 - every failure is shown, the old trace stays
            ss.error = S.error_message(e)
            status.update(label=f"Failed: {ss.error[0]}", state="error", expanded=False)
            return
        bar.progress(1.0, text=f"{len(res.trace.steps)} steps")
        status.update(
            label=f"Done: {len(res.trace.steps)} steps, {res.trace.nodes_before} → {res.trace.nodes_after} nodes",
            state="complete",
            expanded=False,
        )
    S.set_trace(ss, res.trace, spec, f"run of {spec} (verify {ss.verify}, capture {ss.capture_method})")


# ============================================================================ main area
def header(trace) -> None:
    s = viz.trace_summary(trace)
    c = st.columns(5)
    c[0].metric("Nodes before", s["nodes_before"])
    c[1].metric("Nodes after", s["nodes_after"], delta=s["nodes_after"] - s["nodes_before"], delta_color="inverse")
    c[2].metric("Steps", s["steps"])
    c[3].metric("Failed steps", s["failed_steps"], delta_color="off")
    c[4].metric(
        "Final check",
        "ok"
        if trace.final_verify and trace.final_verify.ok
        else ("FAILED" if trace.final_verify and trace.final_verify.ok is False else "not checked"),
        help=s["final_verify"],
    )


def graph_breaks(trace) -> None:
    cap = trace.capture or {}
    n = cap.get("graphs", 1)
    if n <= 1:
        return
    reasons = "\n".join(f"- {r}" for r in cap.get("breaks", [])) or "- (no reason given)"
    st.warning(
        f"The model splits into **{n} graphs** at graph breaks; this trace optimises graph "
        f"{cap.get('graph_index', 0) + 1}.\n\n{reasons}"
    )
    sizes = cap.get("graph_nodes", [])
    cols = st.columns([3, 1], vertical_alignment="bottom")
    pick = cols[0].selectbox(
        "Graph to optimise",
        list(range(n)),
        index=cap.get("graph_index", 0),
        key="graph_pick",
        format_func=lambda i: f"graph {i + 1}" + (f" ({sizes[i]} nodes)" if i < len(sizes) else ""),
    )
    if cols[1].button("Re-run on this graph", disabled=ss.spec is None):
        run_spec(ss.spec, graph_index=pick)
        st.rerun()


def step_details(trace, cur: int) -> None:
    step = trace.step(cur)
    info = _catalogue().get(step.pattern, {})
    st.markdown(f"#### Step {cur}: `{step.pattern}` — pass `{step.pass_name}`")
    v = step.verify
    if v is not None and v.ok is False:
        st.error(f"Verification failed after this step: {viz.verify_text(v)}")
    elif v is not None and v.ok:
        st.success(f"Verified: {viz.verify_text(v)}")
    else:
        st.info(f"Not verified at this step ({viz.verify_text(v)}); verify mode 'step' checks every step.")
    left, right = st.columns([3, 2])
    with left:
        rows = [(k, t) for k, t in viz.step_facts(step, info) if k not in ("sites", "created", "erased", "replaced")]
        (k0, t0), rest = rows[0], rows[1:]
        st.markdown("\n".join([f"| {k0} | {_md(t0)} |", "|---|---|"] + [f"| **{k}** | {_md(t)} |" for k, t in rest]))
    with right:
        st.markdown(f"**Sites** ({len(step.sites)}): " + ", ".join(f"`{n}`" for n in step.sites))
        st.markdown(f"**Created** ({len(step.created)}): " + (", ".join(f"`{n}`" for n in step.created) or "none"))
        st.markdown(f"**Erased** ({len(step.erased)}): " + (", ".join(f"`{n}`" for n in step.erased) or "none"))
        if step.replaced:
            st.markdown("**Replaced** (provenance, old → new)")
            st.dataframe(
                pd.DataFrame({"old": list(step.replaced), "new": list(step.replaced.values())}),
                hide_index=True,
                width="stretch",
                height=min(300, 38 + 35 * len(step.replaced)),
            )


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def downloads(trace) -> None:
    st.markdown("#### Export")
    c = st.columns(3)
    name = (trace.model or "trace").replace(":", "_").replace("/", "_")
    c[0].download_button(
        "Download trace JSON", trace.dumps(), file_name=f"{name}.trace.json", mime="application/json", key="dl_trace"
    )
    if c[1].button("Build HTML report", key="report_btn"):
        with st.spinner("Drawing every step …"):
            ss.report = viz.html_report(trace, catalogue=list(_catalogue().values()), bench=ss.bench)
    if ss.get("report"):
        c[2].download_button(
            "Download HTML report", ss.report, file_name=f"{name}.report.html", mime="text/html", key="dl_report"
        )


def page() -> None:
    """The step viewer: the sidebar's model and passes, then the trace on screen (see the module docstring)."""
    spec, run = sidebar()
    if run and spec:
        ss.report = None
        before, old = toggles.place(ss), ss.trace
        source, selected = toggles.selection(ss, pipeline())
        if source == toggles.INDUCTOR:
            upstream.run_upstream(ss, spec, selected, ss.capture_method)
        else:
            run_spec(spec)
        if ss.trace is not old:
            toggles.keep_place(ss, before)
    if ss.error:  # shown once; the trace on screen is the last good one
        st.error(f"**{ss.error[0]}**: {ss.error[1]}" + ("\n\nStill showing the previous trace." if ss.trace else ""))
        ss.error = None
    trace = ss.trace
    if trace is None:
        st.title("Optimus Lens")
        st.markdown(
            "Choose a model in the sidebar and start the pipeline with the red button. The model is "
            "captured as a pre-grad FX graph, the Optimus passes rewrite it one greedy match at a time, "
            "and each rewrite is shown here as a before/after graph with the pattern sites highlighted. "
            "You can also open a saved trace file."
        )
        return
    s = viz.trace_summary(trace)
    st.markdown(
        f"**{trace.model or 'model'}**: {s['nodes_before']:,} → {s['nodes_after']:,} nodes in "
        f"{s['steps']} steps <span style='color:#888'>· {ss.source}</span>",
        unsafe_allow_html=True,
    )
    graph_breaks(trace)
    toggles.stale_marker(ss, pipeline())
    upstream.defects(trace)
    with st.container(key="lens_tools"):
        debug.failure_tools(ss, trace)
    if not trace.steps:
        st.info("No pattern matched: the pipeline made no step. The captured graph:")
        screen, opts = view_bar(len(trace.initial_graph), trace.model)
        # the captured graph has no marks: parallel copies fold when many, in the standard colours
        captured = viz.snapshot_view(trace, 0, replace(opts, fold=None, palette=STANDARD, legend_in_graph=False))
        show_view(
            captured,
            screen.height,
            opts.text_scale,
            key="snapshot_view",
            selected=ss.get("inspect_node"),
            on_pick=lambda v: on_pick(ss, v, trace, 0, [0]),
        )
        app_modules.module_control(ss, captured.modules)
        inspector.inspector(ss, trace, 0)
        header(trace)
    else:
        cur, pass_filter, mode = navigator(trace)
        screen, opts = view_bar(max(len(trace.before(cur)), len(trace.after(cur))), trace.model)
        presentation.apply(ss)
        graphs(trace, cur, pass_filter, mode, opts, screen)
        inspector.inspector(ss, trace, cur)  # under the graphs: a click on a node opens it there
        why_panel.why_panel(ss, trace, cur)
        step_details(trace, cur)
        header(trace)
        debug.step_tools(ss, trace, cur)
        st.plotly_chart(viz.node_count_figure(trace, current=cur), width="stretch")
    timing_panel(trace, ss)
    compare_view.compare_panel(ss)
    downloads(trace)
