"""A training run's rewritten graphs against eager PyTorch (benchmarks/RESULTS.md, "Training
per pass": "Against eager PyTorch").

For each model: ``optimize(MODEL, stage=STAGE, mode="training")`` (what ``optimus run
--stage all --mode training`` runs: our pre-grad passes, then our post-grad passes on the
ATen forward and backward graphs of what they left), then, independently of our verifier,

1. the rewritten forward graph on its primals (the model's parameters and inputs): its user
   outputs against the eager model's outputs, and its saved activations;
2. the rewritten backward graph on *those* saved activations and the recorded tangents: its
   gradients against ``torch.autograd.grad`` of the eager model for the same tangents, for
   every input that needs a gradient (the parameters).

So the two rewritten graphs are checked as one program, end to end: a forward that saves
something else than its original backward expects shows up here. Prints, per model, the
steps per graph and the largest absolute difference of the outputs and of the gradients;
exits 1 when one is off (``torch.testing.assert_close`` tolerances for the dtype).

    .venv/bin/python benchmarks/post_grad_eager_check.py
    .venv/bin/python benchmarks/post_grad_eager_check.py --models sample:mmoe --stage post-grad
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from optimus_lens.frontend.aten_capture import capture_aten
from optimus_lens.frontend.run import load_model, optimize

MODELS = ["sample:recsys_towers32", "sample:mmoe", "hf:llama"]


def _against_eager(fw, bw, user_ref: list, grad_ref: list, wanted: list[int]) -> tuple[float, float, bool]:
    """Run forward graph ``fw`` on its primals and backward graph ``bw`` on the activations
    that forward saved and ``bw``'s recorded tangents; (max |diff| of the user outputs, of
    the gradients, whether every one passes ``torch.testing.assert_close``)."""
    n_tangents = sum(1 for n in bw.gm.graph.nodes if n.op == "placeholder" and n.name.startswith("tangents"))
    n_saved = len(bw.example_inputs) - n_tangents
    with torch.no_grad():
        fouts = list(fw.gm(*fw.example_inputs))
        user, saved = fouts[: len(fouts) - n_saved], fouts[len(fouts) - n_saved :]
        grads = list(bw.gm(*saved, *bw.example_inputs[n_saved:]))
    close, out_err, grad_err = True, 0.0, 0.0
    for got, want in [
        *zip(user, user_ref, strict=True),
        *((grads[i], e) for i, e in zip(wanted, grad_ref, strict=True)),
    ]:
        if want is None:
            continue
        err = (got.float() - want.float()).abs().max().item()
        if any(got is g for g in grads):
            grad_err = max(grad_err, err)
        else:
            out_err = max(out_err, err)
        try:
            torch.testing.assert_close(got, want)
        except AssertionError:
            close = False
    return out_err, grad_err, close


def check(spec: str, stage: str) -> tuple[bool, str]:
    """Run ``spec`` through ``optimize(stage=stage, mode="training")`` and compare its
    rewritten forward + backward graphs with eager PyTorch, beside the same comparison of
    the ATen graphs before the post-grad passes (AOTAutograd's decompositions alone move
    some values: a rewrite is off when it is not within tolerance and moves them more than
    twice as far); (ok, one line of figures)."""
    model, inputs, _ = load_model(spec)
    model.train()
    t0 = time.perf_counter()
    res = optimize(model, inputs, stage=stage, mode="training", verify="off")
    seconds = time.perf_counter() - t0
    primals = res.captured.example_inputs
    before = capture_aten(res.engine.gm, primals, "training")  # what the post-grad passes started from
    out = model(*inputs)
    leaves = [o.detach() for o in torch.utils._pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
    wanted = [i for i, p in enumerate(primals) if isinstance(p, torch.Tensor) and p.requires_grad]
    diff = [o for o in torch.utils._pytree.tree_leaves(out) if isinstance(o, torch.Tensor) and o.requires_grad]
    tangents = list(before.graph("backward").example_inputs)[-len(diff) :]
    expected = list(torch.autograd.grad(diff, [primals[i] for i in wanted], tangents, allow_unused=True))
    b_out, b_grad, b_close = _against_eager(before.graph("forward"), before.graph("backward"), leaves, expected, wanted)
    cap = res.post_grad.capture
    r_out, r_grad, r_close = _against_eager(cap.graph("forward"), cap.graph("backward"), leaves, expected, wanted)
    ok = r_close or (r_out <= 2 * b_out + 1e-7 and r_grad <= 2 * b_grad + 1e-7)
    steps = ", ".join(f"{t.graph} {len(t.steps)}" for t in res.trace.traces())
    line = (
        f"{spec}: steps {steps}; {len(leaves)} output(s), {len(wanted)} gradients; max |diff| vs eager: "
        f"outputs {r_out:.1e} (before the post-grad passes {b_out:.1e}), gradients {r_grad:.1e} "
        f"(before {b_grad:.1e}){'' if r_close else ' [not within assert_close' + (']' if b_close else ', nor before]')}; {seconds:.1f} s -> {'ok' if ok else 'OFF'}"
    )
    return ok, line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--stage", choices=["all", "post-grad"], default="all")
    a = ap.parse_args()
    torch.set_num_threads(1)
    bad = 0
    for spec in a.models.split(","):
        ok, line = check(spec, a.stage)
        print(line, flush=True)
        bad += not ok
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
