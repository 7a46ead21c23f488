"""The towers table of benchmarks/RESULTS.md: recsys_towers32 on CPU, one thread, one run.

Stages timed side by side (round-robin, :mod:`optimus_lens.perf.bench`): the captured FX graph,
PyTorch's own pre-grad passes with the equivalent ``pre_grad_fusion_options``, our
default pipeline, our pipeline with pre-packed weights, and the hand-fused reference.
Prints the table (µs, ratio to the captured graph, estimated peak memory) and checks
the CPU targets of the towers issues:

* inference: ours (pre-packed) >= 0.95x the hand-fused reference's speed, and ours'
  estimated peak memory <= the captured graph's;
* training (``--mode training``, forward + backward): ours (packed parameters, the
  ``packed`` stage) >= 0.9x the hand-fused reference's speed, and faster than upstream.

    .venv/bin/python benchmarks/towers32.py --repeats 300 [--mode training] [--compile] [--json out.json]

Exit status 0 whether or not a target holds (it is a measurement, not a test); the
verdicts are printed.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from optimus_lens.perf.bench import bench_pipeline  # noqa: E402

LABELS = {
    "baseline": "captured FX graph",
    "upstream": "after PyTorch's own pre-grad passes",
    "pipeline": "after our default pipeline",
    "prepack_weights": "... with pre-packed weights",
    "packed": "... with packed parameters",
    "reference": "hand-fused reference",
}
ORDER = ["baseline", "upstream", "pipeline", "prepack_weights", "packed", "reference"]
TARGET = {"inference": 0.95, "training": 0.9}


def table(r) -> list[str]:
    """Markdown rows: graph, µs (median, p10..p90), vs captured, estimated peak MiB (and compiled µs)."""
    compiled = r.stages[0].compiled_median_ms is not None
    head = "| graph | µs, median (p10..p90) | vs captured graph | est. peak MiB |" + (
        " compiled µs | compiled vs captured |" if compiled else ""
    )
    rows = [head, "|---" * (head.count("|") - 1) + "|"]
    base = r.stage("baseline")
    for name in ORDER:
        s = r.stage(name)
        if s is None:
            continue
        row = (
            f"| {LABELS[name]} | {s.median_ms * 1e3:.1f} ({s.p10_ms * 1e3:.1f}..{s.p90_ms * 1e3:.1f}) | "
            f"{base.median_ms / s.median_ms:.2f}x | {s.peak_bytes / 2**20:.2f} |"
        )
        if compiled:
            row += f" {s.compiled_median_ms * 1e3:.1f} | {base.compiled_median_ms / s.compiled_median_ms:.2f}x |"
        rows.append(row)
    return rows


def verdicts(r) -> list[str]:
    ours, ref, base = r.ours, r.stage("reference"), r.stage("baseline")
    out = []
    target = TARGET[r.mode]
    if ref is not None:
        ratio = ref.median_ms / ours.median_ms
        out.append(
            f"speed vs hand-fused reference: {ratio:.3f}x (target >= {target}): "
            f"{'holds' if ratio >= target else 'MISSED'}"
        )
    if r.mode == "inference":
        mem = ours.peak_bytes / base.peak_bytes
        out.append(
            f"estimated peak memory vs captured: {ours.peak_bytes:,} / {base.peak_bytes:,} B = {mem:.3f}x "
            f"(target <= 1): {'holds' if mem <= 1 else 'MISSED'}"
        )
    up = r.stage("upstream")
    if up is not None:
        ratio = up.median_ms / ours.median_ms
        target = " (target > 1)" + (": holds" if ratio > 1 else ": MISSED") if r.mode == "training" else ""
        out.append(f"ours vs upstream: {ratio:.2f}x{target}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=300)
    ap.add_argument("--mode", choices=["inference", "training"], default="inference")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    r = bench_pipeline(
        "sample:recsys_towers32",
        repeats=a.repeats,
        mode=a.mode,
        compile=a.compile,
        against_upstream=True,
        final_only=True,
        threads=a.threads,
        device="cpu",
    )
    print(
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, {r.threads} thread(s), "
        f"{r.mode}, {r.method}, {a.repeats} interleaved rounds"
    )
    print("\n".join(table(r)))
    print("\n".join(verdicts(r)))
    warn = r.noise_warning()
    if warn:
        print(warn)
    if a.json:
        Path(a.json).write_text(json.dumps(r.to_json(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
