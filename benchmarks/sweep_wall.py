"""Wall time of the full sweep: every sample and every HF architecture x two configs.

Runs the real command, ``optimus sweep 'sample:*' 'hf:*' --configs
benchmarks/sweep_configs.json``, once per executor into a fresh directory each
(``--workers 1``, ``--workers 2``, optionally ``--ray local``), prints one line per
executor: wall time (s), runs, statuses, and the load average before and after (the
machine may be shared); then checks that every executor whose directory is in ``--out``
(from this run or an earlier one) wrote the same rows (:func:`optimus_lens.sweep.results.comparable`:
timing and host fields left out).

    .venv/bin/python benchmarks/sweep_wall.py [--ray] [--reports] [--out DIR] [--only ray]

Exit status 0 whether or not the rows agree (a measurement); the verdict is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from optimus_lens.sweep.results import Results, comparable  # noqa: E402

CONFIGS = ROOT / "benchmarks" / "sweep_configs.json"


def run(name: str, extra: list[str], out: Path, reports: bool) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "optimus_lens",
        "sweep",
        "sample:*",
        "hf:*",
        "--configs",
        str(CONFIGS),
        "--out",
        str(out / name),
        "--quiet",
        *extra,
        *([] if reports else ["--no-reports"]),
    ]
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    rows = Results(out / name).rows()
    res = {
        "executor": name,
        "wall_s": round(wall, 1),
        "exit": p.returncode,
        "runs": len(rows),
        "status": dict(Counter(r["status"] for r in rows.values())),
        "load_before": [round(x, 2) for x in load0],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "run_s_sum": round(sum(r["wall_s"] or 0 for r in rows.values()), 1),
    }
    print(json.dumps(res), flush=True)
    if p.returncode not in (0, 1):
        print(p.stderr[-3000:], file=sys.stderr)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ray", action="store_true", help="also run it as Ray tasks (--ray local, 2 CPUs)")
    ap.add_argument("--reports", action="store_true", help="write every run's HTML report too")
    ap.add_argument("--out", help="keep the sweep directories here (default: a temporary directory)")
    ap.add_argument("--only", choices=["1", "2", "ray"], action="append", help="run only these executors (repeatable)")
    a = ap.parse_args()
    out = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="sweep_wall_"))
    plan = [("workers-1", ["--workers", "1"]), ("workers-2", ["--workers", "2"])]
    if a.ray:
        plan.append(("ray-local", ["--workers", "2", "--ray", "local"]))
    if a.only:
        plan = [p for p in plan if p[0].split("-")[-1] in a.only or ("ray" in a.only and p[0] == "ray-local")]
    print(f"cpus {os.cpu_count()}, out {out}", flush=True)
    results = [run(name, extra, out, a.reports) for name, extra in plan]
    done = [n for n in ("workers-1", "workers-2", "ray-local") if (out / n / "results.jsonl").is_file()]
    rows = {n: {k: comparable(v) for k, v in Results(out / n).rows().items()} for n in done}
    first = done[0]
    for n in done[1:]:
        same = rows[n] == rows[first]
        diff = [k for k in rows[first] if rows[n].get(k) != rows[first][k]]
        print(f"rows of {n} identical to {first}: {same}" + ("" if same else f" (differ: {diff[:5]})"))
    wall = {r["executor"]: r["wall_s"] for r in results}
    if "workers-1" in wall and "workers-2" in wall:
        print(f"speedup of 2 workers over 1: {wall['workers-1'] / wall['workers-2']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
