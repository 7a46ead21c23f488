"""Plotly figures of a Trace and of per-pass timing (:class:`optimus.bench.BenchResult`).

Every function returns a ``plotly.graph_objects.Figure`` and touches no UI; the app
shows them with ``st.plotly_chart`` and the HTML report embeds them.
"""
from __future__ import annotations

import plotly.graph_objects as go

from optimus.trace import Trace
from viz.graph import GROUP_COLOURS

FAILED_COLOUR = "#c62828"


def node_count_figure(trace: Trace, current: int | None = None, height: int = 340) -> go.Figure:
    """Node count of the graph after each step (step 0 = as captured), one marker colour
    per pass, failed-verification steps as red crosses, and the ``current`` step (if
    given) as a dashed vertical line."""
    fig = go.Figure()
    xs = [0] + [s.index for s in trace.steps]
    ys = [trace.nodes_before] + [s.nodes_after for s in trace.steps]
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color="#9e9e9e", width=1.5, shape="hv"),
                             name="nodes", hoverinfo="skip", showlegend=False))
    fig.add_trace(go.Scatter(x=[0], y=[trace.nodes_before], mode="markers", name="captured",
                             marker=dict(color="#616161", size=8, symbol="square"),
                             hovertemplate="captured: %{y} nodes<extra></extra>"))
    passes = list(dict.fromkeys(s.pass_name for s in trace.steps))
    for i, p in enumerate(passes):
        steps = trace.steps_of_pass(p)
        fig.add_trace(go.Scatter(
            x=[s.index for s in steps], y=[s.nodes_after for s in steps], mode="markers", name=p,
            marker=dict(color=GROUP_COLOURS[i % len(GROUP_COLOURS)], size=9, line=dict(color="#333333", width=1)),
            customdata=[s.pattern for s in steps],
            hovertemplate="step %{x}: %{customdata}<br>%{y} nodes after<extra>" + p + "</extra>"))
    failed = trace.failed_steps()
    if failed:
        fig.add_trace(go.Scatter(
            x=[s.index for s in failed], y=[s.nodes_after for s in failed], mode="markers", name="verify failed",
            marker=dict(color=FAILED_COLOUR, size=13, symbol="x"),
            customdata=[f"max abs err {s.verify.max_abs_err}" for s in failed],
            hovertemplate="step %{x} failed verification<br>%{customdata}<extra></extra>"))
    if current is not None:
        fig.add_vline(x=current, line=dict(color="#1565c0", dash="dash", width=1.5))
    fig.update_layout(height=height, margin=dict(l=10, r=10, t=30, b=10), title=dict(text="Nodes after each step",
                      font=dict(size=14)), xaxis_title="step", yaxis_title="nodes",
                      legend=dict(orientation="h", yanchor="top", y=-0.28, x=0, xanchor="left"),
                      plot_bgcolor="white")
    fig.update_xaxes(dtick=1 if len(xs) <= 30 else None, gridcolor="#eeeeee")
    fig.update_yaxes(gridcolor="#eeeeee")
    return fig


def _peak_note(bench) -> str:
    if all(s.peak_source == "cuda" for s in bench.stages):
        return "measured (torch.cuda.max_memory_allocated)"
    return "estimate from tensor liveness (CPU)"


def method_text(bench) -> str:
    """One line naming how ``bench`` was measured: device, timer, and where its memory figures come from."""
    timer = "CUDA events" if bench.method == "cuda-events" else "wall clock"
    return f"{bench.device}, timed with {timer}; peak memory {_peak_note(bench)}"


