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

from optimus_lens.core.effects import is_mutating
from optimus_lens.core.trace import VerifyResult

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
    the seed fixed, on copies of the inputs when the graph writes in place
    (:func:`writes_in_place`). With ``grads``, also returns d(sum of outputs * fixed weights)/d(input)
    for every floating-point input that requires grad (parameters are placeholders of the
    captured graph, so weight gradients are included). Returns (outputs, grads list)."""
    torch.manual_seed(SEED)
    writes = writes_in_place(gm)
    if writes:  # each run gets its own copies: a run must not see the last one's writes
        inputs = tuple(x.detach().clone() if isinstance(x, torch.Tensor) else x for x in inputs)
    if not grads:
        with torch.no_grad():
            return tree_leaves(Interpreter(gm).run(*inputs)), []
    leaves = [
        x.detach().requires_grad_(True) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs
    ]
    # autograd refuses an in-place write to a leaf; the graph writes into a differentiable copy
    run_on = [x.clone() if writes and isinstance(x, torch.Tensor) and x.requires_grad else x for x in leaves]
    outs = tree_leaves(Interpreter(gm).run(*run_on))
    gen = torch.Generator().manual_seed(SEED + 1)
    loss = sum(
        (o.float() * torch.rand(o.shape, generator=gen)).sum()
        for o in outs
        if isinstance(o, torch.Tensor) and o.is_floating_point() and o.requires_grad
    )
    wrt = [x for x in leaves if isinstance(x, torch.Tensor) and x.requires_grad]
    if isinstance(loss, int) or not wrt:
        return [o.detach() if isinstance(o, torch.Tensor) else o for o in outs], []
    gs = torch.autograd.grad(loss, wrt, allow_unused=True)
    return [o.detach() for o in outs], [g for g in gs]


class OriginalRunError(ValueError):
    """The captured (original) graph itself fails on the example inputs, so there is
    nothing to verify against (the CLI exits 2 with this message)."""


def writes_in_place(gm: GraphModule) -> bool:
    """True when some node of ``gm`` writes in place (``add_``, ``x[i] = v``,
    ``inplace=True``, ``out=``: :func:`optimus_lens.core.effects.is_mutating`); then
    :func:`run_graph` runs it on copies of the inputs, so the caller's tensors and the
    next run's inputs keep their values."""
    return any(n.op in ("call_function", "call_method") and is_mutating(n) for n in gm.graph.nodes)


@dataclass
class Reference:
    """The original graph's outputs (and gradients) on the example inputs, computed once;
    for a graph with symbolic sizes also its outputs on ``second_inputs``, inputs of
    another shape (None when the graph has none, or no other shape runs)."""

    outputs: list
    grads: list
    deterministic: bool
    second_inputs: tuple | None = None
    second_outputs: list | None = None


def reference(gm: GraphModule, inputs: tuple, grads: bool = False) -> Reference:
    """Run the original graph twice with the same seed; ``deterministic`` is False when
    the two runs differ (e.g. an unseeded random op), in which case nothing can be compared.
    Raises :class:`OriginalRunError` when the original graph itself raises.
    When the graph has symbolic sizes (:func:`has_symbolic_sizes`) it also runs on the
    first input shape :func:`other_shapes` offers that the original graph accepts."""
    try:
        a, ga = run_graph(gm, inputs, grads)
        b, _ = run_graph(gm, inputs, False)
    except Exception as e:  # noqa: BLE001 - the model's own failure, said plainly
        raise OriginalRunError(
            f"the original graph raised {type(e).__name__} on the example inputs"
            f"{' computing gradients (--grads)' if grads else ''}: {e}"
        ) from e
    same = len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    ref = Reference(a, ga, same)
    if same and has_symbolic_sizes(gm):
        for other in other_shapes(gm, inputs):
            try:
                ref.second_outputs, _ = run_graph(gm, other, False)
            except Exception:  # noqa: BLE001 - a shape the model itself rejects: try the next
                continue
            ref.second_inputs = other
            break
    return ref


SIZE_METHODS = {"size", "dim", "numel", "shape"}


