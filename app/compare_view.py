"""Compare view: our passes and PyTorch Inductor's on the same captured model, side by
side (:func:`optimus_lens.debug.compare.compare_model`)."""

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
            col.dataframe(
                pd.DataFrame(
                    [
                        {
                            "step": s.index,
                            "pass": s.pass_name,
                            "pattern": s.pattern,
                            "verify": failure_text(s, inherited),
                            "sites": ", ".join(s.sites[:6]) + (" ..." if len(s.sites) > 6 else ""),
                        }
                        for s in steps
                    ]
                ),
                hide_index=True,
                width="stretch",
            )


def failure_text(step, inherited: dict[int, int]) -> str:
    """A step's verify column: "ok", "—" (not checked), "defect" (fails of its own) or
    "fails: inherits step N" (only because step N broke the graph)."""
    v = step.verify
    if not step.failed:
        return "—" if v is None or v.ok is None else "ok"
    origin = inherited.get(step.index)
    return f"fails: inherits step {origin}" if origin is not None else "defect"
