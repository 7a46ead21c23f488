"""Step tools: the code diff of the step on screen and a repro script to download."""
from __future__ import annotations

from typing import MutableMapping

import streamlit as st

from optimus.trace import Trace


def diff_of(state: MutableMapping, trace: Trace, cur: int) -> str:
    """The step's code diff as plain unified-diff text (sites marked by trailing
    comments), memoised per trace and step for the session. Raises RebuildError."""
    from optimus.codediff import code_diff, diff_text

    key = (id(trace), cur)
    memo = state.setdefault("_code_diffs", {})
    if key not in memo:
        s = trace.step(cur)
        memo.clear()  # one trace's steps at a time
        memo[key] = diff_text(code_diff(trace, cur), f"step {cur} ({s.pass_name} / {s.pattern})", gutter=False)
    return memo[key]


def step_tools(state: MutableMapping, trace: Trace, cur: int) -> None:
    """A code-diff expander and a repro download button for step ``cur``."""
    from optimus.rebuild import RebuildError
    from optimus.repro import ReproError, repro_script, step_spec

    with st.expander("Code diff of this step (GraphModule code before → after)", key="code_diff_panel"):
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
    st.download_button(f"Download repro of step {cur}", data=lambda: repro_script(trace, cur),
                       file_name=f"repro_{name}_step{cur}.py", mime="text/x-python", key="dl_repro",
                       disabled=why_not is not None,
                       help=why_not or "A standalone script: rebuilds this step's before-graph from the trace, "
                                       "applies the step's pattern, compares with the unrewritten graph. Run it "
                                       "with `python repro.py` where optimus-lens is installed.")
