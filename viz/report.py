"""A standalone HTML report of a Trace: summary, node-count figure, and every step's
before/after graph (SVG, sites highlighted) with its facts. What ``optimus report``
writes and the app offers for download."""
from __future__ import annotations

import html
from pathlib import Path

from optimus.trace import Trace
from viz.figures import bench_rows, memory_figure, node_count_figure, speedup_figure
from viz.graph import HOPS, MAX_NODES, RenderError, render_svg, responsive_svg, snapshot_view, step_view
from viz.text import step_facts, trace_summary

_CSS = """
body{font-family:Helvetica,Arial,sans-serif;margin:24px;color:#222}
h1{font-size:22px} h2{font-size:17px;margin-top:32px;border-top:1px solid #ddd;padding-top:14px}
table.facts td{padding:2px 10px 2px 0;vertical-align:top;font-size:13px} table.facts td:first-child{color:#666;white-space:nowrap}
.pair{display:grid;grid-template-columns:1fr 1fr;gap:12px}
.graph{border:1px solid #ddd;max-height:900px;overflow:auto;padding:4px}
.err{color:#c62828} .failed{color:#c62828;font-weight:bold}
table.bench{border-collapse:collapse;font-size:13px} table.bench td,table.bench th{border:1px solid #ddd;padding:3px 8px}
"""


def _svg_or_error(view, timeout_s: float) -> str:
    try:
        return responsive_svg(render_svg(view, timeout_s))
    except RenderError as e:
        return f'<p class="err">{html.escape(str(e))}</p>'


def html_report(trace: Trace, catalogue: list[dict] | None = None, steps: list[int] | None = None,
                hops: int = HOPS, max_nodes: int = MAX_NODES, bench=None, include_plotlyjs: str | bool = True,
                timeout_s: float = 20.0) -> str:
    """The report as one HTML string.

    ``catalogue``: :func:`optimus.passes.pass_catalogue` entries for pattern descriptions
    (looked up when None). ``steps``: 1-based step indices to draw (default all).
    ``bench``: an optional :class:`optimus.bench.BenchResult` to add speedup/memory
    figures and a table. ``include_plotlyjs``: True (default: embeds plotly.js, ~4.6 MB,
    so the report works offline), "cdn" (small file, needs network for the figures) or
    False (no figures' script). A graph whose layout exceeds
    ``timeout_s`` seconds is replaced by the error text.
    """
    if catalogue is None:
        from optimus.passes import pass_catalogue

        catalogue = pass_catalogue()
    info = {c["name"]: c for c in catalogue}
    s = trace_summary(trace)
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>Optimus Lens — {html.escape(trace.model)}</title>"
           f"<style>{_CSS}</style></head><body>",
           f"<h1>Optimus Lens trace: {html.escape(trace.model or 'model')}</h1>",
           f"<p>{s['nodes_before']} → {s['nodes_after']} nodes in {s['steps']} steps; "
           f"{s['failed_steps']} failed verification; final check: {html.escape(s['final_verify'])}.</p>"]
    if s["graphs"] > 1:
        breaks = "; ".join(trace.capture.get("breaks", []))
        out.append(f"<p class='err'>The model has {s['graphs']} graphs (graph breaks: {html.escape(breaks)}); "
                   f"this trace is graph {trace.capture.get('graph_index', 0) + 1}.</p>")
    out.append(node_count_figure(trace).to_html(full_html=False, include_plotlyjs=include_plotlyjs))
    if bench is not None:
        out.append(speedup_figure(bench).to_html(full_html=False, include_plotlyjs=False))
        out.append(memory_figure(bench).to_html(full_html=False, include_plotlyjs=False))
        rows = bench_rows(bench)
        head = "".join(f"<th>{html.escape(k)}</th>" for k in rows[0])
        body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r.values()) + "</tr>" for r in rows)
        out.append(f"<table class='bench'><tr>{head}</tr>{body}</table>")
    if not trace.steps:
        out.append("<h2>No step applied</h2><div class='graph'>"
                   + _svg_or_error(snapshot_view(trace, 0, hops=hops, max_nodes=max_nodes), timeout_s) + "</div>")
    for i in steps or range(1, len(trace.steps) + 1):
        st = trace.step(i)
        failed = st.verify is not None and st.verify.ok is False
        out.append(f"<h2 id='step-{i}'>Step {i}: {html.escape(st.pattern)} "
                   f"<small>({html.escape(st.pass_name)})</small>{' <span class=failed>verify failed</span>' if failed else ''}</h2>")
        rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>"
                       for k, v in step_facts(st, info.get(st.pattern)))
        out.append(f"<table class='facts'>{rows}</table><div class='pair'>")
        for side in ("before", "after"):
            view = step_view(trace, i, side, hops=hops, max_nodes=max_nodes)
            out.append(f"<div class='graph'>{_svg_or_error(view, timeout_s)}</div>")
        out.append("</div>")
    out.append("</body></html>")
    return "\n".join(out)


def write_report(trace: Trace, path: str | Path, **kw) -> int:
    """Write :func:`html_report` to ``path``; returns the bytes written."""
    text = html_report(trace, **kw)
    Path(path).write_text(text, encoding="utf-8")
    return len(text.encode())
