"""Post-grad horizontal batch fusions on ATen graphs (upstream: the ``pre_grad=False``
fusions of torch/_inductor/fx_passes/group_batch_fusion.py, ``POST_GRAD_FUSIONS``).

Each fuses independent same-shape ATen ops of a forward or backward graph into one op on
a stack (``cat`` of ``unsqueeze(x_i, 0)``, as upstream builds it) and hands member ``i``
``select(result, 0, i)``. Where this catalogue differs from upstream it is on purpose:

* every group key holds the operands' shapes, dtypes and devices: upstream's
  ``batch_linear_post_grad`` key has no dtype (an fp32 and a bf16 ``mm`` fuse, the stack
  promotes and every member comes out fp32) and its ``batch_aten_tanh/sigmoid/relu`` key
  neither dtype nor device;
* ``batch_aten_sub`` keeps ``alpha`` (upstream passes ``alpha`` to the fused op only for
  ``add``, so ``sub(x, y, alpha=2)`` becomes ``x - y``); ``alpha`` is in the key of both;
* ``addmm`` with ``beta`` or ``alpha`` other than 1 is refused with a reason (upstream
  refuses it too), and a member whose bias does not broadcast as ``(N,)`` or ``(M, N)`` is
  refused; the bias is added by one ``baddbmm`` over the stacked biases instead of one
  ``add`` per member;
* the binary fusions also take a Python number as one operand (``add(var, 1e-5)`` of the
  layer norms a model's towers decompose into, ``sub(1, tanh(x) ** 2)`` of tanh's
  backward), equal in the group; upstream only fuses two tensors of one shape;
* no member may write in place, or read or produce a tensor written in place
  (:func:`optimus_lens.passes.common.mutation_miss`, on the ops' schemas).
"""

from __future__ import annotations

from typing import Any

from torch.fx import Node

from optimus_lens.core import meta
from optimus_lens.core.miss import Miss
from optimus_lens.core.pattern import BatchPattern, register
from optimus_lens.core.rewriter import Rewriter
from optimus_lens.passes.common import fusion_key, tensor_key
from optimus_lens.passes.post_grad.common import (
    ADDMM,
    BMM,
    MM,
    UNSQUEEZE,
    aten,
    hand_out,
    in_piece_order,
    schema_args,
    stack0,
    static_shape,
)

POST_GRAD = "post-grad"


@register
class BatchLinearPostGrad(BatchPattern):
    """``y_i = mm(x_i, w_i)`` / ``addmm(b_i, x_i, w_i)`` for n independent same-shape
    matrix products -> ``Y = bmm(stack(x_i), stack(w_i))`` (``baddbmm`` over the stacked
    biases with a bias), ``y_i = select(Y, 0, i)``.

    Shapes: x_i (M, K), w_i (K, N), b_i (N,) or (M, N) -> X (n, M, K), W (n, K, N),
    B (n, 1, N) or (n, M, N), Y (n, M, N). In a backward graph the weight and input
    gradients of parallel linears (towers) are such products.
    """

    stage = POST_GRAD
    name = "batch_linear_post_grad"
    anchors = frozenset({MM, ADDMM})
    upstream = "PostGradBatchLinearFusion (batch_linear_post_grad)"
    description = "Fuse independent same-shape ATen mm / addmm into one bmm (baddbmm with biases)."
    preconditions = (
        "aten.mm(x, w) or aten.addmm(b, x, w) with beta = alpha = 1; x and w 2-D with static sizes",
        "the bias broadcasts as (N,) or is (M, N)",
        "same form, operand shapes, dtypes and devices in the group (upstream's key has no dtype)",
        "no in-place write to the output, a view of it, or an input; members independent",
    )

    def operands(self, node: Node) -> tuple[Node | None, Node, Node] | Miss:
        """(bias or None, x, w) of an mm / addmm node, or why it is not one this fuses."""
        a = schema_args(node)
        if isinstance(a, Miss):
            return a
        if node.target is MM:
            return None, a["self"], a["mat2"]
        if node.target is not ADDMM:
            return Miss("not an aten.mm / aten.addmm node")
        if a["beta"] != 1 or a["alpha"] != 1:
            return Miss(f"addmm with beta={a['beta']}, alpha={a['alpha']} (only 1, 1 is fused)")
        return a["self"], a["mat1"], a["mat2"]

    def key(self, node: Node):
        o = self.operands(node)
        if isinstance(o, Miss):
            return o
        b, x, w = o
        if not (isinstance(x, Node) and isinstance(w, Node)):
            return Miss("an operand is not a tensor node")
        xs, ws = static_shape(x), static_shape(w)
        for s in (xs, ws):
            if isinstance(s, Miss):
                return s
        bias = None
        if b is not None:
            bs = static_shape(b) if isinstance(b, Node) else Miss("the bias is not a tensor node")
            if isinstance(bs, Miss):
                return bs
            if bs not in ((ws[1],), (xs[0], ws[1])):
                return Miss(f"bias of shape {list(bs)}: only (N,) = ({ws[1]},) or (M, N) = {[xs[0], ws[1]]} is fused")
            bias = tensor_key(b)
        return fusion_key(node, (self.name, node.target is ADDMM, tensor_key(x), tensor_key(w), bias))

    def fuse(self, rw: Rewriter, nodes: list[Node]) -> None:
        nodes = in_piece_order(nodes, [self.operands(n)[1] for n in nodes])  # type: ignore[index]
        ops = [self.operands(n) for n in nodes]
        with rw.inserting_before(nodes[0]):
            x = stack0(rw, [o[1] for o in ops])  # type: ignore[index]
            w = stack0(rw, [o[2] for o in ops])  # type: ignore[index]
            if ops[0][0] is None:  # type: ignore[index]
                y = rw.call(BMM, x, w)
            else:
                bias = [o[0] for o in ops]  # type: ignore[index]
                b = stack0(rw, bias)
                if len(meta.shape(bias[0])) == 1:
                    b = rw.call(UNSQUEEZE, b, 1)
                y = rw.call(aten.baddbmm.default, b, x, w)
        hand_out(rw, nodes, y)


