"""How a view is drawn: :class:`ViewOptions`, the one set of options every view function
takes (:func:`optimus_lens.viz.views.graph_view`, ``step_view``, ``pass_view``,
``snapshot_view``, :func:`optimus_lens.viz.picture.step_picture`, ``trace_layout``, the
report), and the thresholds of its "auto" settings.

The app builds one from its view controls, the report and the lesson from their own
defaults; :data:`DEFAULT` is what a view is drawn with when nothing is said.
"""

from __future__ import annotations

from dataclasses import dataclass

from optimus_lens.viz.layout import LAYOUT_BUDGET_S
from optimus_lens.viz.palette import STANDARD, Palette

#: default number of drawable nodes above which a view is cut to the marked nodes' neighbourhood
MAX_NODES = 300
#: default neighbourhood radius (hops along edges, both directions) of a cut view
HOPS = 2
#: parallel-copy folding is on by default when a view has more drawable nodes than this
#: (recsys_towers' views, 40-70 nodes, stay unfolded; a 64-tower model's 500 fold)
FOLD_ABOVE = 120
#: module folding is on by default when a view has more drawable nodes than this (see
#: docs/ARCHITECTURE.md, "The step viewer", for how it was measured)
MODULES_ABOVE = 100


@dataclass(frozen=True)
class ViewOptions:
    """What a view draws and how (hashable: a view's cache key).

    * ``hops``, ``max_nodes``: a view with more than ``max_nodes`` drawable nodes shows the
      marked nodes and their ``hops``-hop neighbourhood (edges followed both ways);
      ``full`` draws every node instead.
    * ``fold_params``: lifted parameter placeholders fold into their users ("+N params").
    * ``fold``: k parallel copies fold into one "×k" node; None: above :data:`FOLD_ABOVE`
      drawable nodes.
    * ``modules``: modules without a marked node fold into one node each; None: above
      :data:`MODULES_ABOVE` drawable nodes. ``unfolded``: module paths kept open anyway.
    * ``clusters``: a dashed box per module (when the drawing holds more than one).
    * ``legend_in_graph``: draw the legend as a node of the graph (False: the viewer shows
      ``GraphView.legend`` itself). Pinned pictures never draw it.
    * ``palette``: the marks' colours (:mod:`optimus_lens.viz.palette`).
    * ``budget_s``: seconds ``dot`` may spend on a layout before the layered fallback.
    * ``stable_layout``: a caller drawing several steps of a small trace draws them on one
      layout (:func:`optimus_lens.viz.picture.trace_layout`), so nothing the steps did not touch moves.
    * ``text_scale``: the viewer's text size and opening zoom (1.0; 1.7 suits a projector).
    """

    hops: int = HOPS
    max_nodes: int = MAX_NODES
    full: bool = False
    fold_params: bool = True
    fold: bool | None = None
    modules: bool | None = None
    unfolded: frozenset[str] = frozenset()
    clusters: bool = True
    legend_in_graph: bool = True
    palette: Palette = STANDARD
    budget_s: float = LAYOUT_BUDGET_S
    stable_layout: bool = True
    text_scale: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "unfolded", frozenset(self.unfolded))  # any iterable of paths; kept hashable


#: the options of a view drawn with none given (every field at its default)
DEFAULT = ViewOptions()
