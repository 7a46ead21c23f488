"""Optimus Lens views: pure functions from a Trace (and bench results) to Graphviz DOT /
SVG, plotly figures, pan/zoom viewer pages and a standalone HTML report. No Streamlit,
no pattern catalogue here; the app and the CLI both call these.

How a view is drawn is one :class:`ViewOptions`. The files, one job each: ``options``
(ViewOptions), ``marks`` (what is highlighted), ``labels`` (what a node says), ``select``
(what is drawn: cuts and folding, with ``fold``), ``dot`` (DOT emission), ``views`` (graph,
step, pass and snapshot views), ``picture`` (a step's before/after/diff on one layout),
``layout`` (bounded layout), ``render`` (SVG), ``viewer`` (the pan/zoom page), ``figures``
(plotly), ``text`` (step facts), ``report`` (the HTML report) and ``lesson`` (a walkthrough
drawn).
"""

from optimus_lens.viz.figures import (
    bench_rows,
    compile_time_figure,
    memory_figure,
    method_text,
    node_count_figure,
    speedup_figure,
)
from optimus_lens.viz.fold import module_path
from optimus_lens.viz.labels import node_label
from optimus_lens.viz.layout import LAYOUT_BUDGET_S, RenderError, draw_pinned
from optimus_lens.viz.marks import Marks, step_marks
from optimus_lens.viz.options import FOLD_ABOVE, HOPS, MAX_NODES, MODULES_ABOVE, ViewOptions
from optimus_lens.viz.picture import STABLE_MAX, StepPicture, step_picture, trace_layout
from optimus_lens.viz.render import Rendered, render_svg, render_view, responsive_svg
from optimus_lens.viz.report import html_report, write_report
from optimus_lens.viz.text import step_facts, trace_summary, verify_text
from optimus_lens.viz.viewer import panes_html, svg_viewer_html
from optimus_lens.viz.views import GraphView, graph_view, pass_view, snapshot_view, step_view

__all__ = [
    "FOLD_ABOVE",
    "HOPS",
    "LAYOUT_BUDGET_S",
    "MAX_NODES",
    "MODULES_ABOVE",
    "STABLE_MAX",
    "GraphView",
    "Marks",
    "RenderError",
    "Rendered",
    "StepPicture",
    "ViewOptions",
    "bench_rows",
    "compile_time_figure",
    "draw_pinned",
    "graph_view",
    "html_report",
    "memory_figure",
    "method_text",
    "module_path",
    "node_count_figure",
    "node_label",
    "panes_html",
    "pass_view",
    "render_svg",
    "render_view",
    "responsive_svg",
    "snapshot_view",
    "speedup_figure",
    "step_facts",
    "step_marks",
    "step_picture",
    "step_view",
    "svg_viewer_html",
    "trace_layout",
    "trace_summary",
    "verify_text",
    "write_report",
]
