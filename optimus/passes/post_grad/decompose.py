"""``decompose_mm_pass`` on ATen graphs (upstream:
torch/_inductor/fx_passes/decompose_mem_bound_mm.py) and ``group_linear`` (upstream's
``GroupLinearFusion``, fbgemm's grouped GEMM).

``decompose_mm`` / ``decompose_addmm`` / ``decompose_bmm`` rewrite a memory-bound matrix
product as a broadcast multiply and a sum (``mm(a, b)`` -> ``sum(unsqueeze(a, 2) *
unsqueeze(b, 0), [1])``), which Inductor fuses with its neighbours. Where: upstream's
thresholds, per device type (both operands on it):

* CUDA / XPU: ``mm`` / ``addmm`` when ``M >= min_first_dimension_decomposition`` (10240)
  and ``K, N < max_other_dimension_decomposition`` (32); ``bmm`` when the batch is at
  least 10240 and two of ``m, k, n`` are below 32;
* CPU: ``mm`` / ``addmm`` when ``M <= cpu_max_first_dimension_decomposition`` (1) and
  ``K, N <= cpu_max_other_dimension_decomposition`` (2048); ``bmm`` when the batch is at
  most 1.

The thresholds are the pass's options (upstream reads them once, when its module is first
imported, so a later ``post_grad_fusion_options`` change is ignored there). ``addmm`` with
``beta`` or ``alpha`` other than 1 is refused (upstream's replacement drops them). Sizes
must be static (upstream's ``skip_dynamic_shape_dim_check`` is not offered).
"""

from __future__ import annotations

import copy
import operator

import torch
from torch.fx import Node

from optimus_lens.core.miss import Miss, need
from optimus_lens.core.pattern import AnchoredPattern, BatchPattern, Match, register
from optimus_lens.core.rewriter import Rewriter
from optimus_lens.passes.common import fusion_key, fusion_miss
from optimus_lens.passes.post_grad.common import ADD, ADDMM, BMM, MM, MUL, SUM, UNSQUEEZE, schema_args, static_shape

POST_GRAD = "post-grad"

#: upstream's defaults (decompose_mem_bound_mm.py)
THRESHOLDS = {
    "min_first_dimension_decomposition": 10240,
    "max_other_dimension_decomposition": 32,
    "cpu_max_first_dimension_decomposition": 1,
    "cpu_max_other_dimension_decomposition": 2048,
}


class _Decompose(AnchoredPattern):
    """Common part: the thresholds (:data:`THRESHOLDS`, replaced by :meth:`configured`)."""

    stage = POST_GRAD
    thresholds = THRESHOLDS

    def configured(self, options: dict):
        """A copy with ``options``' thresholds (the keys of :data:`THRESHOLDS`; others ignored).
        Raises ValueError for a threshold that is not a non-negative int."""
        c = copy.copy(self)
        c.thresholds = dict(self.thresholds)
        for k in THRESHOLDS:
            if k in options:
                v = options[k]
                if type(v) is not int or v < 0:
                    raise ValueError(f"decompose_mm_pass option {k} must be a non-negative int, not {v!r}")
                c.thresholds[k] = v
        return c

    def _device(self, a: Node, b: Node) -> str | Miss:
        from optimus_lens.core import meta

        da, db = meta.tensor(a).device.type, meta.tensor(b).device.type  # type: ignore[union-attr]
        if da != db:
            return Miss(f"operands on {da} and {db}")
        if da not in ("cpu", "cuda", "xpu"):
            return Miss(f"operands on {da}: upstream decomposes on cpu, cuda and xpu only")
        return "gpu" if da in ("cuda", "xpu") else "cpu"

    def _mm_ok(self, a: Node, b: Node) -> Miss | None:
        sa, sb = need(static_shape(a)), need(static_shape(b))
        if len(sa) != 2 or len(sb) != 2:
            return Miss("operands are not 2-D")
        dev = need(self._device(a, b))
        t = self.thresholds
        (m, k), n = sa, sb[1]
        if dev == "gpu":
            if m < t["min_first_dimension_decomposition"]:
                return Miss(f"M = {m} < min_first_dimension_decomposition = {t['min_first_dimension_decomposition']}")
            if k >= t["max_other_dimension_decomposition"] or n >= t["max_other_dimension_decomposition"]:
                return Miss(f"K = {k}, N = {n}: both must be < {t['max_other_dimension_decomposition']}")
            return None
        if m > t["cpu_max_first_dimension_decomposition"]:
            return Miss(
                f"M = {m} > cpu_max_first_dimension_decomposition = {t['cpu_max_first_dimension_decomposition']} (CPU)"
            )
        if k > t["cpu_max_other_dimension_decomposition"] or n > t["cpu_max_other_dimension_decomposition"]:
            return Miss(f"K = {k}, N = {n}: both must be <= {t['cpu_max_other_dimension_decomposition']} (CPU)")
        return None