class BatchAtenUnary(BatchPattern):
    """``y_i = op(x_i)`` -> ``Y = op(stack(x_i))``, ``y_i = select(Y, 0, i)`` for an
    elementwise ATen op of one tensor argument. Shapes: x_i (...) -> X (n, ...)."""

    stage = POST_GRAD
    op: Any = None

    @property
    def anchors(self) -> frozenset:  # type: ignore[override]
        return frozenset({self.op})

    def key(self, node: Node):
        if node.op != "call_function" or node.target is not self.op:
            return Miss(f"not an {self.op} node")
        a = schema_args(node)
        if isinstance(a, Miss):
            return a
        x = a["self"]
        if not isinstance(x, Node) or meta.tensor(x) is None or meta.tensor(node) is None:
            return Miss("the input or the output has no tensor value (meta['val'])")
        s = static_shape(x)
        if isinstance(s, Miss):
            return s
        return fusion_key(node, (self.name, tensor_key(x), meta.tensor(node).dtype))

    def fuse(self, rw: Rewriter, nodes: list[Node]) -> None:
        nodes = in_piece_order(nodes, [schema_args(n)["self"] for n in nodes])  # type: ignore[index]
        with rw.inserting_before(nodes[0]):
            y = rw.call(self.op, stack0(rw, [schema_args(n)["self"] for n in nodes]))  # type: ignore[index]
        hand_out(rw, nodes, y)


def _unary_pre(word: str) -> tuple[str, ...]:
    return (
        f"aten.{word}.default with a tensor input of static sizes",
        "same input shape, dtype and device in the group (upstream's key has neither dtype nor device)",
        "no in-place write to the output or input; members independent",
    )


@register
class BatchAtenTanh(BatchAtenUnary):
    """``tanh(x_i)`` -> ``select(tanh(stack(x_i)), 0, i)``."""

    name, op = "batch_aten_tanh", aten.tanh.default
    upstream = "BatchTanhPostGradFusion (batch_aten_tanh)"
    description = "Fuse independent same-shape ATen tanh ops into one tanh over a stacked input."
    preconditions = _unary_pre("tanh")


@register
class BatchAtenSigmoid(BatchAtenUnary):
    """``sigmoid(x_i)`` -> ``select(sigmoid(stack(x_i)), 0, i)``."""

    name, op = "batch_aten_sigmoid", aten.sigmoid.default
    upstream = "BatchSigmoidPostGradFusion (batch_aten_sigmoid)"
    description = "Fuse independent same-shape ATen sigmoid ops into one sigmoid over a stacked input."
    preconditions = _unary_pre("sigmoid")


@register
class BatchAtenRelu(BatchAtenUnary):
    """``relu(x_i)`` -> ``select(relu(stack(x_i)), 0, i)``."""

    name, op = "batch_aten_relu", aten.relu.default
    upstream = "BatchReLuPostGradFusion (batch_aten_relu)"
    description = "Fuse independent same-shape ATen relu ops into one relu over a stacked input."
    preconditions = _unary_pre("relu")


