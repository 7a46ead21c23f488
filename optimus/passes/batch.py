"""Horizontal batch fusions (upstream: torch/_inductor/fx_passes/group_batch_fusion.py).

Each pattern groups independent nodes of one op with equal shapes, dtype and device,
stacks their inputs along a new batch dimension, runs the op once, and unbinds the
result. Group keys always include dtype and device (upstream's post-grad linear key
does not, and fuses fp32 with bf16). Nodes with an in-place user are never fused: the
fused output is a view of the batched result, and a write into it would be a different
program.
"""
from __future__ import annotations

import torch
from torch.fx import Graph, Node

from optimus import meta
from optimus.pattern import BatchPattern, Miss, register
from optimus.passes.common import (LAYER_NORM, LINEAR, RELU, SIGMOID, TANH, arg, call, has_mutating_user,
                                   is_call, replace_with_getitems, tensor_key)

NOT_A = {}


def _miss_not(op: str) -> Miss:
    return NOT_A.setdefault(op, Miss(f"not a {op} node"))


@register
class BatchLinear(BatchPattern):
    """``y_i = linear(x_i, W_i, b_i)`` for n independent linears ->
    ``Y = baddbmm(stack(b_i).unsqueeze(1), stack(x_i), stack(W_i).transpose(1, 2))``
    (``bmm`` without bias), ``y_i = unbind(Y)[i]``.

    Shapes: x_i (M, K) [or (..., K), flattened to (M, K)], W_i (N, K), b_i (N,) ->
    X (n, M, K), W^T (n, K, N), Y (n, M, N).
    """

    name = "batch_linear"
    upstream = "PreGradBatchLinearFusion (batch_linear)"
    description = "Fuse independent same-shape linears into one batched matmul (baddbmm / bmm)."
    preconditions = (
        "call_function torch._C._nn.linear or F.linear (nn.Linear inlines to it)",
        "input has rank >= 2 and weight is 2-D, with example values",
        "same input shape, weight shape, bias presence, dtype and device in the group",
        "no user of the linear mutates its output in place",
        "members do not depend on each other",
    )

    def key(self, node: Node):
        if not is_call(node, *LINEAR):
            return _miss_not("linear")
        x, w, b = arg(node, 0, "input"), arg(node, 1, "weight"), arg(node, 2, "bias")
        xt, wt = meta.tensor(x), meta.tensor(w)
        if xt is None or wt is None:
            return Miss("input or weight has no example value")
        if xt.dim() < 2 or wt.dim() != 2:
            return Miss(f"input must have rank >= 2 and weight be 2-D (got {xt.dim()}-D, {wt.dim()}-D)")
        if b is not None and not isinstance(b, Node):
            return Miss("bias is not a tensor node")
        if has_mutating_user(node):
            return Miss("a user mutates the output in place")
        return ("linear", tensor_key(x), tensor_key(w), tensor_key(b))

    def fuse(self, graph: Graph, nodes: list[Node]) -> None:
        xs = [arg(n, 0, "input") for n in nodes]
        ws = [arg(n, 1, "weight") for n in nodes]
        bs = [arg(n, 2, "bias") for n in nodes]
        xshape = meta.shape(xs[0])
        k = xshape[-1]
        with graph.inserting_before(nodes[0]):
            x = call(graph, torch.stack, xs)
            if len(xshape) != 2:
                x = call(graph, torch.reshape, x, (len(nodes), -1, k))
            wt = call(graph, torch.transpose, call(graph, torch.stack, ws), 1, 2)
            if bs[0] is not None:
                b = call(graph, torch.unsqueeze, call(graph, torch.stack, bs), 1)
                y = call(graph, torch.baddbmm, b, x, wt)
            else:
                y = call(graph, torch.bmm, x, wt)
            if len(xshape) != 2:
                y = call(graph, torch.reshape, y, (len(nodes), *xshape[:-1], meta.shape(ws[0])[0]))
            replace_with_getitems(graph, nodes, call(graph, torch.unbind, y))


