"""The "Compile log" model source: a ``TORCH_TRACE`` / ``TORCH_COMPILE_DEBUG`` path and a
picker of the graphs it holds (:func:`optimus_lens.frontend.compile_log.read_log`); the
model spec is ``log:PATH#SELECTOR``, run like any other.

One widget group; its state is the widgets' own keys (``log_path``, ``log_graph``), kept
across page switches like every other sidebar setting."""

from __future__ import annotations

import streamlit as st

from optimus_lens.app import state as S

PATH_KEY, GRAPH_KEY = "log_path", "log_graph"


def _label(e) -> str:
    return f"{e.compile_id} {e.artifact} · {e.nodes} nodes"


def log_source() -> str | None:
    """Draw the path field and the graph picker; the spec of the graph picked, or None
    (no path yet, or a path that holds no log: the reason is shown under the field)."""
    from optimus_lens.frontend.compile_log import DEFAULT_ARTIFACT, LogError, read_log

    path = st.text_input(
        "Log path",
        key=PATH_KEY,
        persist_state=S.KEEP,
        placeholder="path/to/TORCH_TRACE dir or file",
    ).strip()
    if not path:
        st.caption(
            "A TORCH_TRACE directory or file (`TORCH_TRACE=dir python train.py`), or a TORCH_COMPILE_DEBUG "
            "directory. Its graphs open with example inputs made from the recorded metas: the model's code "
            "is not needed."
        )
        return None
    try:
        log = read_log(path)
    except LogError as e:
        st.caption(f":red[{e}]")
        return None
    entries = log.entries
    first = next((e.index for e in entries if e.artifact == DEFAULT_ARTIFACT), 0)
    ss = st.session_state
    if ss.get("log_read") != path or ss.get(GRAPH_KEY) not in range(len(entries)):  # a new log: its Dynamo graph
        ss[GRAPH_KEY], ss["log_read"] = first, path
    pick = st.selectbox(
        "Graph",
        [e.index for e in entries],
        key=GRAPH_KEY,
        persist_state=S.KEEP,
        format_func=lambda i: _label(entries[i]),
        help="Each frame Dynamo compiled (a graph break is one more) and each artifact logged for it: "
        "dynamo_output_graph is what our pre-grad passes and upstream's see.",
    )
    e = entries[pick]
    breaks = sum(len(b) for b in log.breaks.values())
    st.caption(
        f"{len(log.graphs())} Dynamo graph(s), {breaks} graph break(s), torch {log.torch_version or '?'}"
        + (f"; logged pre_grad_fusion_options: {opts}" if (opts := log.pre_grad_options(e.compile_id)) else "")
    )
    return f"log:{path}#{e.compile_id if e.artifact == DEFAULT_ARTIFACT else e.selector}"
