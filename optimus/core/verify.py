"""Numeric and structural equivalence checks of a rewritten graph against the original.

What a user's program sees is checked, not only output values: every run is on pristine
copies of the example inputs that keep their aliasing (each distinct storage cloned once,
every input rebuilt as a view of its clone: :mod:`optimus_lens.core.storage`), so the
caller's tensors are never written and two inputs that are views of one buffer stay so;
a check compares output values and dtypes, output strides, which outputs overlap inputs
or each other, and the inputs' values after the call (in-place writes), then gradients.

Every run is seeded (``torch.manual_seed(SEED)`` before each execution), so random ops
such as dropout in training mode draw the same numbers in the original and the
rewritten graph when the rewrite keeps their order; where it cannot (a batched dropout
draws one mask for the whole stack), the result says "not-checkable" instead of
reporting a false failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.fx import GraphModule, Interpreter
from torch.utils._pytree import tree_leaves

from optimus_lens.core.storage import (
    clone_preserving_aliases,
    overlap_difference,
    overlap_signature,
    plain_storage,
    storage_key,
)
from optimus_lens.core.trace import VerifyResult

SEED = 0

# (rtol, atol) per dtype. fp32 allows for a batched matmul summing in another order.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-9),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (5e-2, 1e-2),
}


@dataclass
class Run:
    """One execution of a graph on copies of its inputs (:func:`execute`): the outputs
    (flat), the gradients (one per floating-point input, None where it does not reach
    the loss; empty without ``grads``), the input copies after the call (flat, the
    graph's in-place writes in them) and which outputs overlap inputs or each other
    (:func:`optimus_lens.core.storage.overlap_signature`)."""

    outputs: list
    grads: list
    inputs_after: list
    overlaps: list


def execute(fn, inputs: tuple, grads: bool = False, wrt: str = "floating") -> Run:
    """Call ``fn(*copies)`` with the seed fixed, where ``copies`` are pristine copies of
    ``inputs`` that keep their aliasing (:func:`optimus_lens.core.storage.clone_preserving_aliases`):
    the caller's tensors are never written, and two inputs that are views of one buffer
    stay views of one (copied) buffer, so a write through one is read through the other
    as in the caller's program. ``fn`` is a GraphModule (run node by node with
    ``torch.fx.Interpreter``: no recompile needed) or any callable.

    With ``grads``, also returns d(sum of outputs * fixed weights)/d(input) for every
    floating-point input (parameters are placeholders of the captured graph, so weight
    gradients are included). Inputs that share a storage are views of one leaf of that
    storage (a write into one is a write into the leaf's differentiable copy), and each
    input's gradient is the leaf's gradient seen through the input's view.
    ``wrt="requires_grad"`` instead takes gradients only for the inputs that require grad,
    run as the leaves they are (a compiled callable is specialised on which inputs
    require grad: ``optimus_lens.compile``'s first-call check)."""
    torch.manual_seed(SEED)
    run = Interpreter(fn).run if isinstance(fn, GraphModule) else fn
    work = clone_preserving_aliases(tuple(inputs))
    if not grads:
        with torch.no_grad():
            outs = tree_leaves(run(*work))
        return Run(outs, [], list(work), overlap_signature(outs, work))
    if wrt == "requires_grad":
        run_on = list(work)
        leaves = [x for x in work if isinstance(x, torch.Tensor) and x.requires_grad]
        views: list = [(x, None) for x in leaves]
    else:
        run_on, leaves, views = _differentiable(work)
    outs = tree_leaves(run(*run_on))
    sig = overlap_signature(outs, run_on)
    after = [x.detach() if isinstance(x, torch.Tensor) else x for x in run_on]
    gen = torch.Generator().manual_seed(SEED + 1)
    loss = sum(
        (o.float() * torch.rand(o.shape, generator=gen)).sum()
        for o in outs
        if isinstance(o, torch.Tensor) and o.is_floating_point() and o.requires_grad
    )
    detached = [o.detach() if isinstance(o, torch.Tensor) else o for o in outs]
    if isinstance(loss, int) or not leaves:
        return Run(detached, [], after, sig)
    gs = torch.autograd.grad(loss, leaves, allow_unused=True)
    by_leaf = dict(zip((id(w) for w in leaves), gs))
    out_grads = []
    for leaf, view in views:
        g = by_leaf.get(id(leaf))
        out_grads.append(None if g is None else (g if view is None else g.as_strided(*view)))
    return Run(detached, out_grads, after, sig)


def _differentiable(work: tuple) -> tuple[list, list, list]:
    """(the values to run on, the leaves gradients are taken with respect to, and per
    floating-point input its leaf and the view of it (size, stride, offset) or None
    when the leaf is the input itself).

    Floating-point inputs that share a storage with another input become views of one
    leaf over the whole storage: the graph runs on views of the leaf's clone, so an
    in-place write is allowed (autograd refuses a write into a leaf) and reaches every
    alias. An input alone in its storage is its own leaf, run on its clone."""
    groups: dict[tuple, list[int]] = {}
    for i, x in enumerate(work):
        if isinstance(x, torch.Tensor) and x.is_floating_point() and plain_storage(x):
            groups.setdefault(storage_key(x), []).append(i)
    run_on = list(work)
    wrt: list = []
    views: list = []
    shared: dict[int, tuple] = {}
    for members in groups.values():
        dtypes = {work[i].dtype for i in members}
        if len(members) < 2 or len(dtypes) != 1:
            continue
        first = work[members[0]]
        n = first.untyped_storage().nbytes() // first.element_size()
        with torch.no_grad():
            flat = torch.empty(0, dtype=first.dtype, device=first.device).set_(first.untyped_storage(), 0, (n,), (1,))
        leaf = flat.detach().requires_grad_(True)
        src = leaf.clone()
        wrt.append(leaf)
        for i in members:
            x = work[i]
            view = (tuple(x.size()), tuple(x.stride()), x.storage_offset())
            run_on[i] = src.as_strided(*view)
            shared[i] = (leaf, view)
    for i, x in enumerate(work):
        if not (isinstance(x, torch.Tensor) and x.is_floating_point()):
            continue
        if i in shared:
            views.append(shared[i])
            continue
        leaf = x.detach().requires_grad_(True)
        run_on[i] = leaf.clone()  # autograd refuses an in-place write into a leaf
        wrt.append(leaf)
        views.append((leaf, None))
    return run_on, wrt, views


def run_graph(gm: GraphModule, inputs: tuple, grads: bool = False):
    """(outputs, gradients) of :func:`execute`: ``gm`` run on pristine copies of
    ``inputs`` that keep their aliasing."""
    r = execute(gm, inputs, grads)
    return r.outputs, r.grads


class OriginalRunError(ValueError):
    """The captured (original) graph itself fails on the example inputs, so there is
    nothing to verify against (the CLI exits 2 with this message)."""


@dataclass
class Reference:
    """The original graph's run on the example inputs, computed once: outputs (and
    gradients), which outputs overlap inputs or each other (``overlaps``), and the
    inputs it writes (``written``: per flat input, its value after the call, None where
    the call leaves it unchanged); for a graph with symbolic sizes also its outputs on
    ``second_inputs``, inputs of another shape (None when the graph has none, or no
    other shape runs)."""

    outputs: list
    grads: list
    deterministic: bool
    second_inputs: tuple | None = None
    second_outputs: list | None = None
    overlaps: list = field(default_factory=list)
    written: list = field(default_factory=list)


def reference(gm: GraphModule, inputs: tuple, grads: bool = False) -> Reference:
    """Run the original graph twice with the same seed, each time on pristine copies of
    ``inputs`` that keep their aliasing (:func:`execute`); ``deterministic`` is False
    when the two runs differ (e.g. an unseeded random op), in which case nothing can be
    compared. Raises :class:`OriginalRunError` when the original graph itself raises.
    When the graph has symbolic sizes (:func:`has_symbolic_sizes`) it also runs on the
    first input shape :func:`other_shapes` offers that the original graph accepts."""
    try:
        a = execute(gm, inputs, grads)
        b = execute(gm, inputs, False)
    except Exception as e:  # noqa: BLE001 - the model's own failure, said plainly
        raise OriginalRunError(
            f"the original graph raised {type(e).__name__} on the example inputs"
            f"{' computing gradients (--grads)' if grads else ''}: {e}"
        ) from e
    same = (
        len(a.outputs) == len(b.outputs)
        and all(_equal(x, y) for x, y in zip(a.outputs, b.outputs))
        and all(_equal(x, y) for x, y in zip(a.inputs_after, b.inputs_after))
    )
    ref = reference_of(a, inputs, same)
    if same and has_symbolic_sizes(gm):
        for other in other_shapes(gm, inputs):
            try:
                ref.second_outputs, _ = run_graph(gm, other, False)
            except Exception:  # noqa: BLE001 - a shape the model itself rejects: try the next
                continue
            ref.second_inputs = other
            break
    return ref


def reference_of(run: Run, inputs: tuple, deterministic: bool = True) -> Reference:
    """The :class:`Reference` a run of the original program gives (``run`` from
    :func:`execute` on ``inputs``): its outputs, gradients, overlaps, and the inputs it
    wrote (compared with ``inputs``, which :func:`execute` never writes)."""
    written = [None if _equal(after, before) else after for after, before in zip(run.inputs_after, list(inputs))]
    return Reference(run.outputs, run.grads, deterministic, overlaps=run.overlaps, written=written)


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
        if torch.equal(x, y):
            return True
        if x.is_floating_point() or x.is_complex():
            return bool(((x == y) | (torch.isnan(x) & torch.isnan(y))).all())
        return False
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        return False
    if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
        return type(x) is type(y) and len(x) == len(y) and all(_equal(a, b) for a, b in zip(x, y))
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_equal(x[k], y[k]) for k in x)
    if type(x) is type(y) and hasattr(x, "__dict__") and not isinstance(x, type) and x is not y:
        return _equal(vars(x), vars(y))  # a copied input object (a cache holding tensors): equal by its fields
    try:
        return bool(x == y)
    except (RuntimeError, TypeError, ValueError):  # an object whose == is not a truth value
        return x is y


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
        if e.shape == a.shape and e.dtype != a.dtype:
            kind = "dtypes" if what == "output" else what + "s"
            return VerifyResult(False, None, None, kind, f"{what} {i}: dtype {a.dtype} instead of {e.dtype}")
        if e.shape != a.shape:
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


def compare_inputs(inputs: tuple, written: list, after: list) -> VerifyResult | None:
    """A failed "input-writes" VerifyResult naming the first input whose value after the
    call differs from the original graph's (``written``: the original's after-call value,
    None where the original leaves the input as it was in ``inputs``), or None.
    Values compare with the outputs' tolerances (:func:`compare_outputs`)."""
    for i, (before, want, got) in enumerate(zip(inputs, written, after)):
        expected = before if want is None else want
        if not isinstance(expected, torch.Tensor) or not isinstance(got, torch.Tensor) or _equal(expected, got):
            continue
        res = compare_outputs([expected.detach()], [got.detach()], "input")
        if res.ok:
            continue
        if want is None:
            how = "the original leaves it unchanged, the rewritten graph writes it"
        elif _equal(before, got):
            how = "the original writes it, the rewritten graph leaves it unchanged"
        else:
            how = "both write it, with other values"
        err = f"max abs err {res.max_abs_err:.3g}; " if res.max_abs_err is not None else ""
        return VerifyResult(
            False,
            res.max_abs_err,
            res.max_rel_err,
            "input-writes",
            f"input {i} after the call differs: {err}{how}",
        )
    return None


def check(gm: GraphModule, inputs: tuple, ref: Reference, grads: bool = False) -> VerifyResult:
    """Lint ``gm``, run it on pristine copies of ``inputs`` that keep their aliasing
    (:func:`execute`) and compare with ``ref``, in this order (the first difference is
    the result, its message naming what differs):

    * output values and dtypes (``checked="outputs"``; ``output 0: dtype bfloat16 instead of float32``);
    * the outputs' strides (``"layout"``: eager gives a caller these strides);
    * which outputs overlap inputs or each other (``"aliasing"``: ``output 0 now overlaps input 0``);
    * the inputs' values after the call (``"input-writes"``: ``input 1 after the call differs: ...``);
    * when ``ref`` has them, the outputs on inputs of a second shape (``"second-shape"``:
      a rewrite that fixed a symbolic size fails there);
    * with ``grads``, the gradients (``"outputs+grads"``).

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
        run = execute(gm, inputs, grads and bool(ref.grads))
    except Exception as e:  # noqa: BLE001
        return VerifyResult(False, None, None, "outputs", f"running the graph raised {type(e).__name__}: {e}")
    res = compare_run(ref, run, inputs)
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
        return with_grads(res, ref, run)
    return res


def compare_run(ref: Reference, run: Run, inputs: tuple) -> VerifyResult:
    """``run`` (of a rewritten program on ``inputs``) against ``ref`` (the original's):
    output values and dtypes, then output strides, then which outputs overlap inputs or
    each other, then the inputs' values after the call; the first difference wins
    (see :func:`check`). Gradients are :func:`with_grads`'s."""
    res = compare_outputs(ref.outputs, run.outputs)
    if res.ok:
        res = compare_layout(ref.outputs, run.outputs) or res
    if res.ok and ref.overlaps:
        differs = overlap_difference(ref.overlaps, run.overlaps)
        if differs:
            return VerifyResult(False, res.max_abs_err, res.max_rel_err, "aliasing", differs)
    if res.ok and ref.written:
        res = compare_inputs(tuple(inputs), ref.written, run.inputs_after) or res
    return res


def with_grads(res: VerifyResult, ref: Reference, run: Run) -> VerifyResult:
    """``res`` (a passing comparison of outputs) extended by the gradients of ``run``
    against ``ref``'s (``checked="outputs+grads"``; errors the larger of both)."""
    g = compare_outputs(ref.grads, run.grads, "gradient")
    return VerifyResult(
        g.ok,
        max(res.max_abs_err or 0, g.max_abs_err or 0),
        max(res.max_rel_err or 0, g.max_rel_err or 0),
        "outputs+grads",
        g.message,
    )
