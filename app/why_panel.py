"""The "Why not?" panel: for a node of the graph before the step on screen (or of the
final graph), every pattern's answer from :mod:`optimus_lens.debug.why` — the engine's own search
run dry (:func:`optimus_lens.debug.why.trace_dry_run`): "applies here" with the group it joins, or
the first condition that failed. A near miss's best partial match can be drawn: its
nodes are outlined in the step view (:func:`partial`)."""

from __future__ import annotations

from collections.abc import MutableMapping

import pandas as pd
import streamlit as st

from optimus_lens.app import state as S
from optimus_lens.core.trace import Trace

PANEL, AT, NODE, DRAW = "why_panel", "why_at", "why_node", "why_draw"
RUNS = "_why_runs"  # (trace id, step) -> (DryRun, how) | WhyError text; a few kept
KEEP = 4


def asked_step(trace: Trace, cur: int, at: str) -> int:
    """The DryRun step for the radio choice ``at``: ``cur`` (the graph before the step on
    screen) or ``len(steps) + 1`` (the final graph)."""
    return len(trace.steps) + 1 if at == "final" else max(cur, 1)


def dry_run(state: MutableMapping, trace: Trace, step: int):
    """(DryRun, how) for the graph before ``step`` of ``trace``, memoised per trace and
    step for the session (a dry run captures the model and runs the pipeline: seconds).
    Raises WhyError, ModelSpecError, CaptureError (memoised too, so a failure is not retried
    on every rerun)."""
    from optimus_lens.debug.why import trace_dry_run

    runs = state.setdefault(RUNS, {})
    key = (id(trace), step)
    if key not in runs:
        if len(runs) >= KEEP:
            runs.pop(next(iter(runs)))
        try:
            runs[key] = trace_dry_run(trace, step, state.get("spec"))
        except Exception as e:  # noqa: BLE001 - kept and re-raised: shown by the panel
            runs[key] = e
    got = runs[key]
    if isinstance(got, Exception):
        raise got
    return got


def pattern_answer(state: MutableMapping, trace: Trace, step: int, name: str, pattern: dict):
    """(WhyReport, how) for node ``name`` of the graph before ``step`` of a trace that ran the
    user ``pattern`` carried from the Pattern Lab: the dry run with the trace's own passes, the
    user's among them, in a child ``optimus why`` process
    (:func:`optimus_lens.app.lab_runner.why`: the user's code never runs in the app's process),
    memoised per trace, step and node; for an ATen graph's trace (``trace.graph`` forward or
    backward) ``optimus why GRAPH:NODE --stage post-grad`` with the run's mode, ``step`` counting
    that graph's steps. Raises WhyError with the child's message."""
    from optimus_lens.app import lab_runner
    from optimus_lens.app.toggles import trace_passes
    from optimus_lens.debug.why import WhyError

    runs = state.setdefault(RUNS, {})
    key = (id(trace), step, name, "pattern")
    if key not in runs:
        if len(runs) >= KEEP:
            runs.pop(next(iter(runs)))
        root = state.get("trace") if state.get("trace") is not None else trace
        cap = root.capture or {}
        aten = trace.graph != "pre-grad"
        r = lab_runner.why(
            state["spec"],
            pattern["source"],
            pattern["name"],
            f"{trace.graph}:{name}" if aten else name,
            stage="post-grad" if aten else "pre-grad",
            mode=trace.capture.get("mode") or cap.get("mode", "inference"),
            step=step,
            passes=trace_passes(trace),
            capture=cap.get("method", "dynamo"),
            graph_index=cap.get("graph_index"),
            time_limit_s=state.get("lab_time_limit", lab_runner.TIME_LIMIT_S),
        )
        runs[key] = (
            (
                r.extra["why"],
                f"a dry run of the trace's passes, your pattern {pattern['name']} included, on {state['spec']}",
            )
            if r.ok
            else WhyError(f"{r.error[0]}: {r.error[1]}")
        )
    got = runs[key]
    if isinstance(got, Exception):
        raise got
    return got


