"""The Pattern Lab's results: a preview (each graph's matches and near misses, the near miss
drawn with its best partial match and, for Inductor patterns, the pattern's own graph beside
the model's) and an applied run (its steps, per graph on the post-grad stage). Drawn with
:mod:`optimus_lens.viz.matchview`, the same code as ``optimus match --draw``."""

from __future__ import annotations

import streamlit as st

from optimus_lens import viz
from optimus_lens.app.graphview import show_view
from optimus_lens.viz import matchview

#: what each graph of a result is, in the header
KIND = {"pre-grad": "Dynamo graph", "forward": "forward graph (ATen)", "backward": "backward graph (ATen)"}
#: the viewers' height (CSS px), and the model graph's drawing area in it at 1280x800 (CSS px, below
#: the legend bar and above the hint; measured in chromium): beside the pattern's graph, or the
#: page wide; the drawing is chosen so that the marked nodes open legible there (viz.matchview.fit_view)
HEIGHT = 520
MODEL_PANE, WIDE_PANE = (470.0, 430.0), (800.0, 430.0)


def pick_graph(names: list[str], counts: dict[str, str]) -> str:
    """The graph shown (a radio when the result holds more than one)."""
    if len(names) == 1:
        return names[0]
    return st.radio(
        "Graph",
        names,
        key="lab_graph_pick",
        horizontal=True,
        format_func=lambda g: f"{g} ({counts[g]})",
        help="each ATen graph of the post-grad stage is matched on its own",
    )


def drawn_miss(nm) -> matchview.Miss:
    """A preview's NearMiss as the view draws it."""
    return matchview.Miss(
        nm.pattern, nm.node, nm.reason, nm.partial, nm.stopped, nm.pattern_partial, nm.pattern_stopped
    )


def preview_panel(r, canvas=None) -> None:
    """One graph's matches (with the KeywordArgs they bound), its near misses (the one picked,
    else, where nothing matches, the one that got furthest, drawn with its best partial
    match and where matching stopped) and the pattern's own graph beside the model's; the
    graphs go in ``canvas`` (a container; None: where the text goes)."""
    previews = r.previews or {"pre-grad": r.preview}
    names = list(previews)
    g = pick_graph(names, {n: f"{len(p.matches)} match(es)" for n, p in previews.items()})
    pv = previews[g]
    snap = r.trace.graph_named(g).initial_graph if g in r.trace.graph_names() else r.trace.initial_graph
    where = f" in the {KIND.get(g, g)}" if g != "pre-grad" or len(names) > 1 else ""
    st.markdown(
        f"**{len(pv.matches)} match(es)**, {len(pv.near_misses)} near miss(es){where} — in {r.seconds:.1f} s; "
        "the graph is unchanged."
    )
    retrace = [m for m in pv.near_misses if m.reason.startswith("re-tracing ")]
    if retrace:
        st.error(
            f"**The search function could not be re-traced** at {len(retrace)} match(es) "
            f"({', '.join(m.node for m in retrace[:6])}): {retrace[0].reason}"
        )
    if any(m.bindings for m in pv.matches):
        rows = [
            {
                "pattern": m.pattern,
                "anchor": m.anchor,
                "matched nodes": ", ".join(m.sites),
                "bound": ", ".join(f"{k}={v}" for k, v in m.bindings.items()),
            }
            for m in pv.matches
        ]
        st.dataframe(rows, hide_index=True)
    near = {f"{m.node} ({m.pattern})": m for m in pv.near_misses}
    pick = st.selectbox(
        "Why not here?",
        ["—"] + list(near),
        key="lab_why_node",
        help="nodes whose op the pattern starts from, where it does not match",
    )
    miss = near.get(pick)
    if miss is None and not pv.matches:
        miss = pv.best_near_miss()
        if miss is not None:
            st.caption("Drawn: the near miss that got furthest (most nodes matched before it stopped).")
    if miss is not None:
        st.warning(f"**{miss.pattern}** does not match at `{miss.node}`: {miss.reason}")
    shown = miss.pattern if miss is not None else (pv.matches[0].pattern if pv.matches else None)
    info = next((i for i in r.patterns if i.name == shown and i.graph is not None), None)
    info = info or next((i for i in r.patterns if i.graph is not None), None)
    if canvas is not None:  # at 1280x800 the graphs start below the fold: say where they are
        drawn = "its best partial match" if miss is not None else "the matches" if pv.matches else "no mark"
        beside = ", beside the pattern's own graph" if info is not None else ""
        st.caption(f"↓ Drawn under the editor: the {KIND.get(g, g)} with {drawn}{beside}.")
    opts = viz.ViewOptions(legend_in_graph=False)
    pane = WIDE_PANE if info is None else MODEL_PANE
    if miss is not None:
        model = matchview.model_view(snap, drawn_miss(miss), opts=opts, pane=pane)
    else:
        found = [(f"{m.pattern} at {m.anchor}", m.sites) for m in pv.matches]
        model = matchview.model_view(snap, matches=found, opts=opts, pane=pane)
    with canvas or st.container():
        if info is None:
            show_view(model, height=HEIGHT)
            return
        left, right = st.columns([3, 2])
        with left:
            st.markdown(f"**The {KIND.get(g, g)}** of the model")
            show_view(model, height=HEIGHT)
        with right:
            own = drawn_miss(miss) if miss is not None and miss.pattern == info.name else None
            st.markdown(f"**The pattern `{info.name}`** ({info.form}): what it matches")
            show_view(matchview.pattern_view(info.graph, own), height=HEIGHT)
            with st.expander(f"{info.name} as Inductor prints it ({info.source})"):
                st.code(info.text, language="python")


def step_rows(trace) -> list[dict]:
    """One row per step of every graph of the run (the graph named on the post-grad stage)."""
    many = len(trace.graphs) > 0
    return [
        {
            **({"graph": s.graph} if many else {}),
            "step": s.index,
            "pattern": s.pattern,
            "sites": ", ".join(s.sites[:6]),
            "created": ", ".join(s.created[:4]),
            "verify": "—" if s.verify is None else ("ok" if s.verify.ok else "FAILED"),
            **({"error": s.error.get("message", "")[:120]} if s.error else {}),
        }
        for s in trace.all_steps()
    ]


def apply_header(trace, seconds: float) -> str:
    """The applied run in one line: steps and node counts (per ATen graph on the post-grad stage)."""
    steps = trace.all_steps()
    if not trace.graphs:
        return f"**{len(steps)} step(s)**, {trace.nodes_before} → {trace.nodes_after} nodes, in {seconds:.1f} s."
    per = "; ".join(
        f"{t.graph}: {len(t.steps)} step(s), {t.nodes_before} → {t.nodes_after} nodes"
        for t in trace.traces()
        if t.graph != "pre-grad" or t.steps
    )
    return f"**{len(steps)} step(s)** ({per}), in {seconds:.1f} s."
