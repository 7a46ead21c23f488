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

from dataclasses import replace

import pandas as pd
import streamlit as st

from optimus_lens import sample_models, viz
from optimus_lens.app import (
    compare_view,
    debug,
    inspector,
    lab_runner,
    log_source,
    presentation,
    toggles,
    upstream,
    why_panel,
)
from optimus_lens.app import modules as app_modules
from optimus_lens.app import state as S
from optimus_lens.app.graphclick import on_pick
from optimus_lens.app.graphview import show_view
from optimus_lens.app.step_pictures import graphs
from optimus_lens.app.timing import timing_panel
from optimus_lens.app.view_controls import navigator, view_bar
from optimus_lens.passes import pass_catalogue
from optimus_lens.viz.palette import STANDARD

SOURCES = (S.SAMPLE, S.FACTORY, S.COMPILE_LOG, S.TRACE_FILE)
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


@st.cache_resource
def post_pipeline():
    """The default post-grad pipeline (:func:`optimus_lens.passes.post_grad.post_grad_pipeline`),
    one for every session."""
    from optimus_lens.passes.post_grad import post_grad_pipeline

    return post_grad_pipeline()


STAGES = ("pre-grad", "post-grad", "all")
STAGE_HELP = {
    "pre-grad": "the Dynamo FX graph only (what upstream pre_grad_passes see)",
    "post-grad": "the ATen graphs after AOTAutograd (what post_grad_passes see), of the unchanged program",
    "all": "the pre-grad passes, then the post-grad passes on the ATen graphs of the rewritten program",
}


@st.cache_data(show_spinner=False)
def _catalogue() -> dict[str, dict]:
    return {c["name"]: c for c in pass_catalogue()}


ss = st.session_state  # a proxy: every call reads the session of the run it is in


