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
    trace,
    ss: MutableMapping,
    repeats: int,
    mode: str,
    compile: bool,
    upstream: bool,
    one_thread: bool,
    kernels: bool = False,
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
            kernels=kernels,
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
    if b.bytes_packed and b.mode == "training":
        st.caption(f"Packed parameters (stage `packed`): {b.bytes_packed:,} bytes, one leaf per fused group.")
    elif b.bytes_packed:
        st.caption(f"Pre-packed weights: {b.bytes_packed:,} bytes folded into constants once (inference).")
    st.dataframe(pd.DataFrame(viz.bench_rows(b)), hide_index=True, width="stretch")
    counted = [s for s in b.stages if s.kernels is not None]
    if counted:
        st.caption(
            "Kernels Inductor generated and extern (library) calls, per call of each stage's graph:\n"
            + "\n".join(f"- **{s.stage}**: {s.kernels_text()}" for s in counted)
        )


def timing_panel(trace, ss: MutableMapping) -> None:
    """The panel: options, a Measure button with a progress bar, then :func:`show_result`."""
    st.markdown("#### Per-pass timing and memory")
    if ss.get("spec") is None:
        st.caption("Timing needs the model: this trace came from a file whose model is not a sample here.")
        return
    if S.includes_pattern(ss, trace) is not None:
        c = st.columns([4, 1], vertical_alignment="center")
        c[0].caption(
            "This trace runs your pattern from the Pattern Lab, whose code runs only in a separate process: "
            "time it there with **Time it** (one thread, thread CPU time, stages interleaved)."
        )
        c[1].button("Time it in the Pattern Lab", key="bench_in_lab", on_click=S.go_to, args=(ss, S.LAB))
        return
    c = st.columns([0.9, 1.2, 1.5, 1.5, 1.3, 1.9], vertical_alignment="bottom")  # every label whole at 1280 px
    repeats = c[0].number_input("Repeats", 3, 200, key="repeats", persist_state=S.KEEP)
    mode = c[1].selectbox(
        "Mode",
        MODES,
        key="bench_mode",
        persist_state=S.KEEP,
        help="inference: no_grad, weights pre-packed; training: forward + backward, parameters packed (stage packed)",
    )
    compile = c[2].checkbox(
        "torch.compile",
        key="bench_compile",
        persist_state=S.KEEP,
        help="also time each stage under Inductor (compiling takes seconds per stage)",
    )
    upstream = c[3].checkbox(
        "vs upstream",
        key="bench_upstream",
        persist_state=S.KEEP,
        help="add PyTorch's own pre-grad passes with the equivalent options",
    )
    one_thread = c[4].checkbox(
        "1 thread",
        key="bench_one_thread",
        persist_state=S.KEEP,
        help="torch.set_num_threads(1), timed by the thread's CPU time: on CPU the default, because its "
        "p10-p90 spread is tight where torch's thread pool on wall clock is noise-dominated on a shared "
        "machine. Untick to time with torch's default threads on wall clock.",
    )
    kernels = c[5].checkbox(
        "kernels",
        key="bench_kernels",
        persist_state=S.KEEP,
        help="compile each stage with Inductor and count the kernels it generates and its extern (library) calls",
    )
    if c[5].button("Measure timing", key="bench_btn", width="stretch", help="per pass, with memory"):
        _measure(trace, ss, int(repeats), mode, compile, upstream, one_thread, kernels)
    b = ss.get("bench")
    if b is None:
        st.caption(
            "Times the baseline graph and the graph after each pass that made a step, round-robin in one "
            f"run, median with p10–p90: {timer_text(one_thread)}."
        )
        return
    show_result(b)


def timer_text(one_thread: bool) -> str:
    """How the next measurement will be timed, as the panel says it: CUDA events on a GPU; on
    CPU one thread timed by its CPU time (the default: the tight spread) or torch's threads on
    wall clock."""
    import torch

    if torch.cuda.is_available():
        return "CUDA events on the GPU"
    if one_thread:
        return (
            "on CPU one thread, timed by the thread's CPU time — the default here, because its spread "
            "is tight (torch's thread pool on wall clock is noise-dominated on a shared machine)"
        )
    return "on CPU torch's default threads on wall clock — expect a wide spread; tick 1 thread for a tight one"