def has_symbolic_sizes(gm: GraphModule) -> bool:
    """True when the graph's sizes depend on its inputs' shapes: a placeholder or value
    with a SymInt size (Dynamo ``dynamic=True``), or a node that reads a tensor's size
    (``x.size(1)``, ``x.shape``, ``torch.sym_size``) as symbolic tracing records it."""
    import operator

    for n in gm.graph.nodes:
        v = n.meta.get("example_value", n.meta.get("val"))
        if isinstance(v, (torch.SymInt, torch.SymFloat)):
            return True
        if isinstance(v, torch.Tensor) and any(type(d) is not int for d in v.shape):
            return True
        if n.op == "call_method" and n.target in SIZE_METHODS:
            return True
        if n.op == "call_function" and (
            n.target in (torch.ops.aten.sym_size.int, getattr(torch, "sym_size", None))
            or (n.target is getattr and len(n.args) > 1 and n.args[1] in SIZE_METHODS)
            or (
                n.target is operator.getitem
                and isinstance(n.args[0], torch.fx.Node)
                and n.args[0].op == "call_function"
                and n.args[0].target is getattr
            )
        ):
            return True
    return False


def other_shapes(gm: GraphModule, inputs: tuple, grow: int = 2, tries: int = 8):
    """Inputs of other shapes for a graph with symbolic sizes, most promising first (at most
    ``tries``): with dynamic shapes every size symbol grows by ``grow`` (sizes and SymInt
    placeholders computed from the symbols); otherwise every dim of every non-parameter
    input grows by ``grow`` at once, then one dim at a time, last dims first. Values are
    drawn with a fixed seed in the inputs' dtypes (integers within the inputs' range)."""
    gen = torch.Generator().manual_seed(SEED + 7)
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    shapes = [tuple(x.shape) if isinstance(x, torch.Tensor) else None for x in inputs]
    symbols = _symbol_values(phs, inputs)
    made = 0
    if symbols:
        new = {s: v + grow for s, v in symbols.items()}
        out = _with_symbols(phs, inputs, new, gen)
        if out is not None:
            made += 1
            yield out
        return
    free = [
        i
        for i, x in enumerate(inputs)
        if isinstance(x, torch.Tensor) and not isinstance(x, torch.nn.Parameter) and x.dim() > 0
    ]
    plans = [[(i, d) for i in free for d in range(inputs[i].dim())]]
    plans += [[(i, d)] for i in free for d in reversed(range(inputs[i].dim()))]
    for plan in plans:
        if made >= tries or not plan:
            return
        new_shapes = [list(s) if s is not None else None for s in shapes]
        for i, d in plan:
            new_shapes[i][d] += grow
        made += 1
        yield tuple(
            _like(x, s, gen) if s is not None and i in free else x for i, (x, s) in enumerate(zip(inputs, new_shapes))
        )


def _like(x: torch.Tensor, shape, gen: torch.Generator) -> torch.Tensor:
    """A tensor of ``shape`` with ``x``'s dtype, its dims laid out in ``x``'s stride order
    (a graph captured for a transposed input holds for transposed inputs)."""
    order = sorted(range(x.dim()), key=lambda d: (-x.stride()[d], d))
    inverse = sorted(range(x.dim()), key=order.__getitem__)
    dense = [shape[d] for d in order]
    if x.is_floating_point() or x.is_complex():
        t = torch.randn(dense, generator=gen).to(x.dtype)
    elif x.dtype == torch.bool:
        t = torch.rand(dense, generator=gen) < 0.5
    else:
        lo, hi = (int(x.min()), int(x.max())) if x.numel() else (0, 1)
        t = torch.randint(lo, hi + 1, dense, generator=gen).to(x.dtype)
    return t.permute(inverse)


def _symbol_values(phs, inputs) -> dict:
    """symbol -> its value in ``inputs``, for every size of a placeholder's example value
    that is one bare symbol (``s0``)."""
    out = {}
    for n, x in zip(phs, inputs):
        v = n.meta.get("example_value")
        if isinstance(v, torch.SymInt) and isinstance(x, int) and v.node.expr.is_Symbol:
            out[v.node.expr] = x
        elif isinstance(v, torch.Tensor) and isinstance(x, torch.Tensor):
            for d, real in zip(v.shape, x.shape):
                if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol:
                    out[d.node.expr] = int(real)
    return out


