"""Numeric and structural equivalence checks of a rewritten graph against the original.

Every run is seeded (``torch.manual_seed(SEED)`` before each execution), so random ops
such as dropout in training mode draw the same numbers in the original and the
rewritten graph when the rewrite keeps their order; where it cannot (a batched dropout
draws one mask for the whole stack), the result says "not-checkable" instead of
reporting a false failure.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.fx import GraphModule, Interpreter
from torch.utils._pytree import tree_leaves

from optimus.trace import VerifyResult

SEED = 0

# (rtol, atol) per dtype. fp32 allows for a batched matmul summing in another order.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-9),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (5e-2, 1e-2),
}


def run_graph(gm: GraphModule, inputs: tuple, grads: bool = False):
    """Execute ``gm`` node by node (``torch.fx.Interpreter``: no recompile needed) with
    the seed fixed. With ``grads``, also returns d(sum of outputs * fixed weights)/d(input)
    for every floating-point input that requires grad (parameters are placeholders of the
    captured graph, so weight gradients are included). Returns (outputs, grads list)."""
    torch.manual_seed(SEED)
    if not grads:
        with torch.no_grad():
            return tree_leaves(Interpreter(gm).run(*inputs)), []
    leaves = [x.detach().requires_grad_(True) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
              for x in inputs]
    outs = tree_leaves(Interpreter(gm).run(*leaves))
    gen = torch.Generator().manual_seed(SEED + 1)
    loss = sum((o.float() * torch.rand(o.shape, generator=gen)).sum()
               for o in outs if isinstance(o, torch.Tensor) and o.is_floating_point() and o.requires_grad)
    wrt = [x for x in leaves if isinstance(x, torch.Tensor) and x.requires_grad]
    if isinstance(loss, int) or not wrt:
        return [o.detach() if isinstance(o, torch.Tensor) else o for o in outs], []
    gs = torch.autograd.grad(loss, wrt, allow_unused=True)
    return [o.detach() for o in outs], [g for g in gs]


@dataclass
class Reference:
    """The original graph's outputs (and gradients) on the example inputs, computed once."""

    outputs: list
    grads: list
    deterministic: bool


def reference(gm: GraphModule, inputs: tuple, grads: bool = False) -> Reference:
    """Run the original graph twice with the same seed; ``deterministic`` is False when
    the two runs differ (e.g. an unseeded random op), in which case nothing can be compared."""
    a, ga = run_graph(gm, inputs, grads)
    b, _ = run_graph(gm, inputs, False)
    same = len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return Reference(a, ga, same)


def _equal(x, y) -> bool:
    """Bitwise equality of two run results, NaN equal to NaN (a 0/0 in the model is
    still deterministic)."""
    if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        if x.is_floating_point() or x.is_complex():
            return bool(((x == y) | (torch.isnan(x) & torch.isnan(y))).all())
        return torch.equal(x, y)
    return x == y


def compare(expected: list, actual: list, what: str = "output") -> VerifyResult:
    """Compare two flat lists of values with dtype-aware tolerances (``TOLERANCES``):
    element-wise ``|a - e| <= atol + rtol * |e|``. Shapes and dtypes must match exactly.

    For gradients, a missing gradient (None: the input does not reach the loss) equals an
    all-zero one: a fusion may route a detached branch's input through a shared stack,
    which gives it a zero gradient. The values are the same; an optimizer that skips
    None gradients but applies weight decay or momentum to zero ones would differ.
    """
    if len(expected) != len(actual):
        return VerifyResult(False, None, None, what + "s", f"{len(actual)} {what}s instead of {len(expected)}")
    max_abs = max_rel = 0.0
    ok = True
    msg = ""
    for i, (e, a) in enumerate(zip(expected, actual)):
        if e is None and a is None:
            continue
        if what == "gradient":  # no gradient (input unused or detached) equals a zero gradient
            e = torch.zeros_like(a) if e is None and isinstance(a, torch.Tensor) else e
            a = torch.zeros_like(e) if a is None and isinstance(e, torch.Tensor) else a
        if not isinstance(e, torch.Tensor) or not isinstance(a, torch.Tensor):
            if e != a:
                return VerifyResult(False, None, None, what + "s", f"{what} {i}: {a!r} != {e!r}")
            continue
        if e.shape != a.shape or e.dtype != a.dtype:
            return VerifyResult(False, None, None, what + "s",
                                f"{what} {i}: {tuple(a.shape)} {a.dtype} instead of {tuple(e.shape)} {e.dtype}")
        if not e.is_floating_point():
            if not torch.equal(e, a):
                return VerifyResult(False, None, None, what + "s", f"{what} {i}: integer values differ")
            continue
        rtol, atol = TOLERANCES.get(e.dtype, (1e-4, 1e-5))
        e64, a64 = e.double(), a.double()
        both_nan = torch.isnan(e64) & torch.isnan(a64)
        same_inf = torch.isinf(e64) & (e64 == a64)
        diff = (a64 - e64).abs().masked_fill(both_nan | same_inf, 0.0)
        if torch.isnan(diff).any():
            return VerifyResult(False, float("nan"), float("nan"), what + "s", f"{what} {i}: NaN where the original has none")
        if diff.numel():
            max_abs = max(max_abs, float(diff.max()))
            rel = diff / e64.abs().clamp_min(atol)
            max_rel = max(max_rel, float(rel.max()))
            bad = diff > atol + rtol * e64.abs()
            if bad.any():
                ok = False
                msg = msg or f"{what} {i}: {int(bad.sum())} of {diff.numel()} elements off (rtol {rtol}, atol {atol})"
    return VerifyResult(ok, max_abs, max_rel, what + "s", msg)


def check(gm: GraphModule, inputs: tuple, ref: Reference, grads: bool = False) -> VerifyResult:
    """Lint ``gm`` and compare its outputs (and gradients, with ``grads``) with ``ref``.

    Never raises for a broken graph: a lint error or an exception while running is
    returned as a failed VerifyResult carrying the message.
    """
    if not ref.deterministic:
        return VerifyResult(None, None, None, "not-checkable",
                            "the original graph gives different outputs on two seeded runs")
    try:
        gm.graph.lint()
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        return VerifyResult(False, None, None, "lint", f"graph lint: {e}")
    try:
        outs, gs = run_graph(gm, inputs, grads and bool(ref.grads))
    except Exception as e:  # noqa: BLE001
        return VerifyResult(False, None, None, "outputs", f"running the graph raised {type(e).__name__}: {e}")
    res = compare(ref.outputs, outs)
    if res.ok and grads and ref.grads:
        g = compare(ref.grads, gs, "gradient")
        return VerifyResult(g.ok, max(res.max_abs_err or 0, g.max_abs_err or 0),
                            max(res.max_rel_err or 0, g.max_rel_err or 0), "outputs+grads", g.message)
    return res
