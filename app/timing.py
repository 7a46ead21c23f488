"""The app's timing panel: per-pass speedup and memory, measured by :mod:`optimus_lens.perf.bench`.

The same code as ``optimus bench``: :func:`optimus_lens.perf.bench.bench_pipeline` measures, the
figures come from :mod:`optimus_lens.viz.figures`, and the slowdown flags (one warning per pass
whose measured effect is a slowdown beyond the noise), the noise warning and the ratios
are the BenchResult's own (what the CLI prints). Only passes that made a step are timed and
plotted; the others are listed as "no change".
"""

from __future__ import annotations

from collections.abc import MutableMapping

import pandas as pd
import streamlit as st

from optimus_lens import viz
from optimus_lens.app import state as S
from optimus_lens.perf.timings import MODES


def _measure(
    trace, ss: MutableMapping, repeats: int, mode: str, compile: bool, upstream: bool, one_thread: bool
) -> None:
    from optimus_lens.perf.bench import bench_pipeline

    passes = [p["name"] for p in trace.passes if p.get("enabled", True)] or None
    bar = st.progress(0.0, text="capturing and running the pipeline")

    def progress(done: int, total: int, label: str) -> None:
        bar.progress(min(1.0, done / max(total, 1)), text=f"{label}: {done}/{total}")

    try:
        ss["bench"] = bench_pipeline(
            ss["spec"],
            passes=passes,
            repeats=repeats,
            progress=progress,
            mode=mode,
            compile=compile,
            against_upstream=upstream,
            threads=1 if one_thread else None,
            graph_index=trace.capture.get("graph_index"),
        )
    except Exception as e:  # noqa: BLE001 - shown to the user, the panel keeps working
        title, msg = S.error_message(e)
        st.error(f"**Timing failed — {title}**: {msg}")
    bar.empty()


def show_result(b) -> None:
    """Method line, noise warning, ratios, speedup / memory / compile-time charts
    (p10–p90 error bars), the passes without a step, and the table."""
    st.info(f"Measured on {viz.method_text(b)}.")
    for s in b.slowdowns():
        st.warning(s.slowdown_text())
    warn = b.noise_warning()
    if warn:
        st.warning(warn)
    ratios = b.ratios()
    if ratios:
        cols = st.columns(len(ratios))
        for c, (k, v) in zip(cols, ratios.items()):
            c.metric(k.replace("_", " "), f"{v:.2f}x")
    left, right = st.columns(2)
    left.plotly_chart(viz.speedup_figure(b), width="stretch")
    right.plotly_chart(viz.memory_figure(b), width="stretch")
    ct = viz.compile_time_figure(b)
    if ct is not None:
        st.plotly_chart(ct, width="stretch")
    if b.unchanged:
        st.caption(f"No change (no step, not timed): {', '.join(b.unchanged)}")
    if b.bytes_packed:
        st.caption(f"Pre-packed weights: {b.bytes_packed:,} bytes folded into constants once (inference).")
    st.dataframe(pd.DataFrame(viz.bench_rows(b)), hide_index=True, width="stretch")


def timing_panel(trace, ss: MutableMapping) -> None:
    """The panel: options, a Measure button with a progress bar, then :func:`show_result`."""
    st.markdown("#### Per-pass timing and memory")
    if ss.get("spec") is None:
        st.caption("Timing needs the model: this trace came from a file whose model is not a sample here.")
        return
    c = st.columns([1, 1, 1, 1, 1, 2], vertical_alignment="bottom")
    repeats = c[0].number_input("Repeats", 3, 200, 20, key="repeats")
    mode = c[1].selectbox(
        "Mode", MODES, key="bench_mode", help="inference: no_grad, weights pre-packed; training: forward + backward"
    )
    compile = c[2].checkbox(
        "torch.compile",
        key="bench_compile",
        help="also time each stage under Inductor (compiling takes seconds per stage)",
    )
    upstream = c[3].checkbox(
        "vs upstream", key="bench_upstream", help="add PyTorch's own pre-grad passes with the equivalent options"
    )
    one_thread = c[4].checkbox(
        "1 thread",
        key="bench_one_thread",
        help="torch.set_num_threads(1) for the run: steadier figures on a shared machine",
    )
    if c[5].button("Measure per-pass timing", key="bench_btn"):
        _measure(trace, ss, int(repeats), mode, compile, upstream, one_thread)
    b = ss.get("bench")
    if b is None:
        st.caption(
            "Times the baseline graph and the graph after each pass that made a step, round-robin in one "
            "run: CUDA events on a GPU, wall clock on CPU; median with p10–p90."
        )
        return
    show_result(b)
