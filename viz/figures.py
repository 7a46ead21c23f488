"""Plotly figures of a Trace and of per-pass timing (:class:`optimus_lens.perf.timings.BenchResult`).

Every function returns a ``plotly.graph_objects.Figure`` and touches no UI; the app
shows them with ``st.plotly_chart`` and the HTML report embeds them.
"""

from __future__ import annotations

import plotly.graph_objects as go

from optimus_lens.core.trace import Trace
from optimus_lens.viz.palette import STANDARD

FAILED_COLOUR = "#c62828"


def node_count_figure(trace: Trace, current: int | None = None, height: int = 340) -> go.Figure:
    """Node count of the graph after each step (step 0 = as captured), one marker colour
    per pass, failed-verification steps as red crosses, and the ``current`` step (if
    given) as a dashed vertical line."""
    fig = go.Figure()
    xs = [0] + [s.index for s in trace.steps]
    ys = [trace.nodes_before] + [s.nodes_after for s in trace.steps]
    fig.add_trace(
        go.Scatter(
            x=xs,
            y=ys,
            mode="lines",
            line=dict(color="#9e9e9e", width=1.5, shape="hv"),
            name="nodes",
            hoverinfo="skip",
            showlegend=False,
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[0],
            y=[trace.nodes_before],
            mode="markers",
            name="captured",
            marker=dict(color="#616161", size=8, symbol="square"),
            hovertemplate="captured: %{y} nodes<extra></extra>",
        )
    )
    passes = list(dict.fromkeys(s.pass_name for s in trace.steps))
    for i, p in enumerate(passes):
        steps = trace.steps_of_pass(p)
        fig.add_trace(
            go.Scatter(
                x=[s.index for s in steps],
                y=[s.nodes_after for s in steps],
                mode="markers",
                name=p,
                marker=dict(
                    color=STANDARD.groups[i % len(STANDARD.groups)], size=9, line=dict(color="#333333", width=1)
                ),
                customdata=[s.pattern for s in steps],
                hovertemplate="step %{x}: %{customdata}<br>%{y} nodes after<extra>" + p + "</extra>",
            )
        )
    failed = trace.failed_steps()
    if failed:
        fig.add_trace(
            go.Scatter(
                x=[s.index for s in failed],
                y=[s.nodes_after for s in failed],
                mode="markers",
                name="verify failed",
                marker=dict(color=FAILED_COLOUR, size=13, symbol="x"),
                customdata=[f"max abs err {s.verify.max_abs_err}" for s in failed],
                hovertemplate="step %{x} failed verification<br>%{customdata}<extra></extra>",
            )
        )
    if current is not None:
        fig.add_vline(x=current, line=dict(color="#1565c0", dash="dash", width=1.5))
    fig.update_layout(
        height=height,
        margin=dict(l=10, r=10, t=30, b=10),
        title=dict(text="Nodes after each step", font=dict(size=14)),
        xaxis_title="step",
        yaxis_title="nodes",
        legend=dict(orientation="h", yanchor="top", y=-0.28, x=0, xanchor="left"),
        plot_bgcolor="white",
    )
    fig.update_xaxes(dtick=1 if len(xs) <= 30 else None, gridcolor="#eeeeee")
    fig.update_yaxes(gridcolor="#eeeeee")
    return fig


KIND_COLOURS = {"baseline": "#9e9e9e", "upstream": "#8d6e63", "reference": "#37474f"}
COMPILED_COLOUR = "#ef6c00"


def _peak_note(bench) -> str:
    if all(s.peak_source == "cuda" for s in bench.stages):
        return "measured (torch.cuda.max_memory_allocated)"
    if any(s.peak_source == "estimate-forward" for s in bench.stages):
        return "estimate from tensor liveness of the forward graph (CPU; activations saved for backward not counted)"
    return "estimate from tensor liveness (CPU)"


def method_text(bench) -> str:
    """One line naming how ``bench`` was measured: device, threads, mode, timer, and where
    its memory figures come from."""
    timer = {"cuda-events": "CUDA events", "thread-cpu-time": "the thread's CPU time (one thread)"}.get(
        bench.method, "wall clock"
    )
    threads = f" ({bench.threads} thread{'s' if bench.threads != 1 else ''})" if getattr(bench, "threads", None) else ""
    mode = getattr(bench, "mode", "inference")
    return f"{bench.device}{threads}, {mode}, timed with {timer}; peak memory {_peak_note(bench)}"