@register
class BatchLayerNorm(BatchPattern):
    """``y_i = layer_norm(x_i, ns, w_i, b_i, eps)`` ->
    ``Z = layer_norm(stack(x_i, dim=s), ns, eps=eps) * stack(w_i) + stack(b_i)``,
    ``y_i = unbind(Z, dim=s)[i]`` with ``s = rank(x) - len(ns)`` so the normalised
    dims stay last and the stacked (n, *ns) affine parameters broadcast.
    """

    name = "batch_layernorm"
    upstream = "BatchLayernormFusion (batch_layernorm)"
    description = "Fuse independent same-shape layer norms into one layer norm over a stacked input."
    preconditions = (
        "call_function F.layer_norm (nn.LayerNorm inlines to it)",
        "static normalized_shape and eps; weight/bias present or absent alike in the group",
        "same input shape, dtype and device in the group",
        "no user mutates the output in place; members independent",
    )

    def key(self, node: Node):
        if not is_call(node, *LAYER_NORM):
            return _miss_not("layer_norm")
        x = arg(node, 0, "input")
        ns = arg(node, 1, "normalized_shape")
        w, b, eps = arg(node, 2, "weight"), arg(node, 3, "bias"), arg(node, 4, "eps", 1e-5)
        if meta.tensor(x) is None:
            return Miss("input has no example value")
        if not isinstance(ns, (list, tuple)) or not all(isinstance(d, int) for d in ns):
            return Miss("normalized_shape is not a static tuple of ints")
        if not isinstance(eps, (int, float)):
            return Miss("eps is not a constant")
        for p in (w, b):
            if p is not None and not isinstance(p, Node):
                return Miss("weight or bias is not a tensor node")
        if has_mutating_user(node):
            return Miss("a user mutates the output in place")
        return ("layer_norm", tensor_key(x), tuple(ns), tensor_key(w), tensor_key(b), float(eps))

    def fuse(self, graph: Graph, nodes: list[Node]) -> None:
        n0 = nodes[0]
        ns = tuple(arg(n0, 1, "normalized_shape"))
        eps = arg(n0, 4, "eps", 1e-5)
        s = len(meta.shape(arg(n0, 0, "input"))) - len(ns)
        with graph.inserting_before(n0):
            z = call(graph, torch.nn.functional.layer_norm, call(graph, torch.stack, [arg(n, 0, "input") for n in nodes], s),
                     ns, eps=eps)
            if arg(n0, 2, "weight") is not None:
                z = call(graph, torch.mul, z, call(graph, torch.stack, [arg(n, 2, "weight") for n in nodes]))
            if arg(n0, 3, "bias") is not None:
                z = call(graph, torch.add, z, call(graph, torch.stack, [arg(n, 3, "bias") for n in nodes]))
            replace_with_getitems(graph, nodes, call(graph, torch.unbind, z, s))


class BatchPointwise(BatchPattern):
    """``y_i = op(x_i)`` -> ``Y = op(stack(x_i))``, ``y_i = unbind(Y)[i]`` for a unary
    pointwise op, in every spelling (``torch.op``, ``F.op``, ``Tensor.op``; nn modules
    inline to the functional form under Dynamo). Upstream matches only one spelling
    each (``torch.tanh``, ``torch.sigmoid``, ``F.relu``)."""

    op = ""
    functions: set = set()
    methods: set = set()

    def key(self, node: Node):
        if not is_call(node, self.functions, self.methods):
            return _miss_not(self.op)
        if node.kwargs.get("inplace") is True or (len(node.args) > 1 and node.args[1] is True):
            return Miss("in-place")
        x = node.args[0] if node.args else node.kwargs.get("input")
        if meta.tensor(x) is None:
            return Miss("input has no example value")
        if has_mutating_user(node):
            return Miss("a user mutates the output in place")
        return (self.op, tensor_key(x))

    def fuse(self, graph: Graph, nodes: list[Node]) -> None:
        with graph.inserting_before(nodes[0]):
            x = call(graph, torch.stack, [n.args[0] if n.args else n.kwargs["input"] for n in nodes])
            replace_with_getitems(graph, nodes, call(graph, torch.unbind, call(graph, self.canonical, x)))


def _pointwise(op: str, family: tuple, canonical, upstream: str) -> type:
    functions, methods = family
    cls = type(f"Batch{op.title()}", (BatchPointwise,), {
        "name": f"batch_{op}", "op": op, "functions": functions, "methods": methods,
        "canonical": staticmethod(canonical), "upstream": upstream,
        "description": f"Fuse independent same-shape {op} ops into one {op} over a stacked input.",
        "preconditions": (f"{op} as torch.{op}, F.{op} or Tensor.{op} (nn module forms inline to these)",
                          "not in place; same input shape, dtype and device; members independent"),
    })
    cls.__module__ = __name__
    return register(cls)


BatchRelu = _pointwise("relu", RELU, torch.relu, "BatchReLuPreGradFusion (batch_relu)")
BatchTanh = _pointwise("tanh", TANH, torch.tanh, "BatchTanhPreGradFusion (batch_tanh)")
BatchSigmoid = _pointwise("sigmoid", SIGMOID, torch.sigmoid, "BatchSigmoidPreGradFusion (batch_sigmoid)")
