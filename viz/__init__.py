"""Optimus Lens views: pure functions from a Trace (and bench results) to Graphviz DOT /
SVG, plotly figures and a standalone HTML report. No Streamlit here; the app and the
CLI both call these."""
from viz import layout  # noqa: F401
from viz.graph import (FOLD_ABOVE, GROUP_COLOURS, HOPS, MAX_NODES, MODULES_ABOVE, GraphView, Marks, RenderError, Rendered,
                       StepPicture, graph_view, module_path, node_label, pass_view, render_svg, render_view, responsive_svg, snapshot_view,
                       step_marks, step_picture, step_view, trace_layout)

__all__ = ["FOLD_ABOVE", "GROUP_COLOURS", "HOPS", "MAX_NODES", "MODULES_ABOVE", "GraphView", "Marks", "RenderError", "Rendered",
           "StepPicture", "graph_view", "module_path", "node_label", "pass_view", "render_svg", "render_view", "responsive_svg",
           "snapshot_view", "step_marks", "step_picture", "step_view", "trace_layout"]
from viz.figures import (bench_rows, compile_time_figure, memory_figure, method_text, node_count_figure,  # noqa: E402
                         speedup_figure)
from viz.report import html_report, write_report  # noqa: E402
from viz.text import step_facts, trace_summary, verify_text  # noqa: E402

__all__ += ["bench_rows", "compile_time_figure", "memory_figure", "method_text", "node_count_figure", "speedup_figure", "html_report",
            "write_report", "step_facts", "trace_summary", "verify_text"]
from viz.viewer import panes_html, svg_viewer_html  # noqa: E402

__all__ += ["panes_html", "svg_viewer_html"]