def _colours(stages) -> list[str]:
    """Grey baseline, one palette colour per pass stage, fixed colours for upstream and reference."""
    out, i = [], 0
    for s in stages:
        kind = getattr(s, "kind", "pass")
        if s.stage == stages[0].stage or kind in KIND_COLOURS:
            out.append(KIND_COLOURS.get(kind, KIND_COLOURS["baseline"]))
        else:
            out.append(STANDARD.groups[i % len(STANDARD.groups)])
            i += 1
    return out


def _spread(base: float, med: float | None, p10: float | None, p90: float | None) -> tuple[float, float, float]:
    """(speedup, up, down) for error bars: base/median, base/p10 - speedup, speedup - base/p90."""
    if not med:
        return 0.0, 0.0, 0.0
    sp = base / med
    return sp, (base / p10 if p10 else sp) - sp, sp - (base / p90 if p90 else sp)


def speedup_figure(bench, height: int = 340) -> go.Figure:
    """Bars of each timed stage's speedup over the baseline (baseline median / stage
    median), with error bars spanning baseline median / p90 .. baseline median / p10 of
    the stage; with compiled variants a second series (under Inductor, against the
    compiled baseline); a dotted line at 1.0x. Only stages that changed the graph are
    bars (the bench times only those); the subtitle names the passes with no change.
    ``bench`` is an :class:`optimus_lens.perf.timings.BenchResult`."""
    stages = bench.stages
    base = stages[0].median_ms if stages else 0.0
    names = [s.stage for s in stages]
    eager = [_spread(base, s.median_ms, s.p10_ms, s.p90_ms) for s in stages]
    fig = go.Figure(
        go.Bar(
            x=names,
            y=[e[0] for e in eager],
            name="eager",
            marker=dict(color=_colours(stages), line=dict(color="#333333", width=1)),
            error_y=dict(
                type="data",
                symmetric=False,
                array=[e[1] for e in eager],
                arrayminus=[e[2] for e in eager],
                color="#333333",
            ),
            customdata=[[s.median_ms, s.p10_ms, s.p90_ms, s.nodes] for s in stages],
            hovertemplate="%{x}: %{y:.2f}x<br>median %{customdata[0]:.3f} ms (p10 %{customdata[1]:.3f}, "
            "p90 %{customdata[2]:.3f})<br>%{customdata[3]} nodes<extra>eager</extra>",
        )
    )
    tops = [e[0] for e in eager]
    if stages and stages[0].compiled_median_ms:
        cb = stages[0].compiled_median_ms
        comp = [_spread(cb, s.compiled_median_ms, s.compiled_p10_ms, s.compiled_p90_ms) for s in stages]
        tops += [c[0] for c in comp]
        fig.add_trace(
            go.Bar(
                x=names,
                y=[c[0] for c in comp],
                name="torch.compile (Inductor)",
                marker=dict(color=COMPILED_COLOUR, line=dict(color="#333333", width=1)),
                error_y=dict(
                    type="data",
                    symmetric=False,
                    array=[c[1] for c in comp],
                    arrayminus=[c[2] for c in comp],
                    color="#333333",
                ),
                customdata=[[s.compiled_median_ms or 0, s.compile_s or 0] for s in stages],
                hovertemplate="%{x}: %{y:.2f}x under Inductor<br>median %{customdata[0]:.3f} ms, compiled in "
                "%{customdata[1]:.1f} s<extra>compiled</extra>",
            )
        )
        fig.update_layout(barmode="group", legend=dict(orientation="h", y=-0.3))
    else:
        fig.update_layout(showlegend=False)
    fig.add_hline(y=1.0, line=dict(color="#616161", dash="dot"))
    unchanged = getattr(bench, "unchanged", [])
    sub = method_text(bench) + (f"<br>no change (not timed): {', '.join(unchanged)}" if unchanged else "")
    fig.update_layout(
        height=height + (20 if unchanged else 0),
        margin=dict(l=10, r=10, t=70 if unchanged else 50, b=10),
        plot_bgcolor="white",
        title=dict(
            text=f"Speedup vs baseline (cumulative, after each pass that made a step)<br><sup>{sub}</sup>",
            font=dict(size=14),
        ),
        yaxis_title="speedup (×)",
    )
    # a noisy sample's p10/p90 spread can be many times the bars: clip the axis to the bars, not the whiskers
    top = max([*tops, 1.0]) * 1.5 if stages else 2.0
    fig.update_yaxes(gridcolor="#eeeeee", range=[0, top])
    return fig


