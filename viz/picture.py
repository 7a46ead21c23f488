"""One geometry per step: a step's before, after and diff views on one layout
(:func:`step_picture`), and one layout for every step of a small trace (:func:`trace_layout`).

Layout is bounded (:mod:`optimus_lens.viz.layout`): ``dot`` with size-scaled limits and a time
budget, else a layered fallback that the view names. A step's before, after and diff
views share one layout of their union, so a node the step did not touch sits at the
same coordinates in all three; with a trace layout, at the same coordinates in every step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from optimus_lens.core.trace import GraphSnapshot, Step, Trace
from optimus_lens.viz.dot import emit
from optimus_lens.viz.labels import arg_changes, box_sizes
from optimus_lens.viz.layout import Layout, bounded_layout
from optimus_lens.viz.marks import Marks, step_marks
from optimus_lens.viz.options import DEFAULT, FOLD_ABOVE, MODULES_ABOVE, ViewOptions
from optimus_lens.viz.select import Drawn, drawable_count, drawn_graph, users_index
from optimus_lens.viz.views import GraphView, view_of

#: a trace whose graphs, all steps together, draw at most this many distinct nodes gets one
#: layout for all its steps (:func:`trace_layout`)
STABLE_MAX = 300


@dataclass
class StepPicture:
    """A step's before, after and diff views drawn on one layout.

    The layout is of the union of what the before and after views draw (the diff view's
    nodes), so every node both views draw sits at the same coordinates, and all three
    drawings have the same bounding box (one zoom fits all). ``layout.note`` says when the
    layout is a fallback; ``changes`` lists the constant arguments the step changed in
    place per node (:func:`optimus_lens.viz.labels.arg_changes`)."""

    index: int
    before: GraphView
    after: GraphView
    diff: GraphView
    layout: Layout
    changes: dict[str, list[tuple[str, str, str]]]
    #: seconds per phase: ``rebuild_s`` (the trace's before/after graphs), ``index_s`` (moving
    #: the users index along), ``fold_s``, ``dot_build_s`` (selection, labels, DOT of the
    #: union and the three views; ``dot_build_cpu_s``: the same in this process's CPU seconds,
    #: which a busy machine does not inflate), ``layout_s`` (0 when a trace-wide layout was reused)
    timings: dict[str, float] = field(default_factory=dict)

    def views(self) -> dict[str, GraphView]:
        return {"before": self.before, "after": self.after, "diff": self.diff}


class _Timer:
    """Wall-clock and CPU seconds (this process) of the blocks run under it."""

    def __init__(self):
        self.wall = self.cpu = 0.0

    def __enter__(self):
        self._w, self._c = time.perf_counter(), time.process_time()

    def __exit__(self, *exc):
        self.wall += time.perf_counter() - self._w
        self.cpu += time.process_time() - self._c


def _union(a: Drawn, b: Drawn) -> Drawn:
    order = list(dict.fromkeys(a.order + b.order))
    recs = {**a.recs, **b.recs}
    members = {n: max(a.members.get(n, []), b.members.get(n, []), key=len) for n in {*a.members, *b.members}}
    inputs = {n: list(dict.fromkeys(a.inputs.get(n, []) + b.inputs.get(n, []))) for n in order}
    mult = dict(a.edge_mult)
    for e, k in b.edge_mult.items():
        mult[e] = max(k, mult.get(e, 0))
    params = {n: max(a.params.get(n, 0), b.params.get(n, 0)) for n in order}
    return Drawn(
        order,
        recs,
        members,
        inputs,
        mult,
        params,
        max(a.total, b.total),
        min(a.elided, b.elided),
        max(a.folded_params, b.folded_params),
        a.hops,
        a.fold_s + b.fold_s,
        modules=list(dict.fromkeys(a.modules + b.modules)),
    )


def _rep_map(d: Drawn) -> dict[str, str]:
    return {m: r for r, ms in d.members.items() for m in ms}


def trace_layout(trace: Trace, opts: ViewOptions = DEFAULT) -> Layout | None:
    """One layout for every step of a small trace, so consecutive steps keep every node
    they share where it was (scrubbing the steps moves nothing the steps did not touch).

    It is the layout of the union of all the trace's graphs (captured graph and each
    step's after-graph, parameters folded as ``opts.fold_params`` says, module boxes as
    ``opts.clusters``; ``opts.budget_s`` seconds of ``dot``). None — each step then gets
    its own before/after layout — when any graph would be cut (more than
    ``opts.max_nodes`` drawable nodes), would fold parallel copies, or the union passes
    :data:`STABLE_MAX`."""
    select = ViewOptions(max_nodes=opts.max_nodes, fold_params=opts.fold_params, fold=False, modules=False)
    drawn, changes = [], {}
    for k in range(len(trace.steps) + 1):
        snap = trace.graph_at(k)
        d = drawn_graph(snap, None, select)
        if d.elided or len(d.order) > FOLD_ABOVE:
            return None
        drawn.append(d)
        if k:
            changes.update(_step_changes(trace.step(k), trace.graph_at(k - 1), snap, d))
    du = drawn[0]
    for d in drawn[1:]:
        du = _union(du, d)
        if len(du.order) > STABLE_MAX:
            return None
    g, _, _ = emit(du, Marks(), ViewOptions(clusters=opts.clusters, legend_in_graph=False), changes=changes)
    return bounded_layout(g.source, du.order, du.inputs, box_sizes(du, changes), opts.budget_s)


def _step_changes(step: Step, before: GraphSnapshot, after: GraphSnapshot, da: Drawn) -> dict[str, list]:
    """Constant arguments ``step`` changed, per drawn node of the after side: in a node it
    rewired, or between a replaced node and its replacement of the same op
    (normalize_split: ``split(x, 16)`` -> ``split_1(x, [16, 16, ...])``)."""
    changes = {}
    pairs = [(r.name, r.name) for r in (step.delta.upsert if step.delta else [])]
    pairs += list(step.replaced.items())
    for old, new in pairs:
        o, n = before.nodes.get(old), after.nodes.get(new)
        if o is not None and n is not None and new in da.recs and o.target == n.target:
            ch = arg_changes(o, n)
            if ch:
                changes[new] = ch
    return changes


def step_picture(trace: Trace, index: int, opts: ViewOptions = DEFAULT, layout: Layout | None = None) -> StepPicture:
    """Step ``index``'s before, after and diff views on one shared layout, drawn with ``opts``.

    Each side draws what :func:`optimus_lens.viz.select.drawn_graph` selects for it (same options;
    folding is on for both when either side has more than :data:`optimus_lens.viz.options.FOLD_ABOVE`
    drawable nodes). ``layout``: a :func:`trace_layout` to draw on (used when it places
    every node drawn here). ``opts.modules``: fold modules the step did not touch
    (:func:`optimus_lens.viz.fold.collapse_modules`; a module holding a node marked on either side
    stays open on both), except those in ``opts.unfolded``; None: when either side has
    more than :data:`optimus_lens.viz.options.MODULES_ABOVE` drawable nodes. Otherwise their union is
    laid out once with :func:`optimus_lens.viz.layout.bounded_layout` (``opts.budget_s`` seconds of
    ``dot``, else the layered fallback); the diff view draws the union: erased nodes
    ghosted, created nodes marked, a dashed arrow from each replaced node to its
    replacement (``Step.replaced``, provenance), and changed arguments struck through /
    new. ``opts.palette``: the marks' colours (:data:`optimus_lens.viz.palette.PRESENTATION` for
    presentation mode). No legend node is drawn (the views' ``legend`` says it). Raises
    IndexError for a step the trace does not have, RenderError when Graphviz is missing
    or fails."""
    step = trace.step(index)
    clock = time.perf_counter
    t = clock()
    before, after = trace.before(index), trace.after(index)
    rebuild_s = clock() - t
    mb, ma = step_marks(step, "before"), step_marks(step, "after")
    build, moving = _Timer(), _Timer()
    with moving:
        ib = users_index(trace, index - 1, before)  # the running index moves on to the after side below: use it first
    fold, modules = opts.fold, opts.modules
    if fold is None or modules is None:
        drawable = max(len(before), len(after)) - (len(before) - drawable_count(before, ib[1], opts.fold_params))
        fold = drawable > FOLD_ABOVE if fold is None else fold
        modules = drawable > MODULES_ABOVE if modules is None else modules
    select = replace(opts, fold=fold, modules=modules)
    pinned = replace(opts, legend_in_graph=False)
    touched = mb.names() | ma.names()
    with build:
        db = drawn_graph(before, mb, select, users=ib[0], n_params=ib[1], keep_open=touched)
    with moving:
        ia = users_index(trace, index, after)
    with build:
        da = drawn_graph(after, ma, select, users=ia[0], n_params=ia[1], keep_open=touched)
        changes = _step_changes(step, before, after, da)
        du = _union(db, da)
        md = Marks(
            groups=dict(mb.groups),
            group_labels=list(mb.group_labels),
            erased=set(mb.erased),
            created=set(ma.created),
            rewired=set(ma.rewired),
        )
        rb, ra = _rep_map(db), _rep_map(da)
        prov = list(
            dict.fromkeys(
                (rb.get(o, o), ra.get(n, n))
                for o, n in step.replaced.items()
                if rb.get(o, o) in du.recs and ra.get(n, n) in du.recs and rb.get(o, o) != ra.get(n, n)
            )
        )
    layout_s = 0.0
    if layout is None or any(n not in layout.nodes for n in du.order):
        with build:
            g, _, _ = emit(du, md, ViewOptions(clusters=opts.clusters, legend_in_graph=False), changes=changes)
            sizes = box_sizes(du, changes)
        layout = bounded_layout(g.source, du.order, du.inputs, sizes, opts.budget_s)
        layout_s = layout.seconds
    views = {}
    with build:
        for side, d, m, kw in (
            ("before", db, mb, {}),
            ("after", da, ma, {"changes": changes}),
            ("diff", du, md, {"changes": changes, "ghosts": True, "provenance": prov}),
        ):
            gs, legend, notes = emit(d, m, pinned, layout=layout, **kw)
            if layout.note:
                notes.append(layout.note)
            views[side] = view_of(
                gs,
                f"{side} step {index}: {step.pattern} ({step.pass_name})",
                d,
                m,
                legend,
                notes,
                0.0,
                pinned=True,
                palette=opts.palette,
            )
    fold_s, fold_cpu = db.fold_s + da.fold_s, db.fold_cpu_s + da.fold_cpu_s
    for v in views.values():
        v.build_s = max(0.0, build.wall - fold_s) / 3
    timings = {
        "rebuild_s": rebuild_s,
        "index_s": moving.wall,
        "fold_s": fold_s,
        "dot_build_s": max(0.0, build.wall - fold_s),
        "dot_build_cpu_s": max(0.0, build.cpu - fold_cpu),
        "layout_s": layout_s,
    }
    return StepPicture(index, views["before"], views["after"], views["diff"], layout, changes, timings)