def speedup_figure(bench, height: int = 320) -> go.Figure:
    """Bars of each stage's speedup over the baseline (baseline median / stage median),
    with error bars spanning baseline median / p90 .. baseline median / p10 of the
    stage; a dotted line at 1.0x. ``bench`` is an :class:`optimus.bench.BenchResult`."""
    stages = bench.stages
    base = stages[0].median_ms if stages else 0.0
    names = [s.stage for s in stages]
    sp = [s.speedup for s in stages]
    hi = [(base / s.p10_ms if s.p10_ms > 0 else s.speedup) - s.speedup for s in stages]
    lo = [s.speedup - (base / s.p90_ms if s.p90_ms > 0 else s.speedup) for s in stages]
    colours = ["#9e9e9e"] + [GROUP_COLOURS[i % len(GROUP_COLOURS)] for i in range(len(stages) - 1)]
    fig = go.Figure(go.Bar(
        x=names, y=sp, marker=dict(color=colours, line=dict(color="#333333", width=1)),
        error_y=dict(type="data", symmetric=False, array=hi, arrayminus=lo, color="#333333"),
        customdata=[[s.median_ms, s.p10_ms, s.p90_ms, s.nodes] for s in stages],
        hovertemplate="%{x}: %{y:.2f}x<br>median %{customdata[0]:.3f} ms (p10 %{customdata[1]:.3f}, "
                      "p90 %{customdata[2]:.3f})<br>%{customdata[3]} nodes<extra></extra>"))
    fig.add_hline(y=1.0, line=dict(color="#616161", dash="dot"))
    fig.update_layout(height=height, margin=dict(l=10, r=10, t=50, b=10), plot_bgcolor="white",
                      title=dict(text=f"Speedup vs baseline (cumulative, after each pass)<br>"
                                      f"<sup>{method_text(bench)}</sup>", font=dict(size=14)),
                      yaxis_title="speedup (×)")
    # a noisy sample's p10/p90 spread can be many times the bars: clip the axis to the bars, not the whiskers
    top = max([*sp, 1.0]) * 1.5 if stages else 2.0
    fig.update_yaxes(gridcolor="#eeeeee", range=[0, top])
    return fig


def memory_figure(bench, height: int = 320) -> go.Figure:
    """Bars of each stage's peak memory in MiB; the title says whether the figures are
    measured on CUDA or a liveness estimate (CPU)."""
    stages = bench.stages
    colours = ["#9e9e9e"] + [GROUP_COLOURS[i % len(GROUP_COLOURS)] for i in range(len(stages) - 1)]
    mib = [s.peak_bytes / 2**20 for s in stages]
    fig = go.Figure(go.Bar(
        x=[s.stage for s in stages], y=mib, marker=dict(color=colours, line=dict(color="#333333", width=1)),
        customdata=[[s.peak_bytes, s.peak_source] for s in stages],
        hovertemplate="%{x}: %{y:.3f} MiB<br>%{customdata[0]:,} bytes (%{customdata[1]})<extra></extra>"))
    fig.update_layout(height=height, margin=dict(l=10, r=10, t=50, b=10), plot_bgcolor="white",
                      title=dict(text=f"Peak memory<br><sup>{_peak_note(bench)}</sup>", font=dict(size=14)),
                      yaxis_title="MiB")
    fig.update_yaxes(gridcolor="#eeeeee")
    return fig


def bench_rows(bench) -> list[dict]:
    """The timing as table rows (one dict per stage): stage, nodes, median/p10/p90 ms,
    speedup, peak MiB, peak source; plus compiled latency and compile time when measured."""
    rows = []
    for s in bench.stages:
        row = {"stage": s.stage, "nodes": s.nodes, "median ms": round(s.median_ms, 4),
               "p10 ms": round(s.p10_ms, 4), "p90 ms": round(s.p90_ms, 4), "speedup": round(s.speedup, 3),
               "peak MiB": round(s.peak_bytes / 2**20, 3), "peak source": s.peak_source, "repeats": s.repeats}
        if s.compiled_median_ms is not None:
            row["compiled ms"] = round(s.compiled_median_ms, 4)
            row["compile s"] = round(s.compile_s or 0.0, 2)
        rows.append(row)
    return rows