def memory_figure(bench, height: int = 320) -> go.Figure:
    """Bars of each stage's peak memory in MiB (measured compiled peaks as a second series
    on CUDA); the title says whether the figures are measured on CUDA or a liveness
    estimate (CPU)."""
    stages = bench.stages
    mib = [s.peak_bytes / 2**20 for s in stages]
    fig = go.Figure(
        go.Bar(
            x=[s.stage for s in stages],
            y=mib,
            name="eager",
            marker=dict(color=_colours(stages), line=dict(color="#333333", width=1)),
            customdata=[[s.peak_bytes, s.peak_source] for s in stages],
            hovertemplate="%{x}: %{y:.3f} MiB<br>%{customdata[0]:,} bytes (%{customdata[1]})<extra></extra>",
        )
    )
    if any(s.compiled_peak_bytes for s in stages):
        fig.add_trace(
            go.Bar(
                x=[s.stage for s in stages],
                y=[(s.compiled_peak_bytes or 0) / 2**20 for s in stages],
                name="torch.compile (Inductor)",
                marker=dict(color=COMPILED_COLOUR),
            )
        )
        fig.update_layout(barmode="group")
    fig.update_layout(
        height=height,
        margin=dict(l=10, r=10, t=50, b=10),
        plot_bgcolor="white",
        showlegend=False,
        title=dict(text=f"Peak memory<br><sup>{_peak_note(bench)}</sup>", font=dict(size=14)),
        yaxis_title="MiB",
    )
    fig.update_yaxes(gridcolor="#eeeeee")
    return fig


def compile_time_figure(bench, height: int = 300) -> go.Figure | None:
    """Bars of each stage's ``torch.compile`` time (s: first call, Inductor), or None when
    the bench compiled nothing."""
    stages = [s for s in bench.stages if s.compile_s is not None]
    if not stages:
        return None
    fig = go.Figure(
        go.Bar(
            x=[s.stage for s in stages],
            y=[s.compile_s for s in stages],
            marker=dict(color=COMPILED_COLOUR, line=dict(color="#333333", width=1)),
            hovertemplate="%{x}: compiled in %{y:.2f} s<extra></extra>",
        )
    )
    fig.update_layout(
        height=height,
        margin=dict(l=10, r=10, t=40, b=10),
        plot_bgcolor="white",
        title=dict(text="Compile time (torch.compile, Inductor, first call)", font=dict(size=14)),
        yaxis_title="s",
    )
    fig.update_yaxes(gridcolor="#eeeeee")
    return fig


def bench_rows(bench) -> list[dict]:
    """The timing as table rows (one dict per stage): stage, kind, steps, nodes,
    median/p10/p90 ms, speedup, peak MiB, peak source, repeats; plus compiled latency,
    spread, speedup and compile time when measured."""
    rows = []
    for s in bench.stages:
        row = {
            "stage": s.stage,
            "kind": getattr(s, "kind", ""),
            "steps": getattr(s, "steps", 0),
            "nodes": s.nodes,
            "median ms": round(s.median_ms, 4),
            "p10 ms": round(s.p10_ms, 4),
            "p90 ms": round(s.p90_ms, 4),
            "speedup": round(s.speedup, 3),
            "peak MiB": round(s.peak_bytes / 2**20, 3),
            "peak source": s.peak_source,
            "repeats": s.repeats,
        }
        if s.compiled_median_ms is not None:
            row["compiled ms"] = round(s.compiled_median_ms, 4)
            row["compiled p10..p90 ms"] = f"{s.compiled_p10_ms or 0:.4f}..{s.compiled_p90_ms or 0:.4f}"
            row["compiled speedup"] = round(s.compiled_speedup or 0.0, 3)
            row["compile s"] = round(s.compile_s or 0.0, 2)
        rows.append(row)
    return rows
