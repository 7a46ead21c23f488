"""Graph views: a graph with its marks as a DOT graph ready to render (:class:`GraphView`).

:func:`graph_view` draws any snapshot; :func:`step_view` one side of a step,
:func:`pass_view` a whole pass (each step's group in its own colour) and
:func:`snapshot_view` the graph after k steps with nothing marked. What is drawn is
:func:`optimus_lens.viz.select.drawn_graph`'s choice under the view's :class:`optimus_lens.viz.options.ViewOptions`;
a step's before, after and diff on one layout is :func:`optimus_lens.viz.picture.step_picture`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import graphviz

from optimus_lens.core.trace import GraphSnapshot, Trace
from optimus_lens.viz.dot import emit
from optimus_lens.viz.marks import LegendEntry, Marks, step_marks
from optimus_lens.viz.options import DEFAULT, ViewOptions
from optimus_lens.viz.palette import STANDARD, Palette
from optimus_lens.viz.select import Drawn, drawn_graph, users_index


@dataclass
class GraphView:
    """A DOT graph ready to render, and what it leaves out.

    ``total`` nodes in the graph, ``shown`` drawn, ``elided`` cut away by the
    neighbourhood limit, ``folded`` parameter placeholders folded into their users.
    ``hops`` is the neighbourhood radius actually used (None: the whole graph is shown;
    it can be below the requested radius when a wider one would pass ``max_nodes``).
    ``focus`` lists the drawn sites and created nodes (else the other marked nodes), in
    graph order: what a viewer zooms to. ``legend`` and ``notes`` repeat the in-graph
    legend as data, for a viewer that keeps it on screen while zoomed. ``shown`` counts
    drawn nodes; a folded "×k" node counts once (``parallel`` counts the nodes it stands for).
    """

    dot: graphviz.Digraph
    title: str
    total: int
    shown: int
    elided: int
    folded: int
    hops: int | None
    focus: list[str] = field(default_factory=list)
    legend: list[LegendEntry] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: the drawn nodes and edges (to re-emit the view with pinned positions)
    drawn: Drawn | None = None
    #: True when every node carries a position (draw with ``neato -n2``)
    pinned: bool = False
    #: nodes drawn as an "×k" representative, and the k's (nodes represented in all)
    parallel: int = 0
    #: seconds spent folding parallel copies, and building the rest of the DOT
    fold_s: float = 0.0
    build_s: float = 0.0
    marks: Marks | None = None
    #: paths of the modules drawn folded (``mod:<path>`` nodes; :func:`optimus_lens.viz.fold.module_path`)
    modules: list[str] = field(default_factory=list)
    palette: Palette = STANDARD

    @property
    def source(self) -> str:
        return self.dot.source


def view_of(
    g: graphviz.Digraph,
    title: str,
    d: Drawn,
    marks: Marks,
    legend: list[LegendEntry],
    notes: list[str],
    seconds: float,
    pinned: bool = False,
    palette: Palette = STANDARD,
) -> GraphView:
    """The :class:`GraphView` of DOT graph ``g`` (:func:`optimus_lens.viz.dot.emit` of ``d`` with
    ``marks``, which gave ``legend`` and ``notes``), built in ``seconds``; its focus is the
    drawn sites and created nodes, else the other marked nodes."""
    primary = set(marks.groups) | marks.created  # sites and new nodes first; erased/rewired when none
    marked = marks.names()
    focus = [n for n in d.order if n in primary] or [n for n in d.order if n in marked]
    return GraphView(
        g,
        title,
        d.total,
        len(d.order),
        d.elided,
        d.folded_params,
        d.hops,
        focus,
        legend,
        notes,
        drawn=d,
        pinned=pinned,
        parallel=sum(len(v) for v in d.members.values()),
        fold_s=d.fold_s,
        build_s=max(0.0, seconds - d.fold_s),
        marks=marks,
        modules=list(d.modules),
        palette=palette,
    )


def graph_view(
    snap: GraphSnapshot,
    marks: Marks | None = None,
    title: str = "",
    opts: ViewOptions = DEFAULT,
    *,
    users: dict | None = None,
    n_params: int | None = None,
) -> GraphView:
    """Build the DOT view of ``snap`` with ``marks`` highlighted, drawn with ``opts``.

    What is drawn is :func:`optimus_lens.viz.select.drawn_graph` (parameter folding, parallel-copy
    folding, module folding except the modules in ``opts.unfolded``, the ``hops``-hop cut
    with a note "… N nodes not shown"). ``opts.clusters`` draws a dashed box per module
    when the drawn nodes come from more than one module; ``opts.legend_in_graph`` False
    leaves the legend node out of the drawing (for a viewer that shows
    ``GraphView.legend`` itself; the returned legend and notes are the same either way).
    ``users``/``n_params``: a big graph's users index and parameter count
    (:func:`optimus_lens.viz.select.users_index`), so the view costs what its region costs.
    """
    marks = marks or Marks()
    t0 = time.perf_counter()
    d = drawn_graph(snap, marks, opts, users=users, n_params=n_params)
    g, legend, notes = emit(d, marks, opts, title)
    return view_of(g, title, d, marks, legend, notes, time.perf_counter() - t0, palette=opts.palette)


def step_view(trace: Trace, index: int, side: str, opts: ViewOptions = DEFAULT) -> GraphView:
    """The graph before or after step ``index`` (1-based) with the step's marks, drawn
    with ``opts``. Raises IndexError for a step the trace does not have, ValueError for a
    ``side`` other than "before" and "after"."""
    step = trace.step(index)
    k = index - 1 if side == "before" else index
    snap = trace.graph_at(k) if side in ("before", "after") else trace.before(index)
    title = f"{side} step {index}: {step.pattern} ({step.pass_name}) — {len(snap)} nodes"
    users, n_params = users_index(trace, k, snap)
    return graph_view(snap, step_marks(step, side), title, opts, users=users, n_params=n_params)


def pass_view(trace: Trace, pass_name: str, side: str, opts: ViewOptions = DEFAULT) -> GraphView:
    """Overview of a whole pass: the graph before its first step or after its last,
    each step's group in its own colour (sites in the before view; the nodes each step
    created, where they survive, in the after view), drawn with ``opts``. Raises KeyError
    when the pass made no step, ValueError for a ``side`` other than "before" and "after"."""
    steps = trace.steps_of_pass(pass_name)
    if not steps:
        raise KeyError(f"pass {pass_name!r} made no step in this trace")
    if side not in ("before", "after"):
        raise ValueError(f"side must be 'before' or 'after', not {side!r}")
    first, last = steps[0].index, steps[-1].index
    snap = trace.before(first) if side == "before" else trace.after(last)
    m = Marks(group_labels=[f"step {s.index} ({s.pattern})" for s in steps])
    for i, s in enumerate(steps):
        for n in s.sites:
            if n in snap.nodes:
                m.groups.setdefault(n, i)
        if side == "before":
            m.erased |= {n for n in s.erased if n in snap.nodes}
        else:
            for n in s.created:
                if n in snap.nodes:
                    m.created.add(n)
                    m.groups[n] = i
    title = f"{side} pass {pass_name} (steps {first}–{last}, {len(steps)} groups) — {len(snap)} nodes"
    return graph_view(snap, m, title, opts)


def snapshot_view(trace: Trace, k: int = 0, opts: ViewOptions = DEFAULT) -> GraphView:
    """The graph after ``k`` steps (0: as captured), nothing marked, drawn with ``opts``."""
    snap = trace.graph_at(k)
    what = "captured graph" if k == 0 else f"graph after step {k}"
    return graph_view(snap, None, f"{what} — {len(snap)} nodes", opts)