def _with_symbols(phs, inputs, new: dict, gen):
    out = []
    for n, x in zip(phs, inputs):
        v = n.meta.get("example_value")
        if isinstance(v, torch.SymInt):
            out.append(int(v.node.expr.subs(new)))
        elif isinstance(v, torch.Tensor) and isinstance(x, torch.Tensor) and any(type(d) is not int for d in v.shape):
            shape = [int(d.node.expr.subs(new)) if isinstance(d, torch.SymInt) else int(d) for d in v.shape]
            out.append(_like(x, shape, gen))
        else:
            out.append(x)
    return tuple(out)


def compare_layout(expected: list, actual: list) -> VerifyResult | None:
    """A failed "layout" VerifyResult naming the first output whose strides differ from the
    original's (dims of size 1 ignored: no op addresses memory through them), or None."""
    for i, (e, a) in enumerate(zip(expected, actual)):
        if isinstance(e, torch.Tensor) and isinstance(a, torch.Tensor) and e.layout == torch.strided:
            se = [s for s, n in zip(e.stride(), e.shape) if n != 1]
            sa = [s for s, n in zip(a.stride(), a.shape) if n != 1]
            if se != sa:
                return VerifyResult(
                    False,
                    0.0,
                    0.0,
                    "layout",
                    f"output {i}: strides {tuple(a.stride())} instead of {tuple(e.stride())} "
                    f"(same values; a .view or as_strided on it would differ)",
                )
    return None


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


def compare_outputs(expected: list, actual: list, what: str = "output") -> VerifyResult:
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
            return VerifyResult(
                False,
                None,
                None,
                what + "s",
                f"{what} {i}: {tuple(a.shape)} {a.dtype} instead of {tuple(e.shape)} {e.dtype}",
            )
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
            return VerifyResult(
                False, float("nan"), float("nan"), what + "s", f"{what} {i}: NaN where the original has none"
            )
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
    """Lint ``gm`` and compare its outputs (and gradients, with ``grads``) with ``ref``:
    values first, then the outputs' strides (a failure ``checked="layout"``: eager gives a
    caller these strides), then, when ``ref`` has them, the outputs on inputs of a second
    shape (``checked="second-shape"``: a rewrite that fixed a symbolic size fails there).

    Never raises for a broken graph: a lint error or an exception while running is
    returned as a failed VerifyResult carrying the message.
    """
    if not ref.deterministic:
        return VerifyResult(
            None, None, None, "not-checkable", "the original graph gives different outputs on two seeded runs"
        )
    try:
        gm.graph.lint()
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        return VerifyResult(False, None, None, "lint", f"graph lint: {e}")
    try:
        outs, gs = run_graph(gm, inputs, grads and bool(ref.grads))
    except Exception as e:  # noqa: BLE001
        return VerifyResult(False, None, None, "outputs", f"running the graph raised {type(e).__name__}: {e}")
    res = compare_outputs(ref.outputs, outs)
    if res.ok:
        res = compare_layout(ref.outputs, outs) or res
    if res.ok and ref.second_inputs is not None:
        shapes = [tuple(x.shape) for x in ref.second_inputs if isinstance(x, torch.Tensor)][:3]
        try:
            outs2, _ = run_graph(gm, ref.second_inputs, False)
        except Exception as e:  # noqa: BLE001
            return VerifyResult(
                False,
                None,
                None,
                "second-shape",
                f"on inputs of shape {shapes} (the original graph runs) the graph raised {type(e).__name__}: {e}",
            )
        r2 = compare_outputs(ref.second_outputs, outs2)
        if r2.ok:
            r2 = compare_layout(ref.second_outputs, outs2) or r2
        if not r2.ok:
            return VerifyResult(
                False, r2.max_abs_err, r2.max_rel_err, "second-shape", f"on inputs of shape {shapes}: {r2.message}"
            )
        res = VerifyResult(res.ok, res.max_abs_err, res.max_rel_err, res.checked + "+second-shape", res.message)
    if res.ok and grads and ref.grads:
        g = compare_outputs(ref.grads, gs, "gradient")
        return VerifyResult(
            g.ok,
            max(res.max_abs_err or 0, g.max_abs_err or 0),
            max(res.max_rel_err or 0, g.max_rel_err or 0),
            "outputs+grads",
            g.message,
        )
    return res
