"""Long fuzz run: thousands of random models through the whole pipeline, every step verified.

    .venv/bin/python benchmarks/fuzz.py --examples 2000 --seed 0

Prints how many models were tried, how many steps each pattern applied, and every
failure (a step whose outputs, output strides or gradients differ from eager, a step
rolled back because its pattern raised or left the graph invalid, an exception) with
the spec to reproduce it (sample_models.random_models.build(RandomSpec(...))). Models
include transposed and sliced inputs, view / as_strided consumers of fused and cleaned-up
values, and dynamic-shape captures (see sample_models/random_models.py).
Exit status 1 if anything failed.
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
import time

from optimus_lens.frontend.run import optimize
from optimus_lens.sample_models.random_models import build, dtype_supported, random_spec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-failures", type=int, default=20)
    ap.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="stop drawing models after this many seconds (the summary is still printed)",
    )
    a = ap.parse_args()
    rng = random.Random(a.seed)
    dtypes = [d for d in ("float32", "bfloat16", "float16") if dtype_supported(d)]
    per_pattern: collections.Counter = collections.Counter()
    failures = []
    t0 = time.perf_counter()
    for i in range(a.examples):
        spec = random_spec(rng, rng.choice(dtypes))
        model, inputs = build(spec)
        try:
            trace = optimize(model, inputs, verify="step", grads=spec.dtype == "float32", dynamic=spec.dynamic).trace
        except Exception as e:  # noqa: BLE001 - every exception is a finding
            failures.append((spec, f"{type(e).__name__}: {e}"))
        else:
            per_pattern.update(s.pattern for s in trace.steps)
            bad = trace.failed_steps()
            if bad or not trace.final_verify.ok:
                s = bad[0] if bad else None
                why = (s.error and f"rolled back: {s.error}") or (s.verify and s.verify.message) if s else ""
                failures.append(
                    (spec, f"step {s.index} {s.pattern}: {why}" if s else f"final: {trace.final_verify.message}")
                )
        if (i + 1) % 100 == 0:
            print(
                f"{i + 1} models, {sum(per_pattern.values())} steps, {len(failures)} failures, "
                f"{time.perf_counter() - t0:.0f} s",
                flush=True,
            )
        if len(failures) >= a.max_failures:
            break
        if a.seconds is not None and time.perf_counter() - t0 > a.seconds:
            break
    print(f"\nmodels tried: {i + 1} (seed {a.seed}, dtypes {', '.join(dtypes)}) in {time.perf_counter() - t0:.0f} s")
    print(f"steps applied: {sum(per_pattern.values())}")
    for name, n in per_pattern.most_common():
        print(f"  {name:36s} {n}")
    print(f"failures: {len(failures)}")
    for spec, msg in failures:
        print(f"  {msg}\n    {spec}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
