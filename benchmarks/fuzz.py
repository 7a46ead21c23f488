"""Long fuzz run: random models through the whole pipeline, checked against eager.

    .venv/bin/python benchmarks/fuzz.py --examples 2000 --seed 0                  # eager oracle, every hazard
    .venv/bin/python benchmarks/fuzz.py --per-class 60 --shrink                   # each class alone, minimal cases
    .venv/bin/python benchmarks/fuzz.py --hazards none,grad_region --examples 200
    .venv/bin/python benchmarks/fuzz.py --check verify --examples 2000            # the product's per-step verification

``--check oracle`` (default): each model runs eagerly and, on an identical fresh copy,
under a plain Dynamo backend that runs the default pipeline with verification off
(``tests/oracle.py``: values, dtypes, output overlap, input writes, gradients for float32
models that write no input); nothing of the product's own verification is used.
``--check verify``: every step verified by the product (``optimize(verify="step")``).

Models come from ``sample_models/random_models.py``, with the hazard classes of
``sample_models/hazards.py`` (``--hazards`` picks them; ``none`` is the plain models).
``--per-class N`` runs N models of each class alone (plus N plain ones) and prints one
row per class; ``--shrink`` reduces the first failure of each class to a minimal spec.
Prints the models tried, the steps applied per pattern, every failure with the spec to
reproduce it (``build(RandomSpec(...))``), and the seconds taken. Exit status 1 if
anything failed.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the oracle lives with the tests

from oracle import differs  # noqa: E402

from optimus_lens import RunOptions, run_pipeline  # noqa: E402
from optimus_lens.frontend.run import optimize  # noqa: E402
from optimus_lens.sample_models.random_models import (  # noqa: E402
    HAZARDS,
    RandomSpec,
    build,
    dtype_supported,
    random_spec,
)

PATTERNS: collections.Counter = collections.Counter()


def rewrite(gm, example_inputs) -> int:
    """The default pipeline over one Dynamo graph, unverified (as inside torch.compile)."""
    trace = run_pipeline(gm, example_inputs, None, RunOptions(verify="off"))
    PATTERNS.update(s.pattern for s in trace.steps)
    return len(trace.steps)


def check_oracle(spec: RandomSpec) -> tuple[str | None, int]:
    """What differs from eager for ``spec`` (None: nothing) and the steps applied."""
    return differs(lambda: build(spec), rewrite, spec.grads)


def check_verify(spec: RandomSpec) -> tuple[str | None, int]:
    """The product's own per-step verification of ``spec``: the first failing step, or None."""
    model, inputs = build(spec)
    trace = optimize(model, inputs, verify="step", grads=spec.grads, dynamic=spec.dynamic).trace
    PATTERNS.update(s.pattern for s in trace.steps)
    bad = trace.failed_steps()
    if bad:
        s = bad[0]
        why = (s.error and f"rolled back: {s.error}") or (s.verify and s.verify.message)
        return f"step {s.index} {s.pattern}: {why}", len(trace.steps)
    if trace.final_verify is not None and trace.final_verify.ok is False:
        return f"final: {trace.final_verify.message}", len(trace.steps)
    return None, len(trace.steps)


def draw(rng: random.Random, dtypes: list[str], classes: tuple[str, ...], forced: str | None = None) -> RandomSpec:
    """A spec of the given hazard classes; with ``forced``, that one class always."""
    hazard = forced if forced and forced != "none" else None
    dtype = rng.choice(dtypes)
    if hazard == "autocast_region":
        dtype = "float32"  # a bfloat16 region changes nothing in a bfloat16 model
    if hazard == "zero_dim" and "bfloat16" in dtypes:
        dtype = rng.choice(["bfloat16", "float32"] if "float16" not in dtypes else ["bfloat16", "float16"])
    spec = random_spec(rng, dtype, classes if forced is None else ())
    if hazard:
        spec.hazards, spec.hazard_at, spec.flavour = [hazard], rng.randint(1, len(spec.widths) - 1), rng.randint(0, 1)
        spec.dynamic = False
    return spec


def kind(msg: str | None) -> str:
    """The class of a failure message: ``values``, ``dtype/shape``, ``output aliasing``,
    ``input writes``, ``gradients``, ``raised``, ``no graph``, ``step failed`` (``--check
    verify``), or ``ok``."""
    if msg is None:
        return "ok"
    for prefix, name in (
        ("output aliasing", "output aliasing"),
        ("input ", "input writes"),
        ("gradient", "gradients"),
        ("the rewritten program raised", "raised"),
        ("Dynamo compiled no graph", "no graph"),
        ("step ", "step failed"),
        ("final:", "step failed"),
    ):
        if msg.startswith(prefix):
            return name
    if msg.startswith("output") and "max abs diff" in msg:
        return "values"
    if msg.startswith("output") or "outputs instead of" in msg:
        return "dtype/shape"
    return "raised"


