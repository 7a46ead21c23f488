"""Normalisation (upstream ``normalization_pass``, torch/_inductor/fx_passes/split_cat.py):
rewrite split / unbind / cat / stack into one canonical keyword form, so later patterns
and people reading the graph meet one spelling.

Canonical forms (``d`` non-negative, sizes read from the example values)::

    torch.split(x, [s0, s1, ...], dim=d)      # x.split(2, -1), torch.functional.split, ...
    torch.unbind(x, dim=d)                    # x.unbind(-1), torch.unbind(x, 1)
    torch.cat(tensors, dim=d)                 # torch.concat, torch.concatenate, axis=
    torch.stack(tensors, dim=d)

A node already in canonical form is left alone (upstream rewrites and counts every
unbind and stack, even canonical ones). An uneven split keeps its true sizes:
``split(x, 4, dim=1)`` on width 10 becomes ``[4, 4, 2]``. The rewrite creates a new node
with the old node's metadata (example value, source, module path) and rewires its uses.
"""

from __future__ import annotations

import torch
from torch.fx import Node

from optimus_lens.core import meta
from optimus_lens.core.miss import Miss, need
from optimus_lens.core.pattern import AnchoredPattern, Match, register
from optimus_lens.core.rewriter import Rewriter
from optimus_lens.passes.common import CAT, SPLIT, STACK, UNBIND, arg, dim_of
from optimus_lens.passes.split_cat.analysis import computed_size

ALREADY = Miss("already in canonical form")


class Normalize(AnchoredPattern):
    """Base: ``canonical(node)`` returns ``(target, args, kwargs)`` of the canonical node
    or a Miss; the rewrite happens only when that differs from the node."""

    def canonical(self, node: Node):
        raise NotImplementedError

    def find(self, node: Node):
        target, args, kwargs = need(self.canonical(node))
        if node.op == "call_function" and node.target is target and _same(node.args, args) and node.kwargs == kwargs:
            return ALREADY
        return Match(node, [node], {"target": target, "args": args, "kwargs": kwargs})

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        old = m.anchor
        with rw.inserting_before(old):
            new = rw.create("call_function", m.info["target"], m.info["args"], m.info["kwargs"], infer=False)
        for k, v in old.meta.items():
            rw.set_meta(new, k, v)
        rw.replace_all_uses(old, new)
        rw.erase(old)


def _same(a, b) -> bool:
    """Equal arguments, comparing nodes by identity; a list and a tuple of the same items
    count as equal (rewriting one into the other changes nothing)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.fx.Node) or isinstance(b, torch.fx.Node):
        return a is b
    return type(a) is type(b) and a == b


def _input(node: Node, *names: str):
    if node.args:
        return node.args[0]
    for k in names:
        if k in node.kwargs:
            return node.kwargs[k]
    return None


@register
class NormalizeSplit(Normalize):
    """``x.split(2, -1)`` / ``torch.split(x, 2, dim=-1)`` -> ``torch.split(x, [2, 2, ...], dim=d)``.

    Sizes are the pieces' sizes along ``d`` in the example value, so an uneven split keeps
    its short last piece (``split(x, 4, 1)`` on width 10 -> ``[4, 4, 2]``).
    """

    name = "normalize_split"
    upstream = "normalization_pass (normalize_split_default)"
    description = "Rewrite a split into torch.split(x, [sizes], dim=d >= 0)."
    preconditions = (
        "torch.split / torch.functional.split / Tensor.split / x.split(...)",
        "the split and its input have example values with static sizes",
        "the split size is a constant, not computed from the inputs (x.size(1) // 2 stays symbolic)",
        "not already torch.split(x, [sizes], dim=d >= 0)",
    )
    anchors = frozenset(SPLIT[0]) | frozenset(SPLIT[1])

    def canonical(self, node: Node):
        x = _input(node, "tensor", "self", "input")
        xt, v = meta.tensor(x), meta.value(node)
        if xt is None or not isinstance(v, (list, tuple)):
            return Miss("split or its input has no example value")
        d = dim_of(arg(node, 2, "dim", 0), xt.dim())
        if d is None:
            return Miss("dim is not a static int")
        computed = computed_size(node)
        if computed:
            return computed
        sizes = [t.shape[d] for t in v]
        if not all(type(s) is int for s in sizes):
            return Miss("section sizes are symbolic")
        return torch.split, (x, sizes), {"dim": d}


@register
class NormalizeUnbind(Normalize):
    """``x.unbind(-1)`` / ``torch.unbind(x, 1)`` -> ``torch.unbind(x, dim=d)``."""

    name = "normalize_unbind"
    upstream = "normalization_pass (normalize_unbind_default)"
    description = "Rewrite an unbind into torch.unbind(x, dim=d >= 0)."
    preconditions = (
        "torch.unbind / Tensor.unbind / x.unbind(...)",
        "the input has an example value",
        "not already torch.unbind(x, dim=d >= 0)",
    )
    anchors = frozenset(UNBIND[0]) | frozenset(UNBIND[1]) | {torch.Tensor.unbind}

    def canonical(self, node: Node):
        x = _input(node, "input", "self")
        xt = meta.tensor(x)
        if xt is None:
            return Miss("input has no example value")
        d = dim_of(arg(node, 1, "dim", node.kwargs.get("axis", 0)), xt.dim())
        if d is None:
            return Miss("dim is not a static int")
        return torch.unbind, (x,), {"dim": d}


class _NormalizeList(Normalize):
    """cat / stack: ``(tensors, dim)``, the rank taken from the node's own example value."""

    target = None

    def canonical(self, node: Node):
        tensors = arg(node, 0, "tensors")
        out = meta.tensor(node)
        if not isinstance(tensors, (list, tuple)):
            return Miss("tensors is not a list")
        if out is None:
            return Miss("no example value")
        d = dim_of(arg(node, 1, "dim", node.kwargs.get("axis", 0)), out.dim())
        if d is None:
            return Miss("dim is not a static int")
        return self.target, (list(tensors),), {"dim": d}


@register
class NormalizeCat(_NormalizeList):
    """``torch.concat(xs, -1)`` / ``torch.concatenate(xs, axis=1)`` -> ``torch.cat(xs, dim=d)``."""

    name = "normalize_cat"
    upstream = "normalization_pass (normalize_cat_default)"
    description = "Rewrite a cat/concat/concatenate into torch.cat(tensors, dim=d >= 0)."
    preconditions = (
        "torch.cat / torch.concat / torch.concatenate with a tensor list",
        "the cat has an example value",
        "not already torch.cat(tensors, dim=d >= 0)",
    )
    anchors = frozenset(CAT[0])
    target = torch.cat


@register
class NormalizeStack(_NormalizeList):
    """``torch.stack(xs, -1)`` -> ``torch.stack(xs, dim=d)``."""

    name = "normalize_stack"
    upstream = "normalization_pass (normalize_stack_default)"
    description = "Rewrite a stack into torch.stack(tensors, dim=d >= 0)."
    preconditions = (
        "torch.stack with a tensor list",
        "the stack has an example value",
        "not already torch.stack(tensors, dim=d >= 0)",
    )
    anchors = frozenset(STACK[0])
    target = torch.stack
