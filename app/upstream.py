"""The "PyTorch Inductor passes" source: record upstream's pre-grad passes on the model
(:func:`optimus_lens.inductor.observe.observe`, each step verified) and show the trace like one of ours."""

from __future__ import annotations

from collections.abc import MutableMapping

import streamlit as st

from optimus_lens.app import state as S


def run_upstream(
    state: MutableMapping, spec: str, passes: list[str], capture_method: str = "dynamo", graph_index: int | None = None
) -> bool:
    """Observe upstream's passes ``passes`` (``pre_grad_fusion_options`` names, each
    with upstream's default options) on ``spec``; on success show the trace and return
    True, on failure record the error in ``state`` and keep the old trace."""
    from optimus_lens.inductor.observe import observe

    options = {name: {} for name in passes}
    with st.status(f"Running PyTorch Inductor's pre-grad passes on {spec} …", expanded=False) as status:
        try:
            res = observe(spec, options=options, verify=True, capture_method=capture_method, graph_index=graph_index)
        except Exception as e:  # noqa: BLE001 - every failure is shown, the old trace stays
            state["error"] = S.error_message(e)
            status.update(label=f"Failed: {state['error'][0]}", state="error")
            return False
        t = res.trace
        replay_note(t)
        failed = t.failed_steps()
        status.update(
            label=f"Done: {len(t.steps)} upstream steps, {t.nodes_before} → {t.nodes_after} nodes"
            + (f"; {len(failed)} fail verification" if failed else ""),
            state="complete",
        )
    S.set_trace(state, t, spec, f"PyTorch Inductor pre-grad passes on {spec} (torch {t.capture.get('torch')})")
    return True


def replay_note(trace) -> None:
    """For upstream's passes on a graph read from a compile log: whether the replay
    reproduces the log's ``after_pre_grad_graph`` node for node
    (:func:`optimus_lens.inductor.log_replay.check_replay`), kept in ``trace.capture["log_replay"]``."""
    from optimus_lens.frontend.compile_log import LogError
    from optimus_lens.inductor.log_replay import check_replay

    try:
        check = check_replay(trace)
    except LogError as e:
        trace.capture["log_replay"] = {"reproduced": None, "text": f"the log cannot be read again: {e}"}
        return
    if check is not None:
        trace.capture["log_replay"] = {"reproduced": check.reproduced, "text": check.text()}


def defects(trace) -> None:
    """For an observed upstream trace, name every step that fails verification of its own as an
    upstream defect, and the later steps that only inherit its failure
    (:meth:`optimus_lens.core.trace.Trace.failure_runs`, the one source); say whether a replay
    on a logged graph reproduces the log."""
    from optimus_lens.debug.compare import inherited_text

    if not trace.capture.get("upstream"):
        return
    replay = trace.capture.get("log_replay")
    if replay:
        (st.success if replay["reproduced"] else st.warning)(replay["text"])
    for s, inherited in trace.failure_runs():
        msg = s.verify.message.splitlines()[0] if s.verify and s.verify.message else ""
        later = f"\n\n{inherited_text([x.index for x in inherited], s.index, sentence=True)}" if inherited else ""
        st.error(
            f"**Upstream defect** — step {s.index} ({s.pass_name} / {s.pattern}) changes what the graph "
            f"computes: {msg}{later}"
        )
