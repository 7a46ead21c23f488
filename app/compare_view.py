"""Compare view: our passes and PyTorch Inductor's on the same captured model, side by
side (:func:`optimus_lens.debug.compare.compare_model`), or the trace on screen against
another trace file (:func:`optimus_lens.debug.compare.compare_runs`); both with the two final
graphs side by side on one layout (:func:`optimus_lens.viz.runs.runs_picture`)."""

from __future__ import annotations

from collections.abc import MutableMapping

import pandas as pd
import streamlit as st


def compare_panel(state: MutableMapping) -> None:
    """A button that runs both pipelines on the model on screen, then node counts, the
    fused groups of each pass side by side, the steps only one run made, and failing
    steps (upstream's flagged as upstream defects)."""
    st.markdown("#### Compare with PyTorch Inductor")
    spec = state.get("spec")
    if spec is None:
        st.caption("Comparing needs the model: this trace came from a file whose model is not a sample here.")
        return
    if st.button(
        "Compare ours with PyTorch Inductor's passes",
        key="compare_btn",
        help="Captures the model once, runs our default pipeline and upstream's equivalent "
        "pre_grad_fusion_options, every step of both verified (optimus compare).",
    ):
        from optimus_lens.debug.compare import compare_model

        with st.spinner("Running both pipelines …"):
            try:
                state["comparison"] = (spec, compare_model(spec))
            except Exception as e:  # noqa: BLE001
                from optimus_lens.app import state as S

                title, msg = S.error_message(e)
                st.error(f"**Compare failed — {title}**: {msg}")
                return
    found = state.get("comparison")
    if found is None or found[0] != spec:
        return
    show_comparison(found[1])
    from optimus_lens.debug.compare import compare_runs

    final_graphs(compare_runs(found[1].ours, found[1].upstream, "ours", "upstream"), key="cmp_upstream")


def trace_compare(state: MutableMapping) -> None:
    """The trace on screen (A) against a trace file (B): the one-line summary, steps per
    pass side by side, the steps only one run made, and both final graphs on one layout.
    The file's trace is kept under ``compare_with`` (its name and Trace)."""
    trace = state.get("trace")
    if trace is None:
        return
    st.markdown("#### Compare with another run")
    up = st.file_uploader(
        "Another trace of this model (another torch version, configuration or log)",
        type=["json"],
        key="compare_upload",
        help="optimus compare A.json B.json: nodes paired by structure, name and provenance, steps by the "
        "captured nodes they came from.",
    )
    if up is not None and (state.get("compare_with") or ("",))[0] != up.file_id:
        from optimus_lens.app import state as S
        from optimus_lens.core.trace import TraceFormatError

        try:
            state["compare_with"] = (up.file_id, up.name, S.load_trace_bytes(up.getvalue()))
        except TraceFormatError as e:
            st.error(f"**Could not open {up.name}**: {e}")
            return
    other = state.get("compare_with")
    if up is None or other is None:
        return
    from optimus_lens.debug.compare import compare_runs

    r = compare_runs(trace, other[2], trace.model or "on screen", other[1])
    (st.success if r.identical else st.warning)(r.summary())
    st.dataframe(
        pd.DataFrame([{"pass": p, "A": na, "B": nb, "same groups": same} for p, (na, nb, same) in r.groups.items()]),
        hide_index=True,
        width="stretch",
    )
    left, right = st.columns(2)
    for col, title, steps in ((left, "Steps only in A", r.only_a), (right, "Steps only in B", r.only_b)):
        col.markdown(f"**{title}** ({len(steps)})")
        if steps:
            col.dataframe(pd.DataFrame(_step_rows(steps)), hide_index=True, width="stretch")
    final_graphs(r, key="cmp_trace")


