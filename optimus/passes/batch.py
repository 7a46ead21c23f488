"""Horizontal batch fusions (upstream: torch/_inductor/fx_passes/group_batch_fusion.py).

Each pattern groups independent nodes of one op with equal shapes, dtype and device,
stacks (or concatenates) their inputs, runs the op once, and hands every member its
slice of the result. Where this catalogue differs from upstream, it is on purpose:

* Group keys always include the op, dtype and device (upstream's post-grad linear key
  has no dtype and fuses fp32 with bf16; its pre-grad math-op key has no op name).
* Positional and keyword arguments are bound to one canonical form (``bind_args``)
  before keying, so ``clamp(x, -1, 1)`` and ``clamp(x, min=-1, max=1)`` fuse together
  and ``clamp(x, 0, 1)`` never joins them (upstream keys ``str(node.kwargs)`` only and
  applies the first member's kwargs to all, dropping positional bounds).
* No member may be written in place, through a view or not, and no member may read a
  tensor that is written in place anywhere (``mutation_miss``): the fused op reads its
  inputs at another point of the program, and the members' outputs become views of one
  multi-output ``unbind``/``split``, which autograd forbids writing to. Upstream checks
  direct users of the output only, and misses ``inplace`` passed positionally.
* ``batch_linear`` and ``batch_linear_lhs`` also take the GPT-2 forms of a linear
  (:mod:`optimus_lens.passes.linears`):
  ``torch.addmm(b, x, W)`` (HF ``Conv1D``, W is (K, N)) and ``x @ W`` / ``torch.matmul``
  with a 2-D weight; members of one group share a form, so their weights share a layout.
* Dropout is fused only when ``training=False``. In training mode the members draw one
  mask each and a fused dropout one mask for the whole stack: the same distribution, but
  whether the same numbers come out under the same seed depends on the generator (on CPU
  the Bernoulli stream is consumed in element order and a contiguous stack happens to
  reproduce the per-member masks; no PyTorch contract promises that, and not on GPU), so
  seeded verification could not vouch for the step. Upstream fuses it.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx import Node

from optimus_lens.core import meta
from optimus_lens.core.miss import Miss
from optimus_lens.core.pattern import BatchPattern, SearchOptions, register
from optimus_lens.core.rewriter import Rewriter
from optimus_lens.passes.common import (
    LAYER_NORM,
    RELU,
    REQUIRED,
    SIGMOID,
    TANH,
    arg,
    bind_args,
    fusion_key,
    is_call,
    replace_with_getitems,
    tensor_key,
)
from optimus_lens.passes.linears import (
    LINEAR_LIKE,
    RESHAPES,
    LinearOperands,
    linear_input,
    linear_operands,
    value_id,
)

NOT_A: dict[str, Miss] = {}


def _miss_not(op: str) -> Miss:
    return NOT_A.setdefault(op, Miss(f"not a {op} node"))


# ------------------------------------------------------------------------ linears


@register
class BatchLinear(BatchPattern):
    """``y_i = x_i @ W_i' + b_i`` for n independent same-shape linears ->
    ``Y = baddbmm(stack(b_i).unsqueeze(1), stack(x_i), stack(W_i)')`` (``bmm`` without
    bias), ``y_i = unbind(Y)[i]``. ``W'`` is ``W^T`` for ``F.linear`` (stacked, then
    ``transpose(1, 2)``) and ``W`` itself for addmm / matmul.

    Shapes: x_i (M, K) [or (..., K), flattened to (M, K)], W_i (N, K) or (K, N), b_i (N,)
    [addmm: (N,) or (M, N)] -> X (n, M, K), W' (n, K, N), Y (n, M, N).
    """

    pipeline_order = 1
    name = "batch_linear"
    anchors = LINEAR_LIKE
    upstream = "PreGradBatchLinearFusion (batch_linear)"
    description = "Fuse independent same-shape linears (F.linear, addmm, x @ W) into one batched matmul."
    preconditions = (
        "F.linear / torch._C._nn.linear (nn.Linear inlines to it), torch.addmm(b, x, W) with beta = alpha = 1 "
        "(HF Conv1D), or x @ W / torch.matmul with W a 2-D placeholder or get_attr",
        "input has rank >= 2 and weight is 2-D, with example values",
        "same form, input shape, weight shape, bias shape or absence, dtype and device in the group",
        "no in-place write to the output, a view of it, or an input",
        "members do not depend on each other",
    )

    def key(self, node: Node):
        o = linear_operands(node)
        if isinstance(o, Miss):
            return o
        xt = meta.tensor(o.x)  # a tensor: linear_operands checked it
        if xt._has_symbolic_sizes_strides and not all(type(d) is int for d in xt.shape):
            return Miss("input has symbolic sizes (dynamic shapes): the batched matmul is built for static ones")
        return fusion_key(node, ("batch_linear", o.form, tensor_key(o.x), tensor_key(o.w), tensor_key(o.b)))

    def fuse(self, rw: Rewriter, nodes: list[Node]) -> None:
        ops = [linear_operands(n) for n in nodes]
        o = ops[0]
        xshape, n = meta.shape(o.x), len(nodes)
        with rw.inserting_before(nodes[0]):
            x = rw.call(torch.stack, [p.x for p in ops])
            if len(xshape) != 2:
                x = rw.call(torch.reshape, x, (n, -1, xshape[-1]))
            w = rw.call(torch.stack, [p.w for p in ops])
            if o.weight_is_nk:
                w = rw.call(torch.transpose, w, 1, 2)
            if o.b is not None:
                b = rw.call(torch.stack, [p.b for p in ops])
                if len(meta.shape(o.b)) == 1:
                    b = rw.call(torch.unsqueeze, b, 1)
                y = rw.call(torch.baddbmm, b, x, w)
            else:
                y = rw.call(torch.bmm, x, w)
            if len(xshape) != 2:
                y = rw.call(torch.reshape, y, (n, *xshape[:-1], o.out_features))
            replace_with_getitems(rw, nodes, rw.call(torch.unbind, y))


def _erase_unused(rw: Rewriter, node: Node) -> None:
    """Erase ``node`` and then its reshape/view sources while they have no users left."""
    while is_call(node, *RESHAPES) and not node.users:
        src = node.args[0]
        rw.erase(node)
        node = src


@register
class BatchLinearLHS(BatchPattern):
    """``y_i = x @ W_i' + b_i`` for n independent linears on the SAME input x ->
    ``Y = x @ cat(W_i)' + cat(b_i)`` (one wider linear / addmm / matmul of the group's
    form), ``y_i = split(Y, [N_i], dim=-1)[i]``. Out-features N_i may differ.

    Shapes: x (..., K), W_i (N_i, K) [linear] or (K, N_i) [addmm, matmul], b_i (N_i,)
    [addmm: (N_i,) or (M, N_i)] -> Y (..., sum N_i).

    Search options: groups of 2 or more, found within 16 producer hops. Upstream uses its
    defaults (at least 5, within 5 hops), which never fuse the three q/k/v projections of
    an attention block: one wider GEMM on a shared input needs no stacking of activations
    and pays off from two members, and q, k and v first meet 10 (transformer_block) to 14
    (HF BERT) hops below their common consumer. A shallower search fuses them piecemeal
    (q+k, then that with v, nesting the cats). The deeper walk stays cheap because every
    linear is a match and the search never expands past a match.
    """

    pipeline_order = 0
    name = "batch_linear_lhs"
    anchors = LINEAR_LIKE
    upstream = "BatchLinearLHSFusion (batch_linear_lhs)"
    description = "Fuse independent linears that share one input into one wider linear plus a split."
    options = SearchOptions(min_fuse_set_size=2, max_fuse_search_depth=16)
    preconditions = (
        "F.linear / torch._C._nn.linear, torch.addmm(b, x, W) with beta = alpha = 1, or x @ W with W a "
        "2-D placeholder or get_attr",
        "every member reads the same input (the same node, or equal constant-size views of one node, as GPT-2's "
        "Conv1D writes); out-features may differ",
        "same form, in-features, bias presence and bias rank, dtype and device in the group; "
        "each bias spans its member's out-features",
        "no in-place write to the output, a view of it, or an input",
        "members do not depend on each other",
    )

    def group_hint(self, node: Node):
        """The value the linear reads (its key's ``value_id`` of x), from that argument
        alone (:func:`~optimus_lens.passes.linears.linear_input`): a node that is no
        linear this pattern reads has no key, so whether its hint keeps it keyed changes
        no group, and a linear's operands are read once, by the key that needs them.
        None when the argument is not a node."""
        x = linear_input(node)
        return value_id(x) if isinstance(x, Node) else None

    def key(self, node: Node):
        o = linear_operands(node)
        if isinstance(o, Miss):
            return o
        wt = meta.tensor(o.w)
        bias = None
        if o.b is not None:
            bt = meta.tensor(o.b)
            if bt.shape[-1] != o.out_features:
                return Miss("bias broadcasts over the output features")
            bias = (tuple(bt.shape[:-1]), bt.dtype, str(bt.device))
        return fusion_key(
            node, ("batch_linear_lhs", o.form, value_id(o.x), o.in_features, wt.dtype, str(wt.device), bias)
        )

    def fuse(self, rw: Rewriter, nodes: list[Node]) -> None:
        """One wider linear for ``nodes``. A member that is itself an earlier group
        (``linear(x, cat(W_j), cat(b_j))`` read only through ``split(.., [N_j])``, as this
        fusion writes it) is unpacked, so a group that grows in two steps concatenates
        each original weight once (``cat(Wq, Wv, Wk)``, not ``cat(cat(Wq, Wv), Wk)``) and
        keeps one split."""
        ops = [linear_operands(n) for n in nodes]
        o = ops[0]
        last = len(meta.shape(nodes[0])) - 1
        wdim = 0 if o.weight_is_nk else 1
        bdim = None if o.b is None else len(meta.shape(o.b)) - 1
        ws, bs, sizes, outs, old = [], [], [], [], []
        for n, p in zip(nodes, ops):
            group = _earlier_group(n, p, wdim, bdim, last)
            if group is None:
                ws.append(p.w)
                bs.append(p.b)
                sizes.append(p.out_features)
                outs.append(n)
            else:
                split, gw, gb, gsizes, gouts = group
                ws += gw
                bs += gb
                sizes += gsizes
                outs += gouts
                old.append((n, split, p))
        with rw.inserting_before(nodes[0]):
            w = rw.call(torch.cat, ws, wdim)
            b = None if o.b is None else rw.call(torch.cat, bs, bdim)
            if o.form == "linear":
                y = rw.call(F.linear, o.x, w, b)
            elif o.form == "addmm":
                y = rw.call(torch.addmm, b, o.x, w)
            else:
                y = rw.call(torch.matmul, o.x, w)
            parts = rw.call(torch.split, y, sizes, last)
            for i, out in enumerate(outs):
                if out is None:  # a section of an earlier group that nothing reads
                    continue
                g = rw.call(operator.getitem, parts, i)
                rw.carry_meta(out, g)
                rw.replace_all_uses(out, g)
        for out in outs:
            if out is not None:
                rw.erase(out)
        for n, split, p in old:
            rw.erase(split)
            rw.erase(n)
            for packed in (p.w, p.b):
                if packed is not None and not packed.users:
                    rw.erase(packed)
        for p in ops[1:]:
            if p.x is not o.x:
                _erase_unused(rw, p.x)


def _earlier_group(n: Node, p: LinearOperands, wdim: int, bdim: int | None, last: int):
    """If ``n`` is a group :meth:`BatchLinearLHS.fuse` wrote (its weight and bias are
    ``cat`` nodes only it reads, its only user a ``split`` along the last dim whose
    sections are the parts' out-features, read only through getitems): (split, weights,
    biases, sections, the getitem reading each section or None). Else None."""
    if len(n.users) != 1:
        return None
    (split,) = n.users
    if not (
        is_call(split, {torch.split}, set())
        and len(split.args) == 3
        and not split.kwargs
        and split.args[2] in (last, -1)
        and isinstance(split.args[1], (list, tuple))
    ):
        return None

    def parts(x, dim):
        if not (
            isinstance(x, Node)
            and is_call(x, {torch.cat}, set())
            and len(x.users) == 1
            and len(x.args) == 2
            and not x.kwargs
            and x.args[1] == dim
            and isinstance(x.args[0], (list, tuple))
        ):
            return None
        return list(x.args[0])

    ws = parts(p.w, wdim)
    bs = [None] * len(ws) if ws is not None and p.b is None else parts(p.b, bdim)
    sizes = list(split.args[1])
    if ws is None or bs is None or len(ws) != len(sizes) or len(bs) != len(sizes):
        return None
    if [meta.shape(w)[wdim] for w in ws] != sizes:
        return None
    outs: list[Node | None] = [None] * len(sizes)
    for u in split.users:
        if not (u.target is operator.getitem and isinstance(u.args[1], int) and outs[u.args[1]] is None):
            return None
        outs[u.args[1]] = u
    return split, ws, bs, sizes, outs


# --------------------------------------------------------------------- layer norm


# F.layer_norm's signature (torch.layer_norm adds cudnn_enable)
LAYER_NORM_ARGS = (
    ("input", REQUIRED),
    ("normalized_shape", REQUIRED),
    ("weight", None),
    ("bias", None),
    ("eps", 1e-5),
    ("cudnn_enable", True),
)


@register
class BatchLayerNorm(BatchPattern):
    """``y_i = layer_norm(x_i, ns, w_i, b_i, eps)`` ->
    ``Z = addcmul(B, layer_norm(stack(x_i), ns, eps=eps), W)`` (``B + LN * W`` in one
    node), ``y_i = unbind(Z)[i]``, with ``W = stack(w_i).reshape(n, 1, .., 1, *ns)`` (and
    B alike) so the affine parameters broadcast over the dims that are not normalised.
    Works for a normalized_shape of any rank, and for weight and bias each present or
    absent (``LN * W`` or ``LN + B`` when one is absent, ``LN`` when both are).

    Shapes: x_i (*lead, *ns) -> stack (n, *lead, *ns); w_i, b_i (*ns) -> (n, 1.., *ns).

    Upstream stacks on dim ``-1 - len(ns)`` instead (the stacked (n, *ns) parameters then
    broadcast as they are). We stack on dim 0, as the batched matmuls and unary fusions
    do: a layer norm between two fused layers then reads and gives back the (n, ...)
    layout they use, so the cleanups cancel its stack and unbind outright instead of
    leaving ``movedim``s (a non-contiguous layer-norm input, which the kernel copies),
    and each member's output is a contiguous slice (upstream's unbind along dim -2 gives
    strided ones). Same values; ``docs/parity.md`` lists the difference.
    """

    pipeline_order = 2
    name = "batch_layernorm"
    anchors = frozenset().union(*LAYER_NORM)
    upstream = "BatchLayernormFusion (batch_layernorm)"
    description = "Fuse independent same-shape layer norms into one layer norm over a stacked input."
    preconditions = (
        "call_function F.layer_norm (nn.LayerNorm inlines to it)",
        "static normalized_shape and eps; weight and bias each present or absent alike in the group",
        "same input shape, dtype and device in the group; weight and bias have the input's dtype",
        "no in-place write to the output, a view of it, or an input; members independent",
    )

    def key(self, node: Node):
        if not is_call(node, *LAYER_NORM):
            return _miss_not("layer_norm")
        a = bind_args(node, LAYER_NORM_ARGS)
        if isinstance(a, Miss):
            return a
        x, ns, w, b, eps = a["input"], a["normalized_shape"], a["weight"], a["bias"], a["eps"]
        xt = meta.tensor(x)
        if xt is None:
            return Miss("input has no example value")
        if not isinstance(ns, (list, tuple)) or not all(isinstance(d, int) for d in ns):
            return Miss("normalized_shape is not a static tuple of ints")
        if not isinstance(eps, (int, float)):
            return Miss("eps is not a constant")
        for p in (w, b):
            if p is not None and (meta.tensor(p) is None or meta.tensor(p).dtype != xt.dtype):
                return Miss("weight or bias is not a tensor node of the input's dtype")
        return fusion_key(node, ("batch_layernorm", tensor_key(x), tuple(ns), tensor_key(w), tensor_key(b), float(eps)))

    def fuse(self, rw: Rewriter, nodes: list[Node]) -> None:
        args = [bind_args(n, LAYER_NORM_ARGS) for n in nodes]
        a0 = args[0]
        ns = tuple(a0["normalized_shape"])
        lead = len(meta.shape(a0["input"])) - len(ns)

        def affine(name: str) -> Node:
            p = rw.call(torch.stack, [a[name] for a in args])
            return rw.call(torch.reshape, p, (len(nodes), *[1] * lead, *ns)) if lead else p

        with rw.inserting_before(nodes[0]):
            z = rw.call(F.layer_norm, rw.call(torch.stack, [a["input"] for a in args]), ns, eps=a0["eps"])
            if a0["weight"] is not None and a0["bias"] is not None:
                z = rw.call(torch.addcmul, affine("bias"), z, affine("weight"))
            elif a0["weight"] is not None:
                z = rw.call(torch.mul, z, affine("weight"))
            elif a0["bias"] is not None:
                z = rw.call(torch.add, z, affine("bias"))
            replace_with_getitems(rw, nodes, rw.call(torch.unbind, z))


# ------------------------------------------------------------------ unary ops


class BatchUnary(BatchPattern):
    """``y_i = op(x_i, *args)`` -> ``Y = op(stack(x_i), *args)``, ``y_i = unbind(Y)[i]``
    for an elementwise op with constant extra arguments.

    ``params`` lists the op's arguments after the input as ``(name, default)`` in
    signature order; every spelling (``torch.op``, ``F.op``, ``Tensor.op``) is bound to
    that one canonical form, which is part of the group key, and the fused node calls
    ``canonical`` with the non-default values. Shapes: x_i (...) -> X (n, ...).
    """

    op = ""
    functions: frozenset = frozenset()
    methods: frozenset = frozenset()
    params: tuple[tuple[str, Any], ...] = ()
    canonical: Any = None

    @property
    def anchors(self) -> frozenset:  # type: ignore[override]
        return self.functions | self.methods

    def refuse(self, args: dict) -> Miss | None:
        """Why these canonical arguments cannot be fused, or None."""
        return None

    def bound(self, node: Node) -> dict | Miss:
        return bind_args(node, (("input", REQUIRED), *self.params))

    def key(self, node: Node):
        if not is_call(node, self.functions, self.methods):
            return _miss_not(self.op)
        a = self.bound(node)
        if isinstance(a, Miss):
            return a
        x = a.pop("input")
        out = meta.tensor(node)
        if out is None or meta.tensor(x) is None:
            return Miss("input or output has no example value")
        for k, v in a.items():
            if isinstance(v, list):
                a[k] = v = tuple(v)
            if not isinstance(v, (bool, int, float, type(None))) and not (
                isinstance(v, tuple) and all(isinstance(d, int) for d in v)
            ):
                return Miss(f"argument {k} is not a constant")
        miss = self.refuse(a)
        if miss:
            return miss
        return fusion_key(node, (self.name, tensor_key(x), out.dtype, tuple(a.items())))

    def fuse(self, rw: Rewriter, nodes: list[Node]) -> None:
        a = self.bound(nodes[0])
        kwargs = {k: a[k] for k, default in self.params if a[k] != default or type(a[k]) is not type(default)}
        with rw.inserting_before(nodes[0]):
            x = rw.call(torch.stack, [arg(n, 0, "input") for n in nodes])  # each member's bound input
            replace_with_getitems(rw, nodes, rw.call(torch.unbind, rw.call(self.canonical, x, **kwargs)))


def _not_inplace(args: dict) -> Miss | None:
    return Miss("in place") if args.get("inplace") else None


@register
class BatchRelu(BatchUnary):
    """``relu(x_i)`` -> ``unbind(relu(stack(x_i)))``; every spelling, where upstream matches ``F.relu`` only."""

    pipeline_order = 5
    name, op = "batch_relu", "relu"
    functions, methods = frozenset(RELU[0]), frozenset(RELU[1])
    params = (("inplace", False),)
    canonical = staticmethod(torch.relu)
    upstream = "BatchReLuPreGradFusion (batch_relu)"
    description = "Fuse independent same-shape relu ops into one relu over a stacked input."
    preconditions = (
        "relu as torch.relu, F.relu or Tensor.relu (nn.ReLU inlines to F.relu)",
        "not in place",
        "same input shape, dtype and device; no in-place write to output or input; members independent",
    )
    refuse = staticmethod(_not_inplace)


@register
class BatchTanh(BatchUnary):
    """``tanh(x_i)`` -> ``unbind(tanh(stack(x_i)))``; every spelling, where upstream matches ``torch.tanh`` only."""

    pipeline_order = 3
    name, op = "batch_tanh", "tanh"
    functions, methods = frozenset(TANH[0]), frozenset(TANH[1])
    canonical = staticmethod(torch.tanh)
    upstream = "BatchTanhPreGradFusion (batch_tanh)"
    description = "Fuse independent same-shape tanh ops into one tanh over a stacked input."
    preconditions = (
        "tanh as torch.tanh, F.tanh or Tensor.tanh (nn.Tanh inlines to these)",
        "same input shape, dtype and device; no in-place write to output or input; members independent",
    )


@register
class BatchSigmoid(BatchUnary):
    """``sigmoid(x_i)`` -> ``unbind(sigmoid(stack(x_i)))``; every spelling, where upstream matches ``torch.sigmoid``
    only."""

    pipeline_order = 4
    name, op = "batch_sigmoid", "sigmoid"
    functions, methods = frozenset(SIGMOID[0]), frozenset(SIGMOID[1])
    canonical = staticmethod(torch.sigmoid)
    upstream = "BatchSigmoidPreGradFusion (batch_sigmoid)"
    description = "Fuse independent same-shape sigmoid ops into one sigmoid over a stacked input."
    preconditions = (
        "sigmoid as torch.sigmoid, F.sigmoid or Tensor.sigmoid (nn.Sigmoid inlines to these)",
        "same input shape, dtype and device; no in-place write to output or input; members independent",
    )


@register
class BatchDetach(BatchUnary):
    """``detach(x_i)`` -> ``unbind(detach(stack(x_i)))``. The outputs carry no gradient, before and after."""

    pipeline_order = 6
    name, op = "batch_detach", "detach"
    functions, methods = frozenset({torch.detach}), frozenset({"detach"})
    canonical = staticmethod(torch.detach)
    upstream = "BatchMathOpsPreGradFusion (batch_detach)"
    description = "Fuse independent same-shape detach ops into one detach over a stacked input."
    preconditions = (
        "torch.detach or Tensor.detach",
        "same input shape, dtype and device; no in-place write to the output, the input or any "
        "tensor sharing their storage (detach returns an alias); members independent",
    )


@register
class BatchNanToNum(BatchUnary):
    """``nan_to_num(x_i, nan, posinf, neginf)`` -> one nan_to_num over ``stack(x_i)``. The replacement values
    are keyed in canonical form; upstream keys ``str(kwargs)`` and drops positional ones."""

    pipeline_order = 7
    name, op = "batch_nan_to_num", "nan_to_num"
    functions, methods = frozenset({torch.nan_to_num}), frozenset({"nan_to_num"})
    params = (("nan", 0.0), ("posinf", None), ("neginf", None))
    canonical = staticmethod(torch.nan_to_num)
    upstream = "BatchMathOpsPreGradFusion (batch_nan_to_num)"
    description = "Fuse independent same-shape nan_to_num ops with equal replacement values into one."
    preconditions = (
        "torch.nan_to_num or Tensor.nan_to_num; no out=",
        "nan, posinf, neginf constants, equal in the group whether given by position or keyword",
        "same input shape, dtype and device; no in-place write to output or input; members independent",
    )


@register
class BatchClamp(BatchUnary):
    """``clamp(x_i, min, max)`` -> one clamp over ``stack(x_i)``. Bounds are keyed in canonical form, so
    ``clamp(x, -1, 1)`` joins ``clamp(x, min=-1, max=1)``; upstream drops positional bounds."""

    pipeline_order = 8
    name, op = "batch_clamp", "clamp"
    functions, methods = frozenset({torch.clamp, torch.clip}), frozenset({"clamp", "clip"})
    params = (("min", None), ("max", None))
    canonical = staticmethod(torch.clamp)
    upstream = "BatchMathOpsPreGradFusion (batch_clamp)"
    description = "Fuse independent same-shape clamps with equal bounds into one clamp over a stacked input."
    preconditions = (
        "torch.clamp / torch.clip or the Tensor methods; no out=",
        "min and max are constants (not tensors), equal in the group whether given by position or keyword",
        "same input shape, dtype and device and output dtype; no in-place write to output or input; "
        "members independent",
    )


@register
class BatchDropout(BatchUnary):
    """``dropout(x_i, p, training=False)`` -> one dropout over ``stack(x_i)``. Training-mode dropout is not
    fused (upstream fuses it): one mask for the stack draws the random stream differently from one
    mask per member, which seeded verification cannot vouch for (see the module docstring)."""

    pipeline_order = 9
    name, op = "batch_dropout", "dropout"
    functions, methods = frozenset({F.dropout}), frozenset()
    params = (("p", 0.5), ("training", True), ("inplace", False))
    canonical = staticmethod(F.dropout)
    upstream = "BatchMathOpsPreGradFusion (batch_dropout)"
    description = "Fuse independent same-shape eval-mode dropouts (training=False) into one dropout."
    preconditions = (
        "F.dropout (nn.Dropout inlines to it)",
        "training=False given explicitly (by position or keyword): in training mode the fused op "
        "would draw one mask for the stack instead of one per member, a different random stream",
        "not in place; p a constant, equal in the group",
        "same input shape, dtype and device; no in-place write to the output, the input or any "
        "tensor sharing their storage; members independent",
    )

    @staticmethod
    def refuse(args: dict) -> Miss | None:
        if args["training"] is not False:
            return Miss("dropout in training mode (one mask for the stack is a different random stream)")
        return _not_inplace(args)
