"""Does a step's picture show the step? The one decision of *what* to draw so that every
site and every created node of a step lies inside its pane with a legible label
(:func:`fit_step`), taken in Python from the layout's geometry and shared by the HTML
report, the app's step viewer and the lesson.

The geometry: a :class:`optimus_lens.viz.layout.Layout` gives each drawn node's box in points;
a :class:`PaneSizes` gives the viewer's panes in CSS px; the viewer (:mod:`optimus_lens.viz.viewer`)
opens on the step's nodes — their bounding box with :data:`PAD_PT` points around it — at the
largest zoom that shows the whole box (at most 1.5 × the text scale). Node labels are
:data:`LABEL_PT`-point text, so a picture *fits* its pane when that zoom is at least
:data:`LEGIBLE` px per point: every label at least :data:`MIN_LABEL_PX` px.

What is tried, in order, until a picture fits (each keeps the one-geometry property: the
before, after and diff views are drawn on one layout, so an untouched node sits at the
same place in every pane):

1. the picture as asked (on the trace-wide layout when the caller has one);
2. the step's own layout of its neighbourhood (:attr:`ViewOptions.local`): the nodes within
   2, then 1 hop of the marked nodes;
3. the same with parallel copies folded into one "×k" node (:mod:`optimus_lens.viz.fold`: the k
   members of a batch step, the k getitems of its unbind), 2, 1 then 0 hops; only when the
   caller left folding to "auto".

Each picture is tried side by side, then with the panes stacked (each pane the full width)
when the caller allows both, before the next picture: the step's own nodes are folded
only where they would not fit otherwise. Above a text scale of 1 (presentation mode) a
first round asks for labels at :data:`COMFORTABLE` × the text scale (17 px in presentation
mode), the next for :data:`LEGIBLE`. When nothing fits,
the picture whose zoom is largest is kept and :attr:`Fit.fits` is False: the viewer then
lists the step's nodes that are off-screen, each a button that pans to it.

Measured on every step of the sample models (``benchmarks/step_fit.py``, results in
``benchmarks/RESULTS.md``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from optimus_lens.core.trace import Trace
from optimus_lens.viz.layout import PT, Layout
from optimus_lens.viz.options import DEFAULT, ViewOptions
from optimus_lens.viz.picture import Selection, StepPicture, draw_selection, lay_out, select_step

#: the node labels' font size in every drawing (points; :mod:`optimus_lens.viz.dot`)
LABEL_PT = 10.0
#: the smallest label a step's picture opens with (CSS px)
MIN_LABEL_PX = 9.0
#: the smallest zoom (px per point) at which a picture fits: labels at MIN_LABEL_PX
LEGIBLE = MIN_LABEL_PX / LABEL_PT
#: the zoom (px per point, times the text scale) a picture is first asked to fit at: 10 pt
#: labels at 10 px × the text scale (the viewer's opening zoom before pictures were fitted)
COMFORTABLE = 1.0
#: points of room the viewer keeps around the step's nodes (the viewer's script uses the same)
PAD_PT = 12.0

ARRANGEMENTS = ("pair", "stacked", "single")


@dataclass(frozen=True)
class PaneSizes:
    """The drawing area of one pane of a viewer on screen, in CSS px (below its title strip,
    inside its border), for each arrangement: ``pair`` (before | after side by side),
    ``stacked`` (before above after, each the full width) and ``single`` (one pane: the diff)."""

    pair: tuple[float, float]
    stacked: tuple[float, float]
    single: tuple[float, float]

    def pane(self, arrangement: str) -> tuple[float, float]:
        """(width, height) in px of a pane in ``arrangement``; ValueError for another name."""
        if arrangement not in ARRANGEMENTS:
            raise ValueError(f"arrangement must be one of {ARRANGEMENTS}, not {arrangement!r}")
        return getattr(self, arrangement)


@dataclass
class Fit:
    """How a step's picture was chosen to fit its pane.

    ``arrangement``: "pair", "stacked" or "single"; ``scale``: the zoom (px per point) at
    which the step's nodes fill that pane (labels ``LABEL_PT × scale`` px); ``fits``: at
    least :data:`LEGIBLE`; ``how``: what was drawn ("as asked", "2-hop neighbourhood",
    "1-hop neighbourhood, parallel copies folded", …); ``tried``: (how, arrangement, scale)
    of every picture measured, in order; ``focus``: the node ids the viewer opens on."""

    arrangement: str
    scale: float
    fits: bool
    how: str
    focus: list[str] = field(default_factory=list)
    tried: list[tuple[str, str, float]] = field(default_factory=list)

    @property
    def stacked(self) -> bool:
        return self.arrangement == "stacked"

    def note(self, diff: bool = False) -> str:
        """What the view says about the choice ("" when the picture was drawn as asked);
        ``diff``: for the diff view of the same picture (one pane, never stacked)."""
        parts = []
        if self.how != "as asked":
            parts.append(f"drawn to fit the step: {self.how}")
        if self.stacked and not diff:
            parts.append("panes stacked (the step is wider than a side-by-side pane)")
        if not self.fits:
            parts.append(
                "the step is larger than its pane at a legible size: the nodes off-screen are listed under the panes, each a link to it"
            )
        return "; ".join(parts)


def focus_box(layout: Layout, names) -> tuple[float, float, float, float] | None:
    """(x0, y0, x1, y1) in points of the boxes of ``names`` in ``layout`` (names it does not
    place are skipped); None when it places none of them."""
    x0 = y0 = float("inf")
    x1 = y1 = float("-inf")
    for n in names:
        pos = layout.nodes.get(n)
        if pos is None:
            continue
        x, y, w, h = pos
        x0, x1 = min(x0, x - w * PT / 2), max(x1, x + w * PT / 2)
        y0, y1 = min(y0, y - h * PT / 2), max(y1, y + h * PT / 2)
    return None if x0 == float("inf") else (x0, y0, x1, y1)


def fit_scale(layout: Layout, names, pane: tuple[float, float]) -> float:
    """The zoom (px per point) at which the boxes of ``names`` (the whole drawing when none is
    placed), with :data:`PAD_PT` around them, fill a ``pane`` of (width, height) px: what the
    viewer opens at, before its 1.5 × text-scale cap."""
    box = focus_box(layout, names) or layout.bb
    w, h = box[2] - box[0] + 2 * PAD_PT, box[3] - box[1] + 2 * PAD_PT
    return min(pane[0] / max(w, 1.0), pane[1] / max(h, 1.0))


def _candidates(opts: ViewOptions):
    """(how, options) of the pictures to try after the one asked for, most context first."""
    if opts.full:  # the user asked for the whole graph: nothing is cut or folded for them
        return
    for hops in dict.fromkeys((min(opts.hops, 2), min(opts.hops, 1))):
        yield f"{hops}-hop neighbourhood", replace(opts, local=True, hops=hops)
    if opts.fold is None:
        for hops in dict.fromkeys((min(opts.hops, 2), min(opts.hops, 1), 0)):
            yield f"{hops}-hop neighbourhood, parallel copies folded", replace(opts, local=True, hops=hops, fold=True)


def fit_step(
    trace: Trace,
    index: int,
    sizes: PaneSizes,
    opts: ViewOptions = DEFAULT,
    layout: Layout | None = None,
    arrangements: tuple[str, ...] = ("pair", "stacked"),
) -> tuple[StepPicture, Fit]:
    """Step ``index``'s picture (:func:`optimus_lens.viz.picture.step_picture`) chosen to fit
    ``sizes``' panes, and how (:class:`Fit`): see the module docstring for what is tried.

    ``opts``: the picture asked for (its ``text_scale`` sets the first round's labels);
    ``layout``: a trace-wide layout to draw on when the picture asked for fits on it;
    ``arrangements``: the pane arrangements allowed, in order of preference (``("pair",
    "stacked")`` for a side-by-side viewer that may stack; ``("stacked",)`` or
    ``("single",)`` when the user chose one). Raises IndexError for a step the trace does not
    have, ValueError for an unknown arrangement, RenderError when Graphviz is missing or fails."""
    for a in arrangements:
        sizes.pane(a)
    tiers = dict.fromkeys((max(LEGIBLE, COMFORTABLE * opts.text_scale) if opts.text_scale > 1 else LEGIBLE, LEGIBLE))
    tried: list[tuple[str, str, float]] = []
    measured: list[tuple[str, Selection, Layout, dict[str, float]]] = []
    todo = iter(_candidates(opts))

    def pictures():
        """The pictures measured so far, then the next candidates, each measured once."""
        yield from list(measured)
        for how, o in todo:
            sel = select_step(trace, index, o)
            if any(sel.same_drawing(m[1]) for m in measured):
                continue
            lay = lay_out(sel)
            measured.append((how, sel, lay, {a: fit_scale(lay, sel.focus, sizes.pane(a)) for a in arrangements}))
            tried.extend((how, a, x) for a, x in measured[-1][3].items())
            yield measured[-1]

    def chosen(how: str, sel: Selection, lay: Layout, arrangement: str, scale: float, fits: bool):
        pic = draw_selection(sel, lay)
        if lay is layout:
            pic.timings["layout_s"] = 0.0
        return pic, Fit(arrangement, scale, fits, how, list(sel.focus), tried)

    first = select_step(trace, index, opts)
    lay = lay_out(first, layout)
    measured.append(("as asked", first, lay, {a: fit_scale(lay, first.focus, sizes.pane(a)) for a in arrangements}))
    tried.extend(("as asked", a, x) for a, x in measured[0][3].items())
    for need in tiers:
        for how, sel, lay, scales in pictures():
            for a in arrangements:
                if scales[a] >= need:
                    return chosen(how, sel, lay, a, scales[a], True)
    how, sel, lay, scales = max(measured, key=lambda m: max(m[3].values()))
    a = max(arrangements, key=lambda x: scales[x])
    return chosen(how, sel, lay, a, scales[a], False)
