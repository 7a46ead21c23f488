"""Step tools: the code diff of the step on screen and a repro script to download."""

from __future__ import annotations

from collections.abc import MutableMapping

import streamlit as st

from optimus_lens.core.trace import BACKWARD, PRE_GRAD, Trace


def diff_of(state: MutableMapping, trace: Trace, cur: int) -> str:
    """The step's code diff as plain unified-diff text (sites marked by trailing
    comments), memoised per trace and step for the session. Raises RebuildError."""
    from optimus_lens.debug.codediff import code_diff, diff_text

    key = (id(trace), cur)
    memo = state.setdefault("_code_diffs", {})
    if key not in memo:
        s = trace.step(cur)
        memo.clear()  # one trace's steps at a time
        memo[key] = diff_text(code_diff(trace, cur), f"step {cur} ({s.pass_name} / {s.pattern})", gutter=False)
    return memo[key]


def step_tools(state: MutableMapping, trace: Trace, cur: int) -> None:
    """A code-diff expander and a repro download button for step ``cur``."""
    from optimus_lens.debug.rebuild import RebuildError
    from optimus_lens.debug.repro import ReproError, repro_script, step_spec

    # lazy: the diff is computed only while the expander is open (1-2 s at 21k nodes)
    panel = st.expander(
        "Code diff of this step (GraphModule code before → after)", key="code_diff_panel", on_change="rerun"
    )
    if panel.open:
        with panel:
            try:
                st.code(diff_of(state, trace, cur), language="diff", line_numbers=False)
            except RebuildError as e:
                st.warning(f"The graph cannot be rebuilt as code: {e}")
    try:
        step_spec(trace, cur)
        why_not = None
    except ReproError as e:
        why_not = str(e)
    name = (trace.model or "model").replace(":", "_").replace("/", "_").replace(".", "_")
    st.download_button(
        f"Download repro of step {cur}",
        data=lambda: repro_script(trace, cur),
        file_name=f"repro_{name}_step{cur}.py",
        mime="text/x-python",
        key="dl_repro",
        disabled=why_not is not None,
        help=why_not
        or "A standalone script: rebuilds this step's before-graph from the trace, "
        "applies the step's pattern, compares with the unrewritten graph. Run it "
        "with `python repro.py` where optimus-lens is installed.",
    )


def _jump(state: MutableMapping, index: int) -> None:
    state["cur_step"] = index
    state["pass_filter"] = "all passes"
    state["view_mode"] = "Step"


def failure_tools(state: MutableMapping, trace: Trace) -> None:
    """A jump to the first failing step when steps were verified, else (for a trace of
    a model that can be captured again) a button that bisects the steps for it
    (:func:`optimus_lens.debug.bisect.bisect_spec`) and shows the result with a jump; for an
    ATen graph's steps, the ``optimus bisect`` command that bisects them."""
    failed = trace.failed_steps()
    if failed:
        s = failed[0]
        st.button(
            f"Jump to the first failing step: {s.index} ({s.pattern})",
            key="jump_failing",
            on_click=_jump,
            args=(state, s.index),
            type="primary",
        )
        return
    checked = any(s.verify is not None and s.verify.ok is not None for s in trace.steps)
    if checked or not trace.steps or state.get("spec") is None or trace.capture.get("upstream"):
        return
    if trace.graph != PRE_GRAD:  # bisect_spec captures the model again: the pre-grad graph
        st.caption(
            f"Bisect of the {trace.graph} graph's steps: `optimus bisect {state['spec']} --stage all "
            f"--mode {'training' if trace.graph == BACKWARD else trace.capture.get('mode', 'inference')}`."
        )
        return
    found = state.get("bisect")
    if found is not None and found[0] is trace:
        b = found[1]
        if b.first_bad is None:
            st.success(f"Bisect: {b.message} (checked {len(b.probes)} replayed graph(s)).")
        else:
            s = trace.step(b.first_bad)
            st.error(
                f"Bisect: the first failing step is {s.index} ({s.pass_name} / {s.pattern}); checked "
                f"{len(b.probes)} replayed graphs of {b.steps} steps."
            )
            st.button(f"Jump to step {s.index}", key="jump_bisect", on_click=_jump, args=(state, s.index))
        return
    if st.button(
        "Find the first failing step (bisect)",
        key="bisect_btn",
        help="Replays the graph after chosen steps and compares it with the original, checking "
        "O(log steps) graphs (optimus bisect).",
    ):
        from optimus_lens.debug.bisect import bisect_spec

        cap = trace.capture or {}
        with st.spinner("Bisecting the steps …"):
            try:
                b = bisect_spec(trace, state["spec"], cap.get("method", "dynamo"), cap.get("graph_index"))
            except Exception as e:  # noqa: BLE001 - shown, nothing lost
                from optimus_lens.app import state as S

                title, msg = S.error_message(e)
                st.error(f"**Bisect failed — {title}**: {msg}")
                return
        state["bisect"] = (trace, b)
        st.rerun()