# ============================================================================ sidebar
def sidebar() -> tuple[str | None, bool]:
    """Draw the controls; returns (the spec to run, whether Run was pressed). Every control
    keeps its value across page switches (``persist_state``; first values in
    :func:`optimus_lens.app.state.init`)."""
    with st.sidebar:
        st.title("Optimus Lens")
        st.caption(
            "Optimus batch fusions and split/cat cleanups, pre-grad and post-grad (ATen forward and "
            "backward), one match at a time."
        )
        source = st.radio("Model source", SOURCES, key="source_kind", persist_state=S.KEEP)
        spec = None
        if source == S.SAMPLE:
            names = sample_models.names()
            if ss.get("sample") not in names:
                ss["sample"] = sample_models.DEFAULT
            name = st.selectbox("Sample model", names, key="sample", persist_state=S.KEEP)
            entry = sample_models.get_entry(name)
            st.caption(f"**{entry.kind}** — {entry.description}")
            spec = f"sample:{name}"
        elif source == S.FACTORY:
            spec = (
                st.text_input(
                    "Factory",
                    key="factory",
                    persist_state=S.KEEP,
                    placeholder="package.module:factory",
                    help="Any model spec `optimus run` takes: package.module:factory or "
                    "path/to/file.py:factory (a callable returning (nn.Module, example_inputs)), resolved "
                    "from the current directory; path/to/model.pt2 saved by torch.export.save; hf:NAME; "
                    "sample:NAME.",
                ).strip()
                or None
            )
        elif source == S.COMPILE_LOG:
            spec = log_source.log_source()
        else:
            up = st.file_uploader(
                "Trace JSON (saved by `optimus run --trace` or this app)", type=["json"], key="upload"
            )
            if up is not None and up.file_id != ss.upload_id:
                ss.upload_id = up.file_id
                S.accept_upload(ss, up.name, up.getvalue(), sample_models.names())

        toggles.pass_panel(pipeline(), ss.get("pattern"))
        if ss.get("run_stage", "pre-grad") != "pre-grad":
            toggles.post_grad_panel(post_pipeline())
        with st.expander(
            f"Checks: {ss.get('run_stage', 'pre-grad')}, {ss.get('run_mode', 'inference')}; verify "
            f"{VERIFY_LABEL[ss.get('verify', 'end')]}; {ss.get('capture_method', 'dynamo')} capture",
            key="checks_panel",
        ):
            st.radio(
                "Stage",
                STAGES,
                key="run_stage",
                persist_state=S.KEEP,
                horizontal=True,
                help="Which graphs Run rewrites — " + "; ".join(f"{k}: {v}" for k, v in STAGE_HELP.items()),
            )
            st.radio(
                "Mode",
                ("inference", "training"),
                key="run_mode",
                persist_state=S.KEEP,
                horizontal=True,
                help="training: the model in train mode, pre-grad steps verified on gradients too, and the "
                "ATen forward and backward graphs (forward: outputs and saved activations; backward: gradients); "
                "inference: the forward ATen graph alone.",
            )
            st.radio(
                "Verify",
                ("step", "end", "off"),
                key="verify",
                persist_state=S.KEEP,
                format_func=VERIFY_LABEL.get,
                help="; ".join(f"{k}: {v}" for k, v in VERIFY_HELP.items()),
            )
            st.checkbox(
                "Compare gradients too",
                key="grads",
                persist_state=S.KEEP,
                help="Training-mode check: also compare input gradients after a backward pass.",
            )
            st.selectbox(
                "Capture method",
                ("dynamo", "symbolic"),
                key="capture_method",
                persist_state=S.KEEP,
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
        if spec:
            st.caption(run_plan(spec))
    return spec, run


def run_plan(spec: str) -> str:
    """One line under Run naming exactly what it runs: the model spec, the passes, the checks."""
    source, selected = toggles.selection(ss, pipeline(), ss.get("pattern"))
    n = len(selected)
    which = (
        f"PyTorch Inductor pre-grad pass{'es' if n != 1 else ''}"
        if source == toggles.INDUCTOR
        else (f"pass{'es' if n != 1 else ''}")
    )
    pattern = ss.get("pattern")
    mine = ""
    if pattern is not None and source != toggles.INDUCTOR and ss.get(toggles.USE_PATTERN, True):
        mine = f" (the last: your pattern {lab_runner.pass_name(pattern['name'])}, in a separate process)"
    stage, mode = ss.get("run_stage", "pre-grad"), ss.get("run_mode", "inference")
    if (stage != "pre-grad" and source == toggles.INDUCTOR) or (stage == "all" and mine):
        which += f" (pre-grad only: stage {stage} runs with Optimus Lens passes alone)"
    elif stage == "post-grad":
        n, which = len(toggles.post_grad_selection(ss, post_pipeline())) + bool(mine), "post-grad passes"
    elif stage == "all":
        which += f" then {len(toggles.post_grad_selection(ss, post_pipeline()))} post-grad passes"
    graphs = ("forward and backward" if mode == "training" else "forward") + " ATen graphs"
    where = {"post-grad": f" on the {graphs}", "all": f" (post-grad on the {graphs})"}.get(stage, "")
    how = f"{where}, {mode}" if stage != "pre-grad" or mode != "inference" else ""
    return (
        f"Runs `{spec}` — {n} {which}{mine}{how}, verify {VERIFY_LABEL[ss.get('verify', 'end')]}, "
        f"{ss.get('capture_method', 'dynamo')} capture."
    )


def enabled_passes() -> list[str]:
    return [p.name for p in pipeline().passes if ss.get(f"pass:{p.name}", True)]


def run_spec(spec: str, graph_index: int | None = None) -> None:
    """Capture and optimise ``spec`` with progress; on failure keep the old trace and record the error."""
    from optimus_lens.frontend.run import optimize

    passes = enabled_passes()
    stage, mode = ss.get("run_stage", "pre-grad"), ss.get("run_mode", "inference")
    post = post_pipeline().only(toggles.post_grad_selection(ss, post_pipeline())) if stage != "pre-grad" else None
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
                text=f"{done['steps']} steps — {step.graph} step {step.index}: {step.pattern} ({step.pass_name})",
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
                stage=stage,
                mode=mode,
                post_grad_pipeline=post,
            )
        except Exception as e:  # noqa: BLE001 - every failure is shown, the old trace stays
            ss.error = S.error_message(e)
            status.update(label=f"Failed: {ss.error[0]}", state="error", expanded=False)
            return
        t = res.trace
        bar.progress(1.0, text=f"{len(t.all_steps())} steps")
        status.update(
            label=f"Done: {len(t.all_steps())} steps, "
            + "; ".join(f"{g.graph} {g.nodes_before} → {g.nodes_after} nodes" for g in t.traces()),
            state="complete",
            expanded=False,
        )
    how = res.trace.capture.get("method", ss.capture_method)
    on = f"{stage}, {mode}, " if stage != "pre-grad" or mode != "inference" else ""
    S.set_trace(ss, res.trace, spec, f"run of {spec} ({on}verify {ss.verify}, capture {how})")


