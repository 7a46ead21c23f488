"""Optimus Lens — step through Optimus graph passes in the browser.

    streamlit run app/main.py

Thin by design: widgets and session state only. Capturing and running the pipeline
is :func:`optimus_lens.frontend.run.optimize`, timing is :func:`optimus_lens.perf.bench.bench_pipeline`,
every picture and figure comes from :mod:`viz`, and the session logic is
:mod:`app.state`.
"""

from __future__ import annotations

import os

import pandas as pd
import streamlit as st

from optimus_lens import sample_models, viz
from optimus_lens.app import compare_view, debug, inspector, presentation, toggles, upstream, why_panel
from optimus_lens.app import modules as app_modules
from optimus_lens.app import state as S
from optimus_lens.app.graphclick import graph_view, on_pick, selection_line
from optimus_lens.app.graphview import drawn_note as _drawn_note
from optimus_lens.app.graphview import show_view
from optimus_lens.app.timing import timing_panel
from optimus_lens.passes import default_pipeline, pass_catalogue

SOURCES = ("Sample model", "Python factory", "Trace file")
VERIFY_HELP = {
    "step": "check the graph after every step (slowest; pinpoints a failing step)",
    "end": "check once after the whole pipeline",
    "off": "no numeric check",
}
VERIFY_LABEL = {"step": "after each rewrite", "end": "once, at the end", "off": "off"}
FULL_VIEW_LIMIT = 2000  # nodes; dot needs ~2 s here, ~17 s at 5,000

st.set_page_config(page_title="Optimus Lens", layout="wide")
# the step's graphs should start above the fold at 1280x800: less empty space above the page
st.markdown("<style>.block-container{padding-top:2.2rem;padding-bottom:1rem}</style>", unsafe_allow_html=True)
ss = st.session_state
S.init(ss)
presentation.init(ss)


@st.cache_resource
def _pipeline():
    return default_pipeline()


@st.cache_data(show_spinner=False)
def _catalogue() -> dict[str, dict]:
    return {c["name"]: c for c in pass_catalogue()}


PIPELINE = _pipeline()


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
            first = os.environ.get("OPTIMUS_LENS_MODEL", "").removeprefix("sample:")  # `optimus app --model`
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

        toggles.pass_panel(PIPELINE)
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
    return [p.name for p in PIPELINE.passes if ss.get(f"pass:{p.name}", True)]


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


def navigator(trace) -> tuple[int, str | None, str]:
    """Pass filter, view mode, step slider and Previous/Next (in presentation mode: the
    slider, Previous/Next and the presentation switch); returns (step, pass filter, mode)."""
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


TEXT_SIZES = {"small": 0.8, "normal": 1.0, "large": 1.3, "projector": 1.7}
PICTURES = ("Side by side", "Diff", "Stacked")


def view_bar(n_nodes: int) -> tuple[dict, dict]:
    """The always-visible view controls — picture, text size, presentation switch — and
    the rest in a popover (all hidden, their settings kept, in presentation mode); returns
    (bar, graph options)."""
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
        opts = graph_options(n_nodes)
    return {
        "picture": picture,
        "text_scale": presentation.TEXT_SCALE if present else TEXT_SIZES[size],
        "presentation": present,
        "palette": presentation.palette(ss),
    }, opts


def graph_options(n_nodes: int) -> dict:
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
        ("auto", "on", "off"),
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
    return {
        "hops": int(hops),
        "fold_params": fold,
        "clusters": clusters,
        "modules": app_modules.MODES[modules],
        "fold": {"auto": None, "on": True, "off": False}[parallel],
        "keep": keep,
        "full": bool(full) and n_nodes <= FULL_VIEW_LIMIT,
        "height": int(height),
    }


@st.cache_data(max_entries=512, show_spinner=False)
def _pinned_svg(dot_source: str) -> str:
    return viz.draw_pinned(dot_source)


def _cached(kind: str, key: tuple, make):
    """Per-session cache of pictures and layouts of the trace on screen (a new trace clears it)."""
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


