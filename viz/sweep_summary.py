"""A sweep's rows as a table: ``DIR/summary.html`` (one sortable, filterable table row per
run, written by ``optimus sweep`` after every row) and :func:`table_row` (a row flattened
for the app's Sweep page).

The rows are the plain dicts of ``DIR/results.jsonl`` (their fields:
:mod:`optimus_lens.sweep.task`); nothing here imports the sweep. The page is
self-contained and offline: a few lines of inline JavaScript sort by any column (click
its header; numbers numerically, empty cells last) and filter rows by text. Each row
links the run's trace (JSON, opened by ``optimus show`` or the app) and its HTML report
(or, where none was written, says the ``optimus report`` command that writes it).
"""

from __future__ import annotations

import html
import json
from pathlib import Path

COLUMNS = (
    "model",
    "config",
    "status",
    "graph breaks",
    "nodes before",
    "nodes after",
    "Δ nodes",
    "steps",
    "steps per pattern",
    "verify",
    "max abs err",
    "first failing step",
    "rolled back",
    "speedup",
    "vs upstream",
    "upstream nodes after",
    "only ours / only upstream",
    "upstream defects",
    "error",
    "wall s",
    "files",
)

_STYLE = """
body{font:13px system-ui,sans-serif;margin:16px;color:#222}
table{border-collapse:collapse;width:100%}
th,td{border:1px solid #ddd;padding:3px 6px;vertical-align:top;text-align:left}
th{background:#f3f3f3;cursor:pointer;position:sticky;top:0;white-space:nowrap}
th.asc:after{content:" \\25B2"}th.desc:after{content:" \\25BC"}
td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.ok td.st{background:#e6f4ea}tr.verify_failed td.st,tr.failed td.st{background:#fde2e1}
tr.error td.st,tr.rolled_back td.st{background:#fff4d6}
td.err{max-width:420px;white-space:pre-wrap;font-family:monospace;font-size:11px}
code{font-size:11px}
#filter{margin:6px 0 10px;padding:4px;width:320px}
"""

_SCRIPT = """
(function(){
const t=document.getElementById('runs'),b=t.tBodies[0];
t.querySelectorAll('th').forEach((th,i)=>th.addEventListener('click',()=>{
  const asc=!th.classList.contains('asc');
  t.querySelectorAll('th').forEach(h=>h.classList.remove('asc','desc'));
  th.classList.add(asc?'asc':'desc');
  const key=r=>{const c=r.cells[i];return c.dataset.v!==undefined?c.dataset.v:c.textContent.trim()};
  const rows=[...b.rows],num=rows.every(r=>key(r)===''||!isNaN(Number(key(r))));
  rows.sort((x,y)=>{const a=key(x),c=key(y);if(a===''||c==='')return (a==='')-(c==='');
    const d=num?Number(a)-Number(c):a.localeCompare(c);return asc?d:-d});
  rows.forEach(r=>b.appendChild(r));}));
document.getElementById('filter').addEventListener('input',e=>{
  const q=e.target.value.toLowerCase();
  [...b.rows].forEach(r=>{r.style.display=r.textContent.toLowerCase().includes(q)?'':'none'})});
})();
"""


def _cell(text, sort=None, cls: str = "") -> str:
    v = "" if sort is None else f' data-v="{html.escape(str(sort))}"'
    c = f' class="{cls}"' if cls else ""
    return f"<td{c}{v}>{text}</td>"


def _num(x, fmt: str = "{}") -> str:
    return _cell("" if x is None else html.escape(fmt.format(x)), "" if x is None else x, "num")


def _files(row: dict) -> str:
    out = []
    if row.get("trace"):
        out.append(f'<a href="{html.escape(row["trace"])}">trace</a>')
    if row.get("upstream_trace"):
        out.append(f'<a href="{html.escape(row["upstream_trace"])}">upstream trace</a>')
    if row.get("report"):
        out.append(f'<a href="{html.escape(row["report"])}">report</a>')
    elif row.get("trace"):
        cmd = f"optimus report {row['trace']} -o {row['trace'].replace('traces/', 'reports/')[:-5]}.html"
        why = f" ({row['report_error']})" if row.get("report_error") else ""
        out.append(f'<code title="no report written{html.escape(why)}">{html.escape(cmd)}</code>')
    return " · ".join(out)


def notes(row: dict) -> str:
    """The run's error, else what went wrong beside it (upstream's passes, timing, the report)."""
    if row.get("error"):
        return row["error"]
    side = [
        ((row.get(k) or {}).get("error") if k != "report_error" else row.get(k), k)
        for k in ("upstream", "latency", "report_error")
    ]
    return "; ".join(f"{k.replace('_error', '')}: {v}" for v, k in side if v)