def answer(state: MutableMapping, trace: Trace, step: int, name: str):
    """(WhyReport, how): every pattern's answer for ``name`` before ``step`` — with the carried
    Pattern Lab pattern when the trace ran it (:func:`pattern_answer`), else from
    :func:`dry_run`."""
    pattern = S.includes_pattern(state, trace)
    if pattern is not None and state.get("spec"):
        return pattern_answer(state, trace, step, name, pattern)
    dry, how = dry_run(state, trace, step)
    return dry.explain(name), how


def verdict_rows(report) -> pd.DataFrame:
    """One row per pattern: pattern, pass, applies ("yes"/"no"), answer."""
    return pd.DataFrame(
        {
            "pattern": [v.pattern for v in report.verdicts],
            "pass": [v.pass_name for v in report.verdicts],
            "applies": ["yes" if v.applies else "no" for v in report.verdicts],
            "answer": [v.text for v in report.verdicts],
        }
    )


def partial(state: MutableMapping, trace: Trace, cur: int) -> list[str]:
    """The nodes to outline in the step view: the drawn near miss of this trace, or none."""
    got = state.get(DRAW)
    if not got or got[0] != id(trace):
        return []
    return list(got[1])


def _draw(state: MutableMapping, trace: Trace, names: list[str] | None) -> None:
    state[DRAW] = (id(trace), names) if names else None


def why_panel(state: MutableMapping, trace: Trace, cur: int) -> None:
    """The panel for step ``cur``: which graph, which node (default: the inspector's
    selection), and every pattern's answer."""
    with st.expander("Why not? Every pattern's answer for a node", key=PANEL, on_change="rerun") as box:
        if not box.open:
            return
        c = st.columns([2, 2], vertical_alignment="bottom")
        n = len(trace.steps)
        at = c[0].radio(
            "Graph",
            ("before", "final"),
            key=AT,
            persist_state=S.KEEP,
            horizontal=True,
            format_func=lambda x: f"before step {cur}" if x == "before" else f"final (after step {n})",
        )
        step = asked_step(trace, cur, at)
        graph = trace.graph_at(step - 1)
        selected = state.get("inspect_node")
        typed = (
            c[1]
            .text_input(
                "Node",
                key=NODE,
                persist_state=S.KEEP,
                placeholder=selected or "an FX node name",
                help="Empty: the node selected in the view or the inspector.",
            )
            .strip()
        )
        name = typed or selected
        if not name:
            st.caption("Click a node in the view above, or type a node name.")
            return
        if name not in graph.nodes:
            st.warning(
                f"`{name}` is not in the graph {'before step ' + str(step) if step <= n else 'after the last step'}"
                f"; pick another graph or node."
            )
            return
        with st.spinner("Running the pipeline dry (capture, then the same search the engine runs) …"):
            try:
                report, how = answer(state, trace, step, name)
            except Exception as e:  # noqa: BLE001 - bad input or a model that no longer loads: said, nothing lost
                title, msg = S.error_message(e)
                st.error(f"**Why-not is not available here — {title}**: {msg}")
                return
        st.caption(f"`{report.node}` = {report.op} — answers from {how}.")
        applies = [v for v in report.verdicts if v.applies]
        for v in applies:
            st.success(f"**{v.pattern}** applies here: {v.text}")
        if not applies:
            st.info("No pattern applies at this node; the first failed condition of each is below.")
        # a static table wraps each answer in full (a data grid cuts long answers off)
        st.table(verdict_rows(report), hide_index=True, height="content" if len(report.verdicts) <= 10 else 460)
        near = [v for v in report.verdicts if not v.applies and v.partial]
        if near:
            cols = st.columns([3, 1, 1], vertical_alignment="bottom")
            pick = cols[0].selectbox(
                "Near misses: draw the best partial match of", [v.pattern for v in near], key="why_near"
            )
            v = next(v for v in near if v.pattern == pick)
            cols[1].button(
                "Draw in the view",
                key="why_draw_btn",
                on_click=_draw,
                args=(state, trace, list(dict.fromkeys([name, *v.partial]))),
            )
            cols[2].button("Clear", key="why_clear_btn", on_click=_draw, args=(state, trace, None))
            st.caption(
                f"{pick}: {v.text} — partial match: {', '.join(v.partial[:12])}"
                + (" …" if len(v.partial) > 12 else "")
                + " (dashed purple outline in the view)."
            )