class BatchAtenBinary(BatchPattern):
    """``y_i = op(a_i, b_i)`` -> ``Y = op(stack(a_i), stack(b_i))`` (``alpha`` kept for
    add and sub), ``y_i = select(Y, 0, i)``, for an ATen ``add`` / ``sub`` / ``mul`` /
    ``div`` of two same-shape tensors; either operand may instead be a Python number,
    equal in the group (it is then passed to the fused op as it is).

    Shapes: a_i, b_i (...) -> (n, ...)."""

    stage = POST_GRAD
    op: Any = None
    has_alpha = False

    @property
    def anchors(self) -> frozenset:  # type: ignore[override]
        return frozenset({self.op})

    def operands(self, node: Node) -> tuple[Any, Any, Any] | Miss:
        if node.op != "call_function" or node.target is not self.op:
            return Miss(f"not an {self.op} node")
        a = schema_args(node)
        if isinstance(a, Miss):
            return a
        return a["self"], a["other"], a.get("alpha", 1)

    def key(self, node: Node):
        o = self.operands(node)
        if isinstance(o, Miss):
            return o
        x, y, alpha = o
        tensors = [v for v in (x, y) if isinstance(v, Node)]
        if not tensors:
            return Miss("both operands are numbers")
        for v in (x, y):
            if not isinstance(v, (Node, bool, int, float)):
                return Miss(f"an operand is a {type(v).__name__}, not a tensor node or a number")
        shapes = [static_shape(v) for v in tensors]
        for s in shapes:
            if isinstance(s, Miss):
                return s
        if len(tensors) == 2 and shapes[0] != shapes[1]:
            return Miss(f"operands of shapes {list(shapes[0])} and {list(shapes[1])}: only equal shapes are fused")
        if not isinstance(alpha, (bool, int, float)):
            return Miss("alpha is not a number")

        def part(v: Any) -> Any:
            return tensor_key(v) if isinstance(v, Node) else ("number", type(v).__name__, v)

        return fusion_key(node, (self.name, part(x), part(y), alpha, meta.tensor(node).dtype))

    def fuse(self, rw: Rewriter, nodes: list[Node]) -> None:
        ops = [self.operands(n) for n in nodes]
        lead = 0 if isinstance(ops[0][0], Node) else 1  # type: ignore[index]
        nodes = in_piece_order(nodes, [o[lead] for o in ops])  # type: ignore[index]
        ops = [self.operands(n) for n in nodes]
        x0, y0, alpha = ops[0]  # type: ignore[misc]
        with rw.inserting_before(nodes[0]):
            x = stack0(rw, [o[0] for o in ops]) if isinstance(x0, Node) else x0  # type: ignore[index]
            y = stack0(rw, [o[1] for o in ops]) if isinstance(y0, Node) else y0  # type: ignore[index]
            kwargs = {"alpha": alpha} if self.has_alpha and alpha != 1 else {}
            z = rw.call(self.op, x, y, **kwargs)
        hand_out(rw, nodes, z)


def _binary_pre(word: str, alpha: bool) -> tuple[str, ...]:
    return (
        f"aten.{word}.Tensor of two tensors of one shape with static sizes, or of a tensor and a number",
        "same operand shapes, dtypes and devices in the group"
        + (", and the same alpha (kept in the fused op; upstream drops it for sub)" if alpha else ""),
        "no in-place write to the output or an input; members independent",
    )


@register
class BatchAtenAdd(BatchAtenBinary):
    """``add(a_i, b_i, alpha)`` -> ``select(add(stack(a_i), stack(b_i), alpha), 0, i)``."""

    name, op, has_alpha = "batch_aten_add", aten.add.Tensor, True
    upstream = "BatchAddPostGradFusion (batch_aten_add)"
    description = "Fuse independent same-shape ATen add ops into one add over stacked operands."
    preconditions = _binary_pre("add", True)


@register
class BatchAtenSub(BatchAtenBinary):
    """``sub(a_i, b_i, alpha)`` -> ``select(sub(stack(a_i), stack(b_i), alpha), 0, i)``: ``alpha``
    kept (upstream's ``BatchSubPostGradFusion`` drops it)."""

    name, op, has_alpha = "batch_aten_sub", aten.sub.Tensor, True
    upstream = "BatchSubPostGradFusion (batch_aten_sub)"
    description = "Fuse independent same-shape ATen sub ops into one sub over stacked operands, alpha kept."
    preconditions = _binary_pre("sub", True)


@register
class BatchAtenMul(BatchAtenBinary):
    """``mul(a_i, b_i)`` -> ``select(mul(stack(a_i), stack(b_i)), 0, i)``."""

    name, op = "batch_aten_mul", aten.mul.Tensor
    upstream = "BatchMulPostGradFusion (batch_aten_mul)"
    description = "Fuse independent same-shape ATen mul ops into one mul over stacked operands."
    preconditions = _binary_pre("mul", False)


@register
class BatchAtenDiv(BatchAtenBinary):
    """``div(a_i, b_i)`` -> ``select(div(stack(a_i), stack(b_i)), 0, i)`` (``aten.div.Tensor``:
    true division; ``div.Tensor_mode`` is another op)."""

    name, op = "batch_aten_div", aten.div.Tensor
    upstream = "BatchDivPostGradFusion (batch_aten_div)"
    description = "Fuse independent same-shape ATen div ops into one div over stacked operands."
    preconditions = _binary_pre("div", False)


#: our post-grad batch fusions in upstream's registration order (group_batch_fusion.py)
POST_GRAD_BATCH = [
    "batch_linear_post_grad",
    "batch_aten_tanh",
    "batch_aten_sigmoid",
    "batch_aten_relu",
    "batch_aten_add",
    "batch_aten_sub",
    "batch_aten_div",
    "batch_aten_mul",
]
