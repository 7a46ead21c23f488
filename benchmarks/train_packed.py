"""Training with packed parameters (``optimus_lens.transform``): a long run side by side, and timings.

Three parts, each measured in one process:

* ``--equivalence STEPS`` (default 200): each sample model trained for STEPS steps twice
  on the same batches, eager (or, ``--oracle unpacked``, ``transform(pack=False)``: the
  same fused graph stacking per call) and transformed with packed parameters, in
  float64 (``--float32``): SGD with
  momentum, Nesterov and weight decay for the first half, AdamW for the second, every
  step ``zero_grad(set_to_none=True)``, forward, backward, ``clip_grad_norm_(1.0)``,
  step; prints the largest difference of loss, parameters and optimizer state over the
  run (the suite's ``tests/test_train_equivalence.py`` does the same for a few steps);
* ``--bench ROUNDS`` (default 0: off): ``optimus bench`` in inference and in training for
  each sample, every stage round-robin: captured graph, our pipeline, ours + pre-packed
  weights (inference) or packed parameters (training), upstream's passes, the hand-fused
  bound where the sample has one; a Markdown table of speedups against the captured graph;
* ``--step-timing ROUNDS`` (default 0: off): one full training step, ``zero_grad`` +
  forward + backward (+ ``optimizer.step()``, SGD with momentum), round-robin, for the eager
  model, ``transform(pack=False)`` (the fused graph stacking weights per call), the packed
  module in both layouts, and the hand-fused module made trainable (its stacked buffers
  as parameters). Unlike ``optimus bench``, which times the graph with
  ``torch.autograd.grad``, this includes what a training loop pays per parameter object
  (the ``.grad`` views of the packed gradient, ``zero_grad`` and the optimizer over every
  parameter: 194 on recsys_towers32, 8 on its hand-fused module), and the packed module
  once more with its optimizer over ``packed_parameters()`` (one tensor per pack: 10).

torch at one thread (``--threads``), thread CPU time as the clock, median and p10..p90::

    .venv/bin/python benchmarks/train_packed.py --equivalence 200
    .venv/bin/python benchmarks/train_packed.py --equivalence 0 --bench 60 --samples recsys_towers32,mmoe,twin_towers
    .venv/bin/python benchmarks/train_packed.py --equivalence 0 --step-timing 40 --samples recsys_towers32
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import optimus_lens  # noqa: E402
from optimus_lens.frontend.run import load_model  # noqa: E402
from optimus_lens.perf.bench import bench_pipeline  # noqa: E402


def _batch(inputs, step: int):
    g = torch.Generator().manual_seed(step)
    return tuple(
        torch.randn(x.shape, generator=g, dtype=x.dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
        for x in inputs
    )


def _loss(out) -> torch.Tensor:
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return sum((o.float() ** 2).mean() for o in outs if isinstance(o, torch.Tensor) and o.is_floating_point())


def equivalence(name: str, steps: int, dtype: torch.dtype, oracle: str = "eager", layout: str = "fused") -> str:
    model, inputs, _ = load_model(f"sample:{name}")
    model = model.to(dtype)
    inputs = tuple(x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs)
    eager = copy.deepcopy(model).train()
    if oracle == "unpacked":  # the same fused graph, stacking per call: isolates what packing changes
        eager = optimus_lens.transform(eager, inputs, pack=False)
    t0 = time.perf_counter()
    t = optimus_lens.transform(model, inputs, layout=layout)
    setup = time.perf_counter() - t0
    worst = {"loss": 0.0, "param": 0.0, "grad": 0.0, "state": 0.0}
    half = steps // 2
    opts = None
    for step in range(steps):
        if step in (0, half):
            if step == 0:
                make = lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9, nesterov=True, weight_decay=1e-3)  # noqa: E731
            else:
                make = lambda ps: torch.optim.AdamW(ps, lr=1e-4, weight_decay=0.01)  # noqa: E731
            opts = (make(eager.parameters()), make(t.parameters()))
        xs = _batch(inputs, step)
        losses = []
        for m, o in zip((eager, t), opts):
            o.zero_grad(set_to_none=True)
            torch.manual_seed(step)
            loss = _loss(m(*xs))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            o.step()
            losses.append(loss.item())
        worst["loss"] = max(worst["loss"], abs(losses[0] - losses[1]) / max(abs(losses[0]), 1e-30))
        for pa, pb in zip(eager.parameters(), t.parameters()):
            worst["param"] = max(worst["param"], (pa - pb).abs().max().item())
            if pa.grad is not None:
                worst["grad"] = max(worst["grad"], (pa.grad - pb.grad).abs().max().item())
            for k, v in opts[0].state[pa].items():
                if isinstance(v, torch.Tensor) and v.dim():
                    worst["state"] = max(worst["state"], (v - opts[1].state[pb][k]).abs().max().item())
    nparams = sum(1 for _ in t.parameters())
    packed = sum(len(g.params) for g in t.groups)
    return (
        f"| {name} | {oracle} | {layout} | {str(dtype).removeprefix('torch.')} | {steps} | {len(t.groups)} groups, {packed} of {nparams} "
        f"parameters | {worst['loss']:.1e} | {worst['param']:.1e} | {worst['grad']:.1e} | {worst['state']:.1e} | "
        f"{setup:.1f} | {'; '.join(t.events) or '-'} |"
    )


def bench(name: str, rounds: int, threads: int) -> list[str]:
    rows = []
    for mode in ("inference", "training"):
        r = bench_pipeline(
            f"sample:{name}",
            repeats=rounds,
            mode=mode,
            against_upstream=True,
            final_only=True,
            threads=threads,
            device="cpu",
        )

        def cell(stage: str, r=r) -> str:
            s = r.stage(stage)
            return (
                "-"
                if s is None
                else f"{s.speedup:.2f}x ({r.stage('baseline').median_ms / s.p90_ms:.2f}..{r.stage('baseline').median_ms / s.p10_ms:.2f})"
            )

        packing = "prepack_weights" if mode == "inference" else "packed"
        ours, ref = r.ours, r.stage("reference")
        vs_ref = "-" if ref is None else f"{ref.median_ms / ours.median_ms:.2f}x"
        up = r.stage("upstream")
        rows.append(
            f"| {name} | {mode} | {r.stage('baseline').median_ms * 1e3:.0f} | {cell('pipeline')} | {cell(packing)} | "
            f"{cell('upstream')} | {cell('reference')} | {vs_ref} | {up.median_ms / ours.median_ms:.2f}x |"
        )
    return rows


def _trainable_reference(model):
    make = getattr(model, "optimus_reference", None)
    if not callable(make):
        return None
    ref = make()
    for full, b in list(ref.named_buffers()):
        if not b.is_floating_point():
            continue
        owner_name, _, leaf = full.rpartition(".")
        owner = ref.get_submodule(owner_name) if owner_name else ref
        delattr(owner, leaf)
        owner.register_parameter(leaf, torch.nn.Parameter(b.detach().clone()))
    return ref.train()


def step_timing(name: str, rounds: int) -> list[str]:
    model, inputs, _ = load_model(f"sample:{name}")
    model.train()
    packed = optimus_lens.transform(copy.deepcopy(model), inputs)
    variants = {
        "eager model": model,
        "transform(pack=False): stacks per call": optimus_lens.transform(copy.deepcopy(model), inputs, pack=False),
        "transform: packed, layout fused": packed,
        "transform: packed, layout members": optimus_lens.transform(copy.deepcopy(model), inputs, layout="members"),
        "transform: packed, optimizer over packed_parameters()": packed,
    }
    ref = _trainable_reference(model)
    if ref is not None:
        variants["hand-fused, made trainable"] = ref
    rows = []
    for with_step in (False, True):
        calls = {}
        for label, m in variants.items():
            params = m.packed_parameters() if "packed_parameters" in label else m.parameters()
            opt = torch.optim.SGD(params, lr=1e-4, momentum=0.9)

            def call(m=m, opt=opt, with_step=with_step):
                opt.zero_grad(set_to_none=True)
                _loss(m(*inputs)).backward()
                if with_step:
                    opt.step()

            calls[label] = call
        samples: dict[str, list[float]] = {k: [] for k in calls}
        for c in calls.values():
            for _ in range(5):
                c()
        for r in range(rounds):
            order = list(calls.items())
            k = r % len(order)
            for label, c in order[k:] + order[:k]:
                t0 = time.thread_time()
                for _ in range(5):
                    c()
                samples[label].append((time.thread_time() - t0) / 5 * 1e6)
        base = statistics.median(samples["eager model"])
        hand = statistics.median(samples["hand-fused, made trainable"]) if ref is not None else None
        what = "zero_grad + forward + backward + SGD step" if with_step else "zero_grad + forward + backward"
        for label, v in samples.items():
            med = statistics.median(v)
            p10, p90 = sorted(v)[len(v) // 10], sorted(v)[(9 * len(v)) // 10]
            vs_hand = f"{hand / med:.2f}x" if hand else "-"
            m = variants[label]
            nparams = sum(1 for _ in (m.packed_parameters() if "packed_parameters" in label else m.parameters()))
            rows.append(
                f"| {name} | {what} | {label} | {nparams} | {med:.0f} ({p10:.0f}..{p90:.0f}) | {base / med:.2f}x | {vs_hand} |"
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", default="recsys_towers32,mmoe,twin_towers,deepfm")
    ap.add_argument("--equivalence", type=int, default=200, help="steps of the side-by-side run (0: off)")
    ap.add_argument("--float32", action="store_true", help="the side-by-side run in float32 instead of float64")
    ap.add_argument(
        "--oracle",
        choices=["eager", "unpacked"],
        default="eager",
        help="what the packed module is trained beside: the eager model, or transform(pack=False)",
    )
    ap.add_argument("--layout", choices=["fused", "members"], default="fused", help="the packs' layout")
    ap.add_argument("--bench", type=int, default=0, help="rounds of optimus bench per mode (0: off)")
    ap.add_argument("--step-timing", type=int, default=0, help="rounds of full training steps (0: off)")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    warnings.simplefilter("ignore")
    names = [n.strip() for n in a.samples.split(",") if n.strip()]
    print(f"torch {torch.__version__}, {a.threads} thread(s)")
    if a.equivalence:
        print(
            "\n| model | beside | layout | dtype | steps | packed | max rel. loss diff | max param diff | max grad diff | "
            "max optimizer-state diff | transform s | run-time events |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
        )
        dtype = torch.float32 if a.float32 else torch.float64
        for n in names:
            print(equivalence(n, a.equivalence, dtype, a.oracle, a.layout), flush=True)
    if a.bench:
        print(
            "\n| model | mode | captured µs | ours (passes) | ours + packing | upstream | hand-fused | "
            "ours + packing vs hand-fused | vs upstream |\n|---|---|---|---|---|---|---|---|---|"
        )
        for n in names:
            print("\n".join(bench(n, a.bench, a.threads)), flush=True)
    if a.step_timing:
        print(
            "\n| model | timed | module | parameters | µs, median (p10..p90) | vs eager | vs hand-fused |"
            "\n|---|---|---|---|---|---|---|"
        )
        for n in names:
            print("\n".join(step_timing(n, a.step_timing)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