def _product(rw: Rewriter, a: Node, b: Node, batched: bool) -> Node:
    """``sum(a[..., :, :, None] * b[..., None, :, :], -2)`` of ``a`` (.., M, K), ``b`` (.., K, N)."""
    d = 1 if batched else 0
    prod = rw.call(MUL, rw.call(UNSQUEEZE, a, d + 2), rw.call(UNSQUEEZE, b, d))
    return rw.call(SUM, prod, [d + 1])


@register
class DecomposeMm(_Decompose):
    """``mm(a, b)`` -> ``sum(unsqueeze(a, 2) * unsqueeze(b, 0), [1])`` where memory bound."""

    name = "decompose_mm"
    anchors = frozenset({MM})
    upstream = "decompose_mm (decompose_mm_pass)"
    description = "Rewrite a small (memory-bound) aten.mm as a broadcast multiply and a sum."
    preconditions = (
        "aten.mm of 2-D operands with static sizes on one device",
        "CPU: M <= 1 and K, N <= 2048; CUDA/XPU: M >= 10240 and K, N < 32 (the pass's options)",
    )

    def find(self, node: Node):
        a = need(schema_args(node))
        x, w = a["self"], a["mat2"]
        return self._mm_ok(x, w) or fusion_miss(node) or Match(node, [node], {"a": x, "b": w})

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        with rw.inserting_before(m.anchor):
            y = _product(rw, m.info["a"], m.info["b"], False)
        rw.carry_meta(m.anchor, y)
        rw.replace_all_uses(m.anchor, y)
        rw.erase(m.anchor)


@register
class DecomposeAddmm(_Decompose):
    """``addmm(bias, a, b)`` -> ``sum(unsqueeze(a, 2) * unsqueeze(b, 0), [1]) + bias``."""

    name = "decompose_addmm"
    anchors = frozenset({ADDMM})
    upstream = "decompose_addmm (decompose_mm_pass)"
    description = "Rewrite a small (memory-bound) aten.addmm as a broadcast multiply, a sum and an add."
    preconditions = (
        "aten.addmm with beta = alpha = 1 (upstream's replacement drops them)",
        "the mm thresholds of decompose_mm on mat1, mat2",
    )

    def find(self, node: Node):
        a = need(schema_args(node))
        if a["beta"] != 1 or a["alpha"] != 1:
            return Miss(f"addmm with beta={a['beta']}, alpha={a['alpha']}: the decomposition has neither")
        x, w = a["mat1"], a["mat2"]
        miss = self._mm_ok(x, w) or fusion_miss(node)
        return miss or Match(node, [node], {"bias": a["self"], "a": x, "b": w})

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        with rw.inserting_before(m.anchor):
            y = rw.call(ADD, _product(rw, m.info["a"], m.info["b"], False), m.info["bias"])
        rw.carry_meta(m.anchor, y)
        rw.replace_all_uses(m.anchor, y)
        rw.erase(m.anchor)


@register
class DecomposeBmm(_Decompose):
    """``bmm(a, b)`` -> ``sum(unsqueeze(a, 3) * unsqueeze(b, 1), [2])`` where memory bound."""

    name = "decompose_bmm"
    anchors = frozenset({BMM})
    upstream = "decompose_bmm (decompose_mm_pass)"
    description = "Rewrite a small-batch (CPU) or huge-batch thin (GPU) aten.bmm as a broadcast multiply and a sum."
    preconditions = (
        "aten.bmm of 3-D operands with static sizes on one device",
        "CPU: batch <= 1; CUDA/XPU: batch >= 10240 and two of m, k, n < 32",
    )

    def find(self, node: Node):
        a = need(schema_args(node))
        x, w = a["self"], a["mat2"]
        sa, sb = need(static_shape(x)), need(static_shape(w))
        if len(sa) != 3 or len(sb) != 3:
            return Miss("operands are not 3-D")
        dev = need(self._device(x, w))
        t = self.thresholds
        if dev == "gpu":
            small = sum(v < t["max_other_dimension_decomposition"] for v in (sa[1], sa[2], sb[2]))
            if sa[0] < t["min_first_dimension_decomposition"] or small < 2:
                return Miss(
                    f"batch {sa[0]} < {t['min_first_dimension_decomposition']} or fewer than two of m, k, n "
                    f"below {t['max_other_dimension_decomposition']}"
                )
        elif sa[0] > t["cpu_max_first_dimension_decomposition"] or sb[0] > t["cpu_max_first_dimension_decomposition"]:
            return Miss(
                f"batch {sa[0]} > cpu_max_first_dimension_decomposition = {t['cpu_max_first_dimension_decomposition']}"
            )
        return fusion_miss(node) or Match(node, [node], {"a": x, "b": w})

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        with rw.inserting_before(m.anchor):
            y = _product(rw, m.info["a"], m.info["b"], True)
        rw.carry_meta(m.anchor, y)
        rw.replace_all_uses(m.anchor, y)
        rw.erase(m.anchor)