def final_graphs(r, key: str, height: int = 560) -> None:
    """Both runs' final graphs side by side on one layout, panned and zoomed together:
    nodes only in one run and nodes computed from other inputs marked."""
    from optimus_lens import viz
    from optimus_lens.viz.runs import runs_picture

    st.markdown(f"**Final graphs**: {r.a_label} | {r.b_label}")
    try:
        pic = runs_picture(r.a.graph_at(len(r.a.steps)), r.b.graph_at(len(r.b.steps)), r.final, r.a_label, r.b_label)
        panes = [
            (f"A: {r.a_label}", viz.draw_pinned(pic.before.source)),
            (f"B: {r.b_label}", viz.draw_pinned(pic.after.source)),
        ]
    except Exception as e:  # noqa: BLE001 - a drawing failure is shown in place, never as a traceback
        st.error(f"The final graphs could not be drawn: {type(e).__name__}: {e}")
        return
    focus = list(dict.fromkeys(pic.before.focus + pic.after.focus))
    st.iframe(viz.panes_html(panes, focus, pic.diff.legend, pic.diff.notes), height=height)
    c = r.final.counts()
    st.caption(
        f"{c['structure']} nodes the same in both, {c['name'] + c['provenance']} the same node from other inputs, "
        f"{c['only_a']} only in A, {c['only_b']} only in B; one layout for both."
    )


def _step_rows(steps, inherited: dict[int, int] | None = None) -> list[dict]:
    """One row per step; with ``inherited`` (step -> the defect it inherits) a verify column
    (:func:`failure_text`)."""
    return [
        {
            "step": s.index,
            "pass": s.pass_name,
            "pattern": s.pattern,
            **({"verify": failure_text(s, inherited)} if inherited is not None else {}),
            "sites": ", ".join(s.sites[:6]) + (" ..." if len(s.sites) > 6 else ""),
        }
        for s in steps
    ]


def show_comparison(c) -> None:
    """Draw one :class:`optimus_lens.debug.compare.Comparison`."""
    from optimus_lens.debug.compare import group_rows, inherited_text

    before, ours, up = c.nodes
    m = st.columns(3)
    m[0].metric("Nodes captured", before)
    m[1].metric("After ours", ours, delta=ours - before, delta_color="inverse")
    m[2].metric("After PyTorch Inductor", up, delta=up - before, delta_color="inverse")
    # one story per failure: a defect, and the later steps that only inherit it (Trace.failure_runs)
    for side, head, steps in (
        ("upstream", "Upstream defect", c.upstream_defects),
        ("ours", "Our defect", c.ours_failed),
    ):
        for s in steps:
            msg = s.verify.message.splitlines()[0] if s.verify and s.verify.message else ""
            later = c.inherited_of(side, s)
            st.error(
                f"**{head}** — {'upstream ' if side == 'upstream' else ''}step {s.index} ({s.pass_name} / "
                f"{s.pattern}) fails verification: {msg}"
                + (f"\n\n{inherited_text(later, s.index, sentence=True)}" if later else "")
            )
    st.dataframe(pd.DataFrame(group_rows(c)), hide_index=True, width="stretch")
    left, right = st.columns(2)
    sides = (
        (left, "Only in ours", c.only_ours, c.ours_inherited),
        (right, "Only in PyTorch Inductor", c.only_upstream, c.upstream_inherited),
    )
    for col, title, steps, inherited in sides:
        col.markdown(f"**{title}** ({len(steps)} step{'' if len(steps) == 1 else 's'})")
        if steps:
            col.dataframe(pd.DataFrame(_step_rows(steps, inherited)), hide_index=True, width="stretch")


def failure_text(step, inherited: dict[int, int]) -> str:
    """A step's verify column: "ok", "—" (not checked), "defect" (fails of its own) or
    "fails: inherits step N" (only because step N broke the graph)."""
    v = step.verify
    if not step.failed:
        return "—" if v is None or v.ok is None else "ok"
    origin = inherited.get(step.index)
    return f"fails: inherits step {origin}" if origin is not None else "defect"
