"""An eager oracle that does not use the product's own verification (a helper of the fuzz
test and of ``benchmarks/fuzz.py``; the approach of ``/work/shared/tools/eager_oracle.py``).

For one model factory: the model run eagerly on fresh inputs, against the same model under
a plain Dynamo backend that rewrites each graph (``rewrite(gm, example_inputs)``, the
product's pipeline with verification off) and runs it as it is, on an identical fresh
copy (the factory is deterministic: same weights, same inputs, the same aliasing among
inputs). Compared, with numbers computed here and nowhere else:

* the outputs: count, dtypes, shapes, values (per-dtype tolerances, no tighter than that of
  the least precise floating dtype among the parameters, buffers and inputs);
* which outputs overlap an input's or another output's memory (byte ranges per storage);
* the inputs' values after the call (in-place writes);
* with ``grads``: the gradients of the parameters and of the floating-point inputs after
  ``backward`` of the outputs' sum; a gradient that is None on one side must be all
  zeros on the other (a fused branch that is stop-gradient in eager may get a zero
  gradient instead of none: the same values).
"""

from __future__ import annotations

import torch

#: (rtol, atol) per dtype
TOL = {
    torch.float64: (1e-7, 1e-9),
    torch.float32: (1e-4, 1e-5),
    torch.bfloat16: (5e-2, 1e-2),
    torch.float16: (1e-2, 1e-3),
}


def flat(x) -> list:
    """The tensors of a (nested) output, in order."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in flat(v)]
    if isinstance(x, dict):
        return [t for k in sorted(x) for t in flat(x[k])]
    return []


def _span(t: torch.Tensor) -> tuple[int, int, int]:
    if t.numel() == 0:
        return (t.untyped_storage().data_ptr(), 0, 0)
    lo = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if s < 0)
    hi = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if s > 0) + 1
    return (t.untyped_storage().data_ptr(), lo * t.element_size(), hi * t.element_size())


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    (sa, la, ha), (sb, lb, hb) = _span(a), _span(b)
    return sa == sb and la < hb and lb < ha


def aliasing(outs: list, ins: list) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """For each output: the inputs and the other outputs whose memory it overlaps."""
    return [
        (
            tuple(j for j, t in enumerate(ins) if _overlap(o, t)),
            tuple(j for j, t in enumerate(outs) if j != i and _overlap(o, t)),
        )
        for i, o in enumerate(outs)
    ]


def close(a: torch.Tensor, b: torch.Tensor, floor: torch.dtype | None = None) -> str | None:
    """Why ``b`` (rewritten) is not ``a`` (eager), or None. Floating values are compared
    with the tolerance of their dtype, or of ``floor`` when that is looser: a value
    computed in float32 and cast to float64 carries float32's rounding (a batched kernel
    may round it otherwise), so it is held to float32's tolerance."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"{tuple(b.shape)} {b.dtype} instead of {tuple(a.shape)} {a.dtype}"
    if a.is_floating_point():
        rtol, atol = TOL.get(a.dtype, (1e-4, 1e-5))
        if floor is not None and floor in TOL:
            rtol, atol = max(rtol, TOL[floor][0]), max(atol, TOL[floor][1])
        if not torch.allclose(a.double(), b.double(), rtol=rtol, atol=atol, equal_nan=True):
            return f"max abs diff {(a.double() - b.double()).abs().max().item():.3g}"
        return None
    return None if torch.equal(a, b) else "values differ"


def run(factory, backend=None, grads: bool = False):
    """(outputs, aliasing, inputs after the call, gradients) of one fresh model and inputs,
    eagerly (``backend`` None) or under ``torch.compile(backend=backend)``."""
    torch.manual_seed(0)
    model, ins = factory()
    ins = tuple(ins)
    torch._dynamo.reset()
    fn = model if backend is None else torch.compile(model, backend=backend)
    if grads:
        ins = tuple(t.requires_grad_() if t.is_leaf and t.is_floating_point() else t for t in ins)
        out = flat(fn(*ins))
        loss = sum(o.float().sum() for o in out if o.requires_grad)
        if isinstance(loss, torch.Tensor):
            loss.backward()
        g = [p.grad for p in model.parameters()] + [t.grad if t.is_leaf else None for t in ins]
    else:
        with torch.no_grad():
            out = flat(fn(*ins))
        g = []
    torch._dynamo.reset()
    return out, aliasing(out, list(ins)), [t.detach().clone() for t in ins], g


def least_precise(model, ins) -> torch.dtype | None:
    """The floating dtype of the model's parameters, buffers and inputs with the loosest
    tolerance (None: none is floating)."""
    seen = [t.dtype for t in (*model.parameters(), *model.buffers(), *ins) if t.is_floating_point()]
    return max(seen, key=lambda d: TOL.get(d, (0.0, 0.0)), default=None)


def differs(factory, rewrite, grads: bool = False) -> tuple[str | None, int]:
    """(what differs between eager and the rewritten program, or None; steps the
    rewrite made). ``rewrite(gm, example_inputs)`` rewrites ``gm`` in place and returns
    its number of steps. A rewritten program that raises differs."""
    steps: list[int] = []

    def backend(gm, example_inputs):
        steps.append(rewrite(gm, tuple(example_inputs)))
        return gm.forward

    model, ins = factory()
    floor = least_precise(model, ins)
    eo, ea, ei, eg = run(factory, None, grads)
    try:
        oo, oa, oi, og = run(factory, backend, grads)
    except Exception as e:  # noqa: BLE001 - a crash of the rewritten program is a difference
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        return f"the rewritten program raised {type(e).__name__}: {first}", sum(steps)
    if not steps:  # the oracle would compare eager with eager
        return "Dynamo compiled no graph: nothing was rewritten", 0
    return _compare(eo, ea, ei, eg, oo, oa, oi, og, floor), sum(steps)


def _compare(eo, ea, ei, eg, oo, oa, oi, og, floor=None) -> str | None:
    if len(eo) != len(oo):
        return f"{len(oo)} outputs instead of {len(eo)}"
    for i, (a, b) in enumerate(zip(eo, oo)):
        why = close(a.detach(), b.detach(), floor)
        if why:
            return f"output {i}: {why}"
    if ea != oa:
        return f"output aliasing differs: eager {ea}, rewritten {oa}"
    for i, (a, b) in enumerate(zip(ei, oi)):
        why = close(a, b, floor)
        if why:
            return f"input {i} after the call: {why}"
    for i, (a, b) in enumerate(zip(eg, og)):
        if a is None and b is None:
            continue
        a = torch.zeros_like(b) if a is None else a
        b = torch.zeros_like(a) if b is None else b
        why = close(a, b, floor)
        if why:
            return f"gradient {i}: {why}"
    return None