def run_with_pattern(spec: str, passes: list[str], pattern: dict, graph_index: int | None = None) -> None:
    """Run ``spec`` with ``passes``, the carried Pattern Lab ``pattern`` among them, in a child
    ``optimus run --pattern-file`` process (:func:`optimus_lens.app.lab_runner.apply`: the
    user's code never runs in the app's process); on failure keep the old trace and record the
    error. With the sidebar's stage post-grad it runs on the ATen graphs (its mode's), ``passes``
    replaced by the ticked post-grad passes and the pattern's (:func:`toggles.post_grad_run`);
    stage all runs the pre-grad graph only (the run plan says so)."""
    name = lab_runner.pass_name(pattern["name"])
    stage, mode = ss.get("run_stage", "pre-grad"), ss.get("run_mode", "inference")
    if stage == "post-grad":
        passes = toggles.post_grad_run(ss, post_pipeline())
    with st.status(f"Running {spec} with your pattern {name} in a separate process …", expanded=False) as status:
        r = lab_runner.apply(
            spec,
            pattern["source"],
            pattern["name"],
            verify=ss.verify,
            passes=passes,
            capture=ss.capture_method,
            grads=ss.grads,
            graph_index=graph_index,
            time_limit_s=ss.get("lab_time_limit", lab_runner.TIME_LIMIT_S),
            stage="post-grad" if stage == "post-grad" else "pre-grad",
            mode=mode,
        )
        if r.trace is None:
            ss.error = r.error or ("Run failed", r.log[-2000:])
            status.update(label=f"Failed: {ss.error[0]}", state="error")
            return
        status.update(label=f"Done: {len(r.trace.all_steps())} steps in {r.seconds:.1f} s", state="complete")
    on = f"{stage}, {mode}, " if stage == "post-grad" else ""
    S.set_trace(
        ss,
        r.trace,
        spec,
        f"run of {spec} with your pattern {name}.py ({on}verify {ss.verify}, capture {ss.capture_method}, "
        "in a separate process)",
    )


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
        pattern = S.includes_pattern(ss, trace)
        if pattern is not None:
            run_with_pattern(ss.spec, toggles.trace_passes(trace), pattern, graph_index=pick)
        else:
            run_spec(ss.spec, graph_index=pick)
        st.rerun()