def graphs(trace, cur: int, pass_filter: str | None, mode: str, opts: dict, bar: dict) -> None:
    """The step's picture: before | after (or stacked) on one layout, or the diff, in one pan/zoom viewer."""
    height = opts.pop("height") + (160 if bar["presentation"] else 0)
    opts["unfolded"] = app_modules.unfolded(ss, trace.model)
    if mode == "Whole pass":
        drawing = viz.ViewOptions(
            legend_in_graph=False, palette=bar["palette"], **{k: v for k, v in opts.items() if k != "keep"}
        )
        views = [viz.pass_view(trace, pass_filter, side, drawing) for side in ("before", "after")]
        rendered = [viz.render_view(v) for v in views]
        panes = [(f"Before pass {pass_filter}", rendered[0].svg), (f"After pass {pass_filter}", rendered[1].svg)]
        notes = views[1].notes + [r.note for r in rendered if r.note]
        steps = trace.steps_of_pass(pass_filter)
        graph_view(
            panes,
            views[0].focus + views[1].focus,
            views[1].legend,
            notes,
            key="pass_view",
            height=height,
            stacked=bar["picture"] == "Stacked",
            text_scale=bar["text_scale"],
            selected=ss.get("inspect_node"),
            on_pick=lambda v: on_pick(ss, v, trace, cur, [steps[0].index - 1, steps[-1].index]),
        )
        st.caption(
            f"Whole pass: each side laid out on its own. Before: {_drawn_note(views[0])}. "
            f"After: {_drawn_note(views[1])}."
        )
        app_modules.module_control(ss, list(dict.fromkeys(views[0].modules + views[1].modules)))
        return
    keep = opts.pop("keep") and opts["modules"] is not True
    opts["palette"] = bar["palette"]
    key = tuple(sorted((k, tuple(sorted(v)) if isinstance(v, frozenset) else v) for k, v in opts.items()))
    try:
        shared = (
            None
            if not keep
            else _cached(
                "trace_layout",
                (opts["fold_params"], opts["clusters"]),
                lambda: viz.trace_layout(
                    trace, viz.ViewOptions(fold_params=opts["fold_params"], clusters=opts["clusters"])
                ),
            )
        )
        pic = _cached(
            "picture", (cur, *key), lambda: viz.step_picture(trace, cur, viz.ViewOptions(**opts), layout=shared)
        )
        if bar["picture"] == "Diff":
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
    sides = [None] if bar["picture"] == "Diff" else [cur - 1, cur]
    with st.container(key="lens_graph"):
        graph_view(
            panes,
            focus,
            pic.diff.legend,
            pic.diff.notes,
            key="step_view",
            stacked=bar["picture"] == "Stacked",
            text_scale=bar["text_scale"],
            height=height * (2 if bar["picture"] == "Stacked" else 1),
            selected=ss.get("inspect_node"),
            picked=selection_line(trace, [cur, cur - 1], ss.get("inspect_node")),
            partial=why_panel.partial(ss, trace, cur),
            animate_key=f"{trace.model}|{'diff' if bar['picture'] == 'Diff' else 'pair'}",
            fill_window=bool(ss.get("presentation")),
            on_pick=lambda v: on_pick(ss, v, trace, cur, sides),
        )
    how = "one layout for all steps" if pic.layout is shared else "one layout for before and after"
    st.caption(
        f"Before: {_drawn_note(pic.before)}. After: {_drawn_note(pic.after)}. Layout: {pic.layout.method}, "
        f"{how}" + (f" — {pic.layout.note}" if pic.layout.note else "") + "."
    )
    app_modules.module_control(ss, pic.diff.modules)


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


def main() -> None:
    spec, run = sidebar()
    if run and spec:
        ss.report = None
        before, old = toggles.place(ss), ss.trace
        source, selected = toggles.selection(ss, PIPELINE)
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
    toggles.stale_marker(ss, PIPELINE)
    upstream.defects(trace)
    with st.container(key="lens_tools"):
        debug.failure_tools(ss, trace)
    if not trace.steps:
        st.info("No pattern matched: the pipeline made no step. The captured graph:")
        bar, opts = view_bar(len(trace.initial_graph))
        height = opts.pop("height")
        opts.pop("fold"), opts.pop("keep")
        opts["unfolded"] = app_modules.unfolded(ss, trace.model)
        captured = viz.snapshot_view(trace, 0, viz.ViewOptions(legend_in_graph=False, **opts))
        show_view(
            captured,
            height,
            bar["text_scale"],
            key="snapshot_view",
            selected=ss.get("inspect_node"),
            on_pick=lambda v: on_pick(ss, v, trace, 0, [0]),
        )
        app_modules.module_control(ss, captured.modules)
        inspector.inspector(ss, trace, 0)
        header(trace)
    else:
        cur, pass_filter, mode = navigator(trace)
        bar, opts = view_bar(max(len(trace.before(cur)), len(trace.after(cur))))
        presentation.apply(ss)
        graphs(trace, cur, pass_filter, mode, opts, bar)
        inspector.inspector(ss, trace, cur)  # under the graphs: a click on a node opens it there
        why_panel.why_panel(ss, trace, cur)
        step_details(trace, cur)
        header(trace)
        debug.step_tools(ss, trace, cur)
        st.plotly_chart(viz.node_count_figure(trace, current=cur), width="stretch")
    timing_panel(trace, ss)
    compare_view.compare_panel(ss)
    downloads(trace)


PAGES = ("Step viewer", "Pattern Lab", "Teach", "Sweep")


def page() -> None:
    """The page chosen at the top of the sidebar: the step viewer (default), the Pattern Lab,
    Teach, or Sweep (the default when the app was started on a sweep directory)."""
    choice = st.sidebar.segmented_control(
        "Page",
        PAGES,
        default="Sweep" if os.environ.get("OPTIMUS_LENS_SWEEP") else PAGES[0],
        key="page_choice",
        label_visibility="collapsed",
    )
    if choice == "Pattern Lab":
        from optimus_lens.app import lab

        with st.sidebar:
            st.title("Optimus Lens")
            st.caption("Pattern Lab: write a pattern, preview its matches, apply it as a pass.")
        lab.page()
    elif choice == "Teach":
        from optimus_lens.app import teach

        with st.sidebar:
            st.title("Optimus Lens")
            st.caption("Teach: a guided walk through one pattern on its teaching model.")
        teach.page()
    elif choice == "Sweep":
        from optimus_lens.app import sweep_view

        sweep_view.page()
    else:
        main()


page()
