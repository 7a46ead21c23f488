"""Node inspector: find a node of the step on screen by name, op or target and read what
the trace knows about it (:func:`optimus_lens.debug.inspect_node.node_info`). Inputs and users are
buttons that select that node; the selection stays across steps while the node exists."""

from __future__ import annotations

from collections.abc import MutableMapping

import streamlit as st

from optimus_lens.app.state import KEEP
from optimus_lens.core.trace import Trace, arg_text

PICK, QUERY, SIDE, PANEL = "inspect_pick", "inspect_query", "inspect_side", "inspector_panel"
MAX_CHOICES = 500


def select(state: MutableMapping, name: str) -> None:
    """Select node ``name`` (a callback of the input / user buttons and of a click in a view)."""
    state["inspect_node"] = name
    state[PICK] = name
    state[QUERY] = ""


def choices(snap, query: str, current: str | None) -> list[str]:
    """Node names offered: those matching ``query``, or with no query every node (the
    current selection included when it is in this graph), at most ``MAX_CHOICES``."""
    from optimus_lens.debug.inspect_node import find_nodes

    if query:
        return find_nodes(snap, query, MAX_CHOICES)
    names = list(snap.nodes)[:MAX_CHOICES]
    if current in snap.nodes and current not in names:
        names.insert(0, current)
    return names


def inspector(state: MutableMapping, trace: Trace, cur: int) -> None:
    """The inspector panel for step ``cur`` (its before or after graph)."""
    from optimus_lens.debug.inspect_node import node_info

    with st.expander("Inspect a node", key=PANEL, on_change="rerun"):  # tracked: a click in a view opens it
        c = st.columns([1, 2, 3], vertical_alignment="bottom")
        if cur >= 1:
            side = c[0].radio("Graph", ("before", "after"), key=SIDE, persist_state=KEEP, horizontal=True)
        else:  # a trace without steps: the captured graph only
            side = "captured"
        k = cur - 1 if side == "before" else cur
        snap = trace.graph_at(k)
        query = c[1].text_input(
            "Find by name, op or target", key=QUERY, persist_state=KEEP, placeholder="layer_norm, getitem, …"
        )
        current = state.get("inspect_node")
        names = choices(snap, query.strip(), current)
        if not names:
            st.caption(f"No node of {_graph_name(side, cur)} matches {query!r}.")
            return
        if state.get(PICK) not in names:  # a search picks its first hit; otherwise only a choice selects
            state[PICK] = current if current in names else (names[0] if query.strip() else None)
        name = c[2].selectbox("Node", names, key=PICK, index=None, placeholder="click a node in a view, or pick one")
        if name is None:
            st.caption(
                _absent(trace, current, side, cur)
                if current
                else "Click a node in a view above (or find one here) to read its shape, strides, module, "
                "source line and where it came from."
            )
            return
        state["inspect_node"] = name
        info = node_info(trace, name, k)
        _show(state, info, side, cur)


def _absent(trace: Trace, name: str, side: str, cur: int) -> str:
    """Why the selected node is not in the graph on screen: the steps it lives between."""
    from optimus_lens.debug.inspect_node import lifetime

    first, last = lifetime(trace, name)
    if first is None:
        return f"`{name}` is not a node of this trace."
    span = "the captured graph" if first == 0 else f"step {first}"
    return (
        f"`{name}` is not in {_graph_name(side, cur)}: it exists from {span} to "
        + ("the end" if last == len(trace.steps) else f"the graph before step {last + 1}")
        + "."
    )


def _graph_name(side: str, cur: int) -> str:
    return "the captured graph" if side == "captured" else f"graph {side} step {cur}"


def _show(state: MutableMapping, info, side: str, cur: int) -> None:
    r = info.record
    args = ", ".join([arg_text(a) for a in r.args] + [f"{k}={arg_text(v)}" for k, v in r.kwargs.items()])
    st.markdown(f"**`{r.name}`** = `{r.op}` `{r.target}`({args}) — {_graph_name(side, cur)}")
    left, right = st.columns([3, 2])
    rows = [
        ("shape", r.shape),
        ("stride", r.stride),
        ("dtype", r.dtype),
        ("device", r.device),
        ("module", f"{r.module} ({r.module_type})" if r.module else None),
        ("source", r.source),
    ]
    left.markdown("\n".join(["| | |", "|---|---|"] + [f"| **{k}** | `{v}` |" for k, v in rows if v is not None]))
    with right:
        st.markdown("**Inputs**" if info.inputs else "**Inputs**: none")
        for n, shape in info.inputs:
            st.button(f"{n}  {shape}", key=f"inspect_in:{n}", on_click=select, args=(state, n))
        st.markdown("**Users**" if info.users else "**Users**: none")
        for n in info.users:
            st.button(n, key=f"inspect_user:{n}", on_click=select, args=(state, n))
    if info.failure:
        st.error(
            f"`{r.name}` raises when the graph after step {info.step} runs (random inputs of the recorded "
            f"metas): {info.failure}"
        )
    for c in info.changes:
        (a, sa, ta), (b, sb, tb) = c.before, c.after
        real = f"; run, it has stride `{c.actual}`" if c.actual is not None and c.actual != tb else ""
        line = (
            f"Step {info.step} changed input {c.position}: `{a}` {sa} stride `{ta}` → `{b}` {sb} stride "
            f"`{tb}` (recorded{real})"
        )
        if c.layout:
            st.warning(f"{line}. **`{r.name}` reads its input's strides** — {c.layout} — and they changed.")
        else:
            st.caption(line)
    if info.code:
        line = int(r.source.split(":", 2)[1])
        st.code("\n".join(f"{'>' if no == line else ' '}{no:5d}  {text}" for no, text in info.code), language="python")
        st.caption(info.source_file)
    st.markdown("**Provenance**")
    lines = [] if any(e.kind == "created" for e in info.events) else ["in the captured graph"]
    lines += [e.text() for e in info.events]
    if info.alive_at_end:
        lines.append("alive in the final graph")
    elif info.becomes:
        lines.append(f"its value ends in {', '.join(info.becomes)}")
    st.markdown("\n".join(f"- {t}" for t in lines))