def step_details(trace, cur: int) -> None:
    step = trace.step(cur)
    info = _catalogue().get(step.pattern, {})
    st.markdown(f"#### Step {cur}: `{step.pattern}` — pass `{step.pass_name}`")
    v = step.verify
    origin = trace.inherited_failures().get(cur)
    if origin is not None:  # one story per failure (Trace.failure_runs): not a defect of its own
        st.warning(
            f"Verification fails after this step only because step {origin} broke the graph and no step "
            f"since repaired it ({viz.verify_text(v)}); step {origin} is the defect."
        )
    elif v is not None and v.ok is False:
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
        on_pre_grad = S.shown_trace(ss) is ss.trace  # a step place is kept on the pre-grad graph
        before, old = (toggles.place(ss) if on_pre_grad else (None, 0)), ss.trace
        source, selected = toggles.selection(ss, pipeline(), ss.get("pattern"))
        if source == toggles.INDUCTOR:
            upstream.run_upstream(ss, spec, selected, ss.capture_method)
        elif ss.get("pattern") is not None and ss.get(toggles.USE_PATTERN, True):
            run_with_pattern(spec, selected, ss.pattern)
        else:
            run_spec(spec)
        if ss.trace is not old and on_pre_grad:
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
    counts = "; ".join(  # each graph of a run with ATen graphs (a post-grad run's steps are there)
        f"{t.graph + ' ' if trace.graphs else ''}{t.nodes_before:,} → {t.nodes_after:,} nodes in "
        f"{len(t.steps)} step{'' if len(t.steps) == 1 else 's'}"
        for t in trace.traces()
    )
    st.markdown(
        f"**{trace.model or 'model'}**: {counts} <span style='color:#888'>· {ss.source}</span>",
        unsafe_allow_html=True,
    )
    graph_breaks(trace)
    toggles.stale_marker(ss, pipeline())
    stale = toggles.stage_stale(ss, post_pipeline())
    if stale:
        st.warning(f"**Stage, mode or passes changed: Run to update** — {stale}.", icon=":material/sync_problem:")
    root, trace = trace, graph_picker(trace)
    upstream.defects(trace)
    with st.container(key="lens_tools"):
        debug.failure_tools(ss, trace)
    if not trace.steps:
        st.info(
            f"No pattern matched on the {trace.graph} graph: the pipeline made no step. The "
            + ("captured graph:" if trace is root else "ATen graph as AOTAutograd's partitioner left it:")
        )
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
        if trace is root or S.includes_pattern(ss, trace) is not None:  # a carried pattern: its ATen graphs too
            why_panel.why_panel(ss, trace, cur)
        else:
            st.caption(
                f"Why not? on an ATen graph: `{aten_command('why', root, 'NODE')}` (GRAPH:NODE where the name is in both)."
            )
        step_details(trace, cur)
        header(trace)
        debug.step_tools(ss, trace, cur)
        st.plotly_chart(viz.node_count_figure(trace, current=cur), width="stretch")
    if trace is root:
        timing_panel(trace, ss)
        compare_view.compare_panel(ss)
    else:
        st.markdown("#### Per-pass timing and comparison")
        st.caption(
            f"Timing here is per pre-grad pass: time the {trace.graph} graph's post-grad passes with "
            f"`{aten_command('bench', root)}`, and compare them with upstream's with `{aten_command('compare', root)}`."
        )
    compare_view.trace_compare(ss)
    downloads(root)


def aten_command(command: str, trace, *extra: str) -> str:
    """The ``optimus`` command line that does ``command`` on the ATen graphs of the run on screen
    (its model, stage and mode)."""
    stage = trace.capture.get("stage", "all")
    mode = trace.capture.get("mode", "training" if len(trace.graphs) > 1 else "inference")
    model = ss.get("spec") or trace.model or "MODEL"
    return " ".join(
        ["optimus", command, model, *extra, "--stage", stage if stage != "pre-grad" else "all", "--mode", mode]
    )


def graph_picker(trace):
    """The "Graph" picker above the step navigator, for a trace with ATen graphs (a run with
    stage post-grad or all, or such a trace file): pre-grad / forward / backward, with each
    graph's step count; each graph keeps the step it was left on. Returns the picked graph's
    Trace (the trace itself when it has no ATen graph)."""
    names = trace.graph_names()
    if len(names) < 2:
        return trace
    if ss.get("view_graph") not in names:
        ss["view_graph"] = trace.graph
    st.radio(
        "Graph",
        names,
        key="view_graph",
        persist_state=S.KEEP,
        horizontal=True,
        format_func=lambda n: S.graph_label(trace, n),
        on_change=S.pick_graph,
        args=(ss,),
        help="pre-grad: the Dynamo FX graph the pre-grad passes rewrite. forward / backward: the ATen "
        "graphs AOTAutograd's partitioner hands Inductor's post_grad_passes, each with its own steps "
        "(numbered from 1) and checks (forward: outputs and saved activations; backward: gradients).",
    )
    ss[S.GRAPH_SHOWN] = ss["view_graph"]
    return S.shown_trace(ss)
