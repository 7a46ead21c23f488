"""The three pre-grad spellings of a linear layer and how to read their operands (what
``batch_linear`` and ``batch_linear_lhs`` group), and the identity of the value a linear reads.

Dynamo records ``nn.Linear`` as ``F.linear(x, W, b)``; HF GPT-2's ``Conv1D`` as
``torch.addmm(b, x, W)``; a bare weight product as ``x @ W`` / ``torch.matmul``.
:func:`linear_operands` reads each as ``y = x @ W' + b`` (:class:`LinearOperands`).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import Node

from optimus_lens.core import meta
from optimus_lens.core.miss import Miss
from optimus_lens.passes.common import LINEAR, REQUIRED, arg, bind_args, is_call

ADDMM = ({torch.addmm}, {"addmm"})
MATMUL = ({torch.matmul, operator.matmul}, {"matmul", "__matmul__"})


@dataclass(frozen=True)
class LinearOperands:
    """A linear in one of its three pre-grad spellings, as ``y = x @ W' + b``.

    ``form`` is "linear" (``F.linear(x, W, b)``, W is (N, K)), "addmm"
    (``torch.addmm(b, x, W)``, HF Conv1D, W is (K, N)) or "matmul" (``x @ W``, W is
    (K, N), no bias). x is (..., K), the output (..., N)."""

    form: str
    x: Node
    w: Node
    b: Node | None

    @property
    def weight_is_nk(self) -> bool:
        return self.form == "linear"

    @property
    def out_features(self) -> int:
        return meta.shape(self.w)[0 if self.weight_is_nk else 1]

    @property
    def in_features(self) -> int:
        return meta.shape(self.w)[1 if self.weight_is_nk else 0]


#: every target ``linear_operands`` accepts (the linear patterns' anchors)
LINEAR_LIKE = frozenset().union(*LINEAR, *ADDMM, *MATMUL)


_MEMO = "_optimus_linear"  # the node attribute holding (target, args, kwargs, input values, answer)


def linear_operands(node: Node) -> LinearOperands | Miss:
    """The operands of a linear-like node, or a Miss naming the failed condition.

    Accepted: ``torch._C._nn.linear`` / ``F.linear`` (one object); ``torch.addmm`` /
    ``Tensor.addmm`` with beta = alpha = 1; ``torch.matmul`` / ``@`` / ``Tensor.matmul``
    whose right operand is a placeholder or get_attr (a weight; Dynamo lifts parameters
    to placeholders). x must have rank >= 2 (addmm: exactly 2), W rank 2, the bias rank 1
    (or 2 for addmm).

    Memoised on the node while its target, arguments and its inputs' example values stay
    the same objects (the answer reads nothing else), as the effect memo is: both linear
    fusions key every linear at the start of their passes, and the fusion reads the
    operands again."""
    hit = node.__dict__.get(_MEMO)
    if hit is not None and hit[0] is node.target and hit[1] is node._args and hit[2] is node._kwargs:
        for a, i in zip(hit[3], node._input_nodes):
            if a is not meta.value(i):
                break
        else:
            return hit[4]
    got = _read_operands(node)
    values = tuple([meta.value(i) for i in node._input_nodes])
    object.__setattr__(node, _MEMO, (node.target, node._args, node._kwargs, values, got))  # not Node.__setattr__
    return got


def _read_operands(node: Node) -> LinearOperands | Miss:
    if is_call(node, *LINEAR):
        a = bind_args(node, (("input", REQUIRED), ("weight", REQUIRED), ("bias", None)))
        if isinstance(a, Miss):
            return a
        form, x, w, b = "linear", a["input"], a["weight"], a["bias"]
    elif is_call(node, *ADDMM):
        a = bind_args(node, (("input", REQUIRED), ("mat1", REQUIRED), ("mat2", REQUIRED), ("beta", 1), ("alpha", 1)))
        if isinstance(a, Miss):
            return a
        if a["beta"] != 1 or a["alpha"] != 1:
            return Miss("addmm with beta or alpha other than 1")
        form, x, w, b = "addmm", a["mat1"], a["mat2"], a["input"]
    elif is_call(node, *MATMUL):
        a = bind_args(node, (("input", REQUIRED), ("other", REQUIRED)))
        if isinstance(a, Miss):
            return a
        form, x, w, b = "matmul", a["input"], a["other"], None
        if not (isinstance(w, Node) and w.op in ("placeholder", "get_attr")):
            return Miss("matmul's right operand is not a weight (placeholder or get_attr)")
    else:
        return Miss("not a linear, addmm or matmul node")
    xt, wt = meta.tensor(x), meta.tensor(w)
    if xt is None or wt is None:
        return Miss("input or weight has no example value")
    if xt.dim() < 2 or wt.dim() != 2:
        return Miss(f"input must have rank >= 2 and weight be 2-D (got {xt.dim()}-D, {wt.dim()}-D)")
    if b is not None:
        bt = meta.tensor(b) if isinstance(b, Node) else None
        if bt is None:
            return Miss("bias is not a tensor node with an example value")
        if bt.dim() not in ((1, 2) if form == "addmm" else (1,)):
            return Miss(f"{bt.dim()}-D bias")
    return LinearOperands(form, x, w, b)


def linear_input(node: Node) -> Any:
    """The argument a linear-like node reads as x, read alone: ``input`` of ``F.linear``
    and ``matmul``, ``mat1`` of ``addmm``, by position or keyword, as
    :func:`linear_operands` binds them; so it is ``linear_operands(node).x`` wherever that
    is no Miss. None for another target."""
    if is_call(node, *LINEAR) or is_call(node, *MATMUL):
        return arg(node, 0, "input")
    if is_call(node, *ADDMM):
        return arg(node, 1, "mat1")
    return None


RESHAPES = ({torch.reshape}, {"view", "reshape"})


def value_id(x: Node) -> Any:
    """A hashable identity of the value ``x`` computes: the node itself, except that a
    reshape/view with constant sizes is identified by its source's identity and sizes.
    GPT-2's Conv1D writes ``x.view(-1, K)`` once per projection, so projections of one
    input read distinct but equal view nodes."""
    if not (is_call(x, *RESHAPES) and x.args and isinstance(x.args[0], Node) and not x.kwargs):
        return x
    sizes = tuple(d for a in x.args[1:] for d in (a if isinstance(a, (list, tuple)) else (a,)))
    if not all(isinstance(d, int) for d in sizes):
        return x
    return ("reshape", value_id(x.args[0]), sizes)
