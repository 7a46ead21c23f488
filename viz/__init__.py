"""Optimus Lens views: pure functions from a Trace (and bench results) to Graphviz DOT /
SVG, plotly figures and a standalone HTML report. No Streamlit here; the app and the
CLI both call these."""

from optimus_lens.viz import layout  # noqa: F401
from optimus_lens.viz.graph import (
    FOLD_ABOVE,
    GROUP_COLOURS,
    HOPS,
    MAX_NODES,
    MODULES_ABOVE,
    GraphView,
    Marks,
    Rendered,
    RenderError,
    StepPicture,
    graph_view,
    module_path,
    node_label,
    pass_view,
    render_svg,
    render_view,
    responsive_svg,
    snapshot_view,
    step_marks,
    step_picture,
    step_view,
    trace_layout,
)

__all__ = [
    "FOLD_ABOVE",
    "GROUP_COLOURS",
    "HOPS",
    "MAX_NODES",
    "MODULES_ABOVE",
    "GraphView",
    "Marks",
    "RenderError",
    "Rendered",
    "StepPicture",
    "graph_view",
    "module_path",
    "node_label",
    "pass_view",
    "render_svg",
    "render_view",
    "responsive_svg",
    "snapshot_view",
    "step_marks",
    "step_picture",
    "step_view",
    "trace_layout",
]
from optimus_lens.viz.figures import (  # noqa: E402
    bench_rows,
    compile_time_figure,
    memory_figure,
    method_text,
    node_count_figure,
    speedup_figure,
)
from optimus_lens.viz.report import html_report, write_report  # noqa: E402
from optimus_lens.viz.text import step_facts, trace_summary, verify_text  # noqa: E402

__all__ += [
    "bench_rows",
    "compile_time_figure",
    "memory_figure",
    "method_text",
    "node_count_figure",
    "speedup_figure",
    "html_report",
    "write_report",
    "step_facts",
    "trace_summary",
    "verify_text",
]
from optimus_lens.viz.viewer import panes_html, svg_viewer_html  # noqa: E402

__all__ += ["panes_html", "svg_viewer_html"]