# ------------------------------------------------------------------ group_linear


def gmm_missing() -> str | None:
    """Why fbgemm's grouped GEMM (``torch.ops.fbgemm.gmm``) cannot be used here, or None."""
    try:
        torch.ops.fbgemm.gmm.default  # noqa: B018 - the lookup is the test
    except (AttributeError, RuntimeError):
        return (
            "fbgemm's grouped GEMM (torch.ops.fbgemm.gmm) is not in this PyTorch (fbgemm_gpu is not installed); "
            "upstream then drops group_linear silently when its options say require_fbgemm, and fails the compile "
            "without it"
        )
    return None


MAX_GROUP_TENSOR_SIZE = 4096  # upstream's max_fuse_tensor_size_group_linear


@register
class GroupLinear(BatchPattern):
    """``y_i = mm(x_i, w_i)`` / ``addmm(b_i, x_i, w_i)`` of any shapes -> one fbgemm grouped
    GEMM, ``y_i = gmm(xs, ws, bs)[i]`` (upstream's ``GroupLinearFusion``): a CUDA kernel of
    fbgemm_gpu. Where fbgemm is absent (a stock PyTorch) or the operands are not on CUDA
    every node is refused with that reason."""

    stage = POST_GRAD
    name = "group_linear"
    anchors = frozenset({MM, ADDMM})
    upstream = "GroupLinearFusion (group_linear)"
    description = "Group independent ATen mm / addmm of any shapes into one fbgemm grouped GEMM (CUDA, fbgemm_gpu)."
    preconditions = (
        "torch.ops.fbgemm.gmm is available (fbgemm_gpu installed) and the operands are on CUDA",
        "aten.mm / aten.addmm (beta = alpha = 1) of 2-D operands, every size even and at most 4096",
        "bias present or absent alike in the group; no in-place write; members independent",
    )

    def key(self, node: Node):
        from optimus_lens.core import meta

        if node.op != "call_function" or node.target not in (MM, ADDMM):
            return Miss("not an aten.mm / aten.addmm node")
        missing = gmm_missing()
        if missing:
            return Miss(missing)
        a = schema_args(node)
        if isinstance(a, Miss):
            return a
        if node.target is ADDMM and (a["beta"] != 1 or a["alpha"] != 1):
            return Miss("addmm with beta or alpha other than 1")
        x, w = (a["mat1"], a["mat2"]) if node.target is ADDMM else (a["self"], a["mat2"])
        sx, sw = static_shape(x), static_shape(w)
        if isinstance(sx, Miss) or isinstance(sw, Miss) or len(sx) != 2 or len(sw) != 2:
            return Miss("operands are not 2-D with static sizes")
        if meta.tensor(x).device.type != "cuda":  # type: ignore[union-attr]
            return Miss("fbgemm's grouped GEMM runs on CUDA only; the operands are not on CUDA")
        if any(v % 2 or v > MAX_GROUP_TENSOR_SIZE for v in (*sx, *sw)):
            return Miss(f"sizes {list(sx)} x {list(sw)}: every size must be even and <= {MAX_GROUP_TENSOR_SIZE}")
        return fusion_key(node, (self.name, node.target is ADDMM))

    def fuse(self, rw: Rewriter, nodes: list[Node]) -> None:
        xs, ws, bs = [], [], []
        for n in nodes:
            a = schema_args(n)
            if n.target is ADDMM:
                bs.append(a["self"])  # type: ignore[index]
                xs.append(a["mat1"])  # type: ignore[index]
            else:
                xs.append(a["self"])  # type: ignore[index]
            ws.append(a["mat2"])  # type: ignore[index]
        with rw.inserting_before(nodes[0]):
            g = rw.create("call_function", torch.ops.fbgemm.gmm.default, (xs, ws, bs or None), {"smart_fused": True})
        for i, n in enumerate(nodes):
            with rw.inserting_before(g.next):
                piece = rw.call(operator.getitem, g, i)
            rw.carry_meta(n, piece)
            rw.replace_all_uses(n, piece)
            rw.erase(n)
