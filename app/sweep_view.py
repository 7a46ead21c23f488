"""The Sweep page: a sweep directory written by ``optimus sweep`` — its runs as a sortable
table (click a column header), filters by status and config, and any run's trace opened
in the step viewer. Reading the directory is :func:`optimus_lens.sweep.results.load_sweep`; the
table's records are :func:`optimus_lens.viz.sweep_summary.table_row`."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pandas as pd
import streamlit as st

from optimus_lens.app import state as S
from optimus_lens.sweep.configs import SweepError
from optimus_lens.sweep.results import load_sweep
from optimus_lens.viz.sweep_summary import table_row


def open_run(state, out_dir: str, row: dict, which: str = "trace") -> None:
    """Button callback: load the run's trace (``which``: "trace" or "upstream_trace") and
    show it in the step viewer; on failure ``state["sweep_error"]`` says why. A sample or
    ``hf:`` model keeps its spec, so the viewer can run and time it again."""
    from optimus_lens.core.trace import Trace, TraceFormatError

    path = Path(out_dir) / row[which]
    try:
        trace = Trace.load(path)
    except (OSError, TraceFormatError) as e:
        state["sweep_error"] = f"cannot open {path}: {e}"
        return
    spec = row["model"] if row["model"].startswith(("sample:", "hf:")) else None
    what = "upstream passes" if which == "upstream_trace" else f"config {row['config']}"
    S.set_trace(state, trace, spec, f"sweep {Path(out_dir).name}: {row['model']}, {what}")
    S.go_to(state, S.VIEWER)


def _details(state, out_dir: str, row: dict) -> None:
    if row.get("error"):
        st.code(row["error"], language=None)
    ff = row.get("first_failing")
    if ff:
        st.warning(
            f"First failing step: **{ff['index']}** — {ff['pattern']} ({ff['pass']}) at "
            f"{', '.join(ff['sites'])}" + (" (rolled back)" if ff.get("rolled_back") else "")
        )
    up = row.get("upstream")
    if up and "error" in up:
        st.warning(f"Upstream: {up['error']}")
    elif up:
        st.caption(
            f"Upstream: {up['nodes_after']} nodes after {up['steps']} steps; steps only ours "
            f"{up['only_ours']}, only upstream {up['only_upstream']}, upstream defects {up['defects']}; "
            f"passes with other groups: {', '.join(up['passes_differing']) or 'none'}"
        )
    c = st.columns(3)
    c[0].button(
        "Open in the step viewer",
        key="sweep_open",
        type="primary",
        disabled=not row.get("trace"),
        on_click=open_run,
        args=(state, out_dir, row),
    )
    c[1].button(
        "Open upstream's trace",
        key="sweep_open_upstream",
        disabled=not row.get("upstream_trace"),
        on_click=open_run,
        args=(state, out_dir, row, "upstream_trace"),
    )
    report = Path(out_dir) / row["report"] if row.get("report") else None
    if report is not None and report.is_file():
        c[2].download_button(
            "Download the HTML report", report.read_bytes(), file_name=report.name, mime="text/html", key="sweep_report"
        )
    elif row.get("trace"):
        c[2].caption(f"No report written; `optimus report {Path(out_dir) / row['trace']} -o report.html`")


def page() -> None:
    """Draw the Sweep page (sidebar title, directory box, counts, table, one run's details)."""
    state = st.session_state
    with st.sidebar:
        st.title("Optimus Lens")
        st.caption("Sweep: every model x configuration of an `optimus sweep` directory.")
    st.subheader("Sweep")
    out_dir = st.text_input(
        "Sweep directory",
        value=os.environ.get(S.SWEEP_ENV, ""),
        key="sweep_dir",
        placeholder="the --out DIR of optimus sweep",
        help="A directory written by `optimus sweep ... --out DIR` (results.jsonl, traces/, "
        "reports/, summary.html). `optimus app --sweep DIR` opens it here.",
    ).strip()
    if state.get("sweep_error"):
        st.error(state.pop("sweep_error"))
    if not out_dir:
        st.info("Enter the directory of a sweep: `optimus sweep 'sample:*' 'hf:*' --out DIR` writes one.")
        return
    try:
        rows, configs = load_sweep(out_dir)
    except SweepError as e:
        st.error(str(e))
        return
    counts = Counter(r.get("status") for r in rows)
    c = st.columns(5)
    c[0].metric("Runs", len(rows))
    for col, s in zip(c[1:], ("ok", "verify_failed", "rolled_back", "error")):
        col.metric(
            s.replace("_", " "),
            counts[s] + (counts["failed"] if s == "error" else 0),
            help="error: the run raised; failed (counted here too): its process was killed or crashed"
            if s == "error"
            else None,
        )
    f = st.columns(2)
    statuses = f[0].multiselect("Status", sorted(counts, key=str), key="sweep_status")
    names = sorted({r["config"] for r in rows})
    chosen = f[1].multiselect("Config", names, key="sweep_config")
    shown = [r for r in rows if (not statuses or r.get("status") in statuses) and (not chosen or r["config"] in chosen)]
    st.dataframe(pd.DataFrame([table_row(r) for r in shown]), hide_index=True, width="stretch")
    if configs:
        with st.expander(f"{len(configs)} config(s)"):
            st.json(configs)
    if not shown:
        return
    keys = [r["key"] for r in shown]
    key = st.selectbox(
        "Run", keys, key="sweep_run", format_func=lambda k: f"{k} — {next(r['status'] for r in shown if r['key'] == k)}"
    )
    _details(state, out_dir, next(r for r in shown if r["key"] == key))
