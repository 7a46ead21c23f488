"""A sweep from start to end (:func:`sweep`): every model x config not yet in the sweep
directory, locally or on Ray, each row appended as it arrives.

Rows are appended to ``DIR/results.jsonl`` by the driver alone as they arrive, keyed by
:func:`optimus_lens.sweep.task.run_key`; a restarted sweep skips the keys already there
(``retry_failed`` re-runs those that errored or failed). After every row ``on_rows`` sees
the whole directory's rows (``optimus sweep`` rewrites ``DIR/summary.html`` with them).
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from optimus_lens.sweep.configs import SweepConfig, check_configs
from optimus_lens.sweep.executors import run_local, run_ray
from optimus_lens.sweep.results import Results, save_configs
from optimus_lens.sweep.task import RunTask, SweepOptions


@dataclass
class SweepOutcome:
    """A finished (or interrupted) sweep: the rows of its runs in model x config order
    (None for a run with no row yet), how many were skipped as already done, and the
    sweep's wall time (s)."""

    rows: list[dict | None]
    skipped: int
    wall_s: float
    out_dir: Path
    counts: dict = field(default_factory=dict)


def _line(row: dict) -> str:
    s = row["status"]
    if s in ("error", "failed"):
        return f"{row['key']}: {s}: {(row['error'] or '').splitlines()[0][:160]}"
    ff = row.get("first_failing")
    return (
        f"{row['key']}: {s} {row['nodes_before']} -> {row['nodes_after']} nodes, {row['steps']} steps, verify "
        f"{row['verify']}"
        + (f", first failing step {ff['index']} ({ff['pattern']})" if ff else "")
        + f" [{row['wall_s']:.1f} s]"
    )


def sweep(
    models: list[str],
    configs: list[SweepConfig],
    options: SweepOptions,
    out_dir: str | Path,
    workers: int = 1,
    ray_address: str | None = None,
    ray_wheel: str | None = None,
    retry_failed: bool = False,
    progress: bool = True,
    on_rows: Callable[[Path, list[dict], list[dict]], object] | None = None,
) -> SweepOutcome:
    """Run every model x config not already in ``out_dir/results.jsonl`` (with
    ``retry_failed`` also those whose row is ``error`` / ``failed``), locally on
    ``workers`` processes or as Ray tasks (``ray_address``), appending each row as it
    arrives. ``on_rows(out_dir, rows, configs)`` is called before the first run and after
    every row with every row of the directory (last per key) and every config run into it
    (``optimus sweep`` passes :func:`optimus_lens.viz.sweep_summary.write_summary`). A
    progress bar (tqdm, on stderr) counts done / failed / remaining, and one line per
    finished run is printed. Raises SweepError for bad configs; ImportError when Ray is
    asked for and missing."""
    from tqdm import tqdm

    t0 = time.perf_counter()
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cwd = os.getcwd()
    check_configs(configs, cwd)
    all_configs = save_configs(out, configs)
    results = Results(out)
    have = results.rows()
    tasks = [RunTask(m, c, options, str(out), cwd) for m in models for c in configs]
    redo = ("error", "failed") if retry_failed else ()
    todo = [t for t in tasks if t.key not in have or have[t.key].get("status") in redo]
    skipped = len(tasks) - len(todo)
    todo_keys = {t.key for t in todo}
    done_rows = {t.key: have[t.key] for t in tasks if t.key in have and t.key not in todo_keys}

    def counts() -> dict:
        c = Counter(r["status"] for r in done_rows.values())
        return {
            "ok": c["ok"],
            "not ok": sum(v for k, v in c.items() if k != "ok"),
            "remaining": len(tasks) - len(done_rows),
        }

    tty = sys.stderr.isatty()
    bar = tqdm(
        total=len(tasks),
        initial=skipped,
        unit="run",
        desc="sweep",
        file=sys.stderr,
        disable=not (progress and tty),
        dynamic_ncols=True,
    )
    bar.set_postfix(counts())

    def on_row(row: dict) -> None:
        results.append(row)
        done_rows[row["key"]] = row
        have[row["key"]] = row
        if on_rows:
            on_rows(out, list(have.values()), all_configs)
        c = counts()
        bar.set_postfix(c, refresh=False)
        bar.update(1)
        if progress:  # on a terminal above the bar; in a log, with the counts
            prefix = "" if tty else f"[{len(done_rows)}/{len(tasks)}: {c['ok']} ok, {c['not ok']} not ok] "
            bar.write(prefix + _line(row), file=sys.stderr)

    if on_rows:
        on_rows(out, list(have.values()), all_configs)
    try:
        if not todo:
            pass
        elif ray_address:
            run_ray(todo, ray_address, on_row, workers, ray_wheel)
        else:
            run_local(todo, workers, on_row)
    finally:
        bar.close()
    return SweepOutcome([done_rows.get(t.key) for t in tasks], skipped, time.perf_counter() - t0, out, counts())