def row_html(row: dict) -> str:
    """One run as a ``<tr>`` of :data:`COLUMNS`."""
    before, after = row.get("nodes_before"), row.get("nodes_after")
    spp = row.get("steps_per_pattern") or {}
    ff = row.get("first_failing")
    lat = row.get("latency") or {}
    up = row.get("upstream") or {}
    err = notes(row)
    cells = [
        _cell(html.escape(row["model"])),
        _cell(html.escape(row["config"])),
        _cell(html.escape(row.get("status") or ""), cls="st"),
        _num(row.get("graph_breaks")),
        _num(before),
        _num(after),
        _num(None if before is None or after is None else after - before),
        _num(row.get("steps")),
        _cell(html.escape(", ".join(f"{k} {v}" for k, v in spp.items())), sum(spp.values()) if spp else ""),
        _cell(html.escape(row.get("verify") or "")),
        _num(row.get("max_abs_err"), "{:.1e}"),
        _cell(html.escape(f"#{ff['index']} {ff['pattern']} ({ff['pass']})") if ff else "", ff["index"] if ff else ""),
        _num(row.get("rolled_back")),
        _num(lat.get("speedup"), "{:.3f}"),
        _num(lat.get("ours_vs_upstream"), "{:.3f}"),
        _num(up.get("nodes_after")),
        _cell(
            html.escape(f"{up['only_ours']} / {up['only_upstream']}") if "only_ours" in up else "",
            up["only_ours"] + up["only_upstream"] if "only_ours" in up else "",
        ),
        _num(up.get("defects")),
        _cell(html.escape(err), cls="err"),
        _num(row.get("wall_s"), "{:.1f}"),
        _cell(_files(row)),
    ]
    return f'<tr class="{html.escape(row.get("status") or "")}">{"".join(cells)}</tr>'


def table_row(row: dict) -> dict:
    """One run as a flat record for a table (the app's Sweep page): plain values, the
    per-pattern steps and the first failing step as short text, None where not measured."""
    spp = row.get("steps_per_pattern") or {}
    ff = row.get("first_failing")
    lat = row.get("latency") or {}
    up = row.get("upstream") or {}
    before, after = row.get("nodes_before"), row.get("nodes_after")
    return {
        "model": row["model"],
        "config": row["config"],
        "status": row.get("status"),
        "graph breaks": row.get("graph_breaks"),
        "nodes before": before,
        "nodes after": after,
        "Δ nodes": None if before is None or after is None else after - before,
        "steps": row.get("steps"),
        "steps per pattern": ", ".join(f"{k} {v}" for k, v in spp.items()),
        "verify": row.get("verify"),
        "max abs err": row.get("max_abs_err"),
        "first failing step": f"#{ff['index']} {ff['pattern']} ({ff['pass']})" if ff else "",
        "rolled back": row.get("rolled_back"),
        "speedup": lat.get("speedup"),
        "vs upstream": lat.get("ours_vs_upstream"),
        "upstream nodes after": up.get("nodes_after"),
        "upstream defects": up.get("defects"),
        "error": notes(row).split("\n")[0][:300],
        "wall s": row.get("wall_s"),
    }


def summary_html(rows: list[dict], configs: list | None = None, title: str = "Optimus Lens sweep") -> str:
    """The whole summary page: counts per status, the configs (JSON objects, or objects
    with ``to_json()``), the table of ``rows``."""
    from collections import Counter

    counts = Counter(r.get("status") for r in rows)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
    conf = "".join(
        f"<li><code>{html.escape(json.dumps(c if isinstance(c, dict) else c.to_json()))}</code></li>"
        for c in (configs or [])
    )
    status = ", ".join(f"{n} {html.escape(str(s))}" for s, n in sorted(counts.items(), key=lambda x: str(x[0])))
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_STYLE}</style></head><body><h2>{html.escape(title)}</h2>"
        f"<p>{len(rows)} runs: {status or 'none yet'}. Click a column header to sort.</p>"
        f"<details><summary>configs</summary><ul>{conf}</ul></details>"
        f"<input id='filter' placeholder='filter rows (model, config, status, error …)'>"
        f"<table id='runs'><thead><tr>{head}</tr></thead><tbody>"
        + "".join(row_html(r) for r in rows)
        + f"</tbody></table><script>{_SCRIPT}</script></body></html>"
    )


def write_summary(out_dir: str | Path, rows: list[dict], configs: list | None = None) -> Path:
    """Write ``out_dir/summary.html`` (through a temporary file, so a reader never sees half
    a page); returns its path."""
    path = Path(out_dir) / "summary.html"
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(summary_html(rows, configs))
    tmp.replace(path)
    return path