def shrink(spec: RandomSpec, check) -> tuple[RandomSpec, bool]:
    """A smaller spec that still fails ``check`` the same way (:func:`kind`): greedy,
    fewer branches, shorter chains, plain join, layout and consumer, batch 1, each
    candidate kept when it still fails so. When the failure needs the spec's hazards (the
    spec without them passes), so must every candidate. Returns the spec and whether its
    failure needs the hazards."""
    want = kind(check(spec)[0])

    def verdict(s: RandomSpec) -> str:
        try:
            return kind(check(s)[0])
        except Exception:  # noqa: BLE001 - a spec the generator cannot build is not smaller
            return "unbuildable"

    def plain(s: RandomSpec) -> RandomSpec:
        return dataclasses.replace(s, hazards=[])

    needs = bool(spec.hazards) and verdict(plain(spec)) == "ok"
    best = spec
    changed = True
    while changed:
        changed = False
        cands = []
        n = len(best.widths)
        if n > 2:
            for drop in range(n):
                if drop == best.hazard_at:
                    continue
                at = best.hazard_at - (drop < best.hazard_at)
                cands.append(
                    dataclasses.replace(
                        best,
                        widths=best.widths[:drop] + best.widths[drop + 1 :],
                        chains=best.chains[:drop] + best.chains[drop + 1 :],
                        hazard_at=max(1, min(at, n - 2)),
                    )
                )
        for i, chain in enumerate(best.chains):
            if len(chain) > 1:
                for j in range(len(chain)):
                    chains = [list(c) for c in best.chains]
                    del chains[i][j]
                    cands.append(dataclasses.replace(best, chains=chains))
        for field, simple in (("join", "cat"), ("input_layout", "contiguous"), ("consumer", "none"), ("batch", 1)):
            if getattr(best, field) != simple:
                cands.append(dataclasses.replace(best, **{field: simple}))
        for c in cands:
            if verdict(c) == want and (not needs or verdict(plain(c)) == "ok"):
                best, changed = c, True
                break
    return best, needs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=2000)
    ap.add_argument("--per-class", type=int, default=None, help="N models of each hazard class alone (and N plain)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", choices=["oracle", "verify"], default="oracle")
    ap.add_argument(
        "--hazards", default="all", help=f"comma-separated classes, 'none' for plain models (default: all: {HAZARDS})"
    )
    ap.add_argument("--shrink", action="store_true", help="reduce the first failure of each class to a minimal spec")
    ap.add_argument("--max-failures", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=None, help="stop drawing models after this many seconds")
    a = ap.parse_args()
    chosen = HAZARDS if a.hazards == "all" else tuple(h for h in a.hazards.split(",") if h != "none")
    unknown = set(chosen) - set(HAZARDS)
    if unknown:
        ap.error(f"unknown hazard classes {sorted(unknown)}; classes: {', '.join(HAZARDS)}")
    check = check_oracle if a.check == "oracle" else check_verify
    rng = random.Random(a.seed)
    dtypes = [d for d in ("float32", "bfloat16", "float16") if dtype_supported(d)]
    if a.per_class:
        plan = [(c, a.per_class) for c in ("none", *chosen)]
    else:
        plan = [(None, a.examples)]
    rows = []
    failures: list[tuple[str, RandomSpec, str]] = []
    t0 = time.perf_counter()
    total = 0
    for cls, n in plan:
        c_fail, c_steps, c_t0, tried = 0, 0, time.perf_counter(), 0
        first: list = []
        for _ in range(n):
            spec = draw(rng, dtypes, chosen, cls)
            try:
                why, steps = check(spec)
            except Exception as e:  # noqa: BLE001 - every exception is a finding
                why, steps = f"{type(e).__name__}: {e}", 0
            tried += 1
            total += 1
            c_steps += steps
            if why:
                c_fail += 1
                failures.append((cls or ",".join(spec.hazards) or "none", spec, why))
                if len(first) < 5:
                    first.append(spec)
            if total % 100 == 0:
                print(f"{total} models, {len(failures)} failures, {time.perf_counter() - t0:.0f} s", flush=True)
            if len(failures) >= a.max_failures or (a.seconds is not None and time.perf_counter() - t0 > a.seconds):
                break
        kinds = collections.Counter(kind(m) for c, _, m in failures if c == (cls or c))
        rows.append((cls or "mixed", tried, c_steps, c_fail, time.perf_counter() - c_t0, first, kinds))
        if len(failures) >= a.max_failures or (a.seconds is not None and time.perf_counter() - t0 > a.seconds):
            break
    print(
        f"\nmodels tried: {total} (seed {a.seed}, check {a.check}, dtypes {', '.join(dtypes)}) "
        f"in {time.perf_counter() - t0:.0f} s"
    )
    print(f"steps applied: {sum(PATTERNS.values())}")
    for name, k in PATTERNS.most_common():
        print(f"  {name:36s} {k}")
    print("\n| class | models | steps | failures | of which | s |\n|---|---|---|---|---|---|")
    for cls, tried, steps, bad, secs, _, kinds in rows:
        what = ", ".join(f"{k} {v}" for k, v in kinds.most_common()) or "-"
        print(f"| {cls} | {tried} | {steps} | {bad} | {what} | {secs:.0f} |")
    print(f"\nfailures: {len(failures)}")
    for cls, spec, msg in failures[:50]:
        print(f"  [{cls}] {msg}\n    {spec}")
    if a.shrink:
        print("\nminimal failing specs, one per class:")
        for cls, _, _, _, _, first, _ in rows:
            if not first:
                continue
            # a failure that needs the class's hazard, when one of the first five does
            pick = next(
                (f for f in first if f.hazards and check(dataclasses.replace(f, hazards=[]))[0] is None), first[0]
            )
            small, needs = shrink(pick, check)
            note = "fails only with the hazard" if needs else "fails without the hazard too"
            print(f"  [{cls}] ({note}) {check(small)[0]}\n    {small}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
