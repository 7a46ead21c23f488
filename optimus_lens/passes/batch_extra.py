"""Batch fusions beyond upstream's catalogue (``docs/parity.md`` lists them).

Upstream's pre-grad catalogue (torch/_inductor/fx_passes/group_batch_fusion.py) has no
fusion for these ops; they follow the same horizontal scheme as the unary fusions of
:mod:`optimus_lens.passes.batch` (stack the members' inputs, run the op once, hand each member
its slice) and run after them in the default pipeline (``EXTRA_BATCH_PASSES``).
``upstream_pipeline`` never runs them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.fx import Node

from optimus_lens.passes.batch import BatchUnary
from optimus_lens.passes.common import call, replace_with_getitems
from optimus_lens.pattern import Miss, register
from optimus_lens.rewriter import Rewriter

#: the default pipeline runs these after ``BATCH_PASSES``, one pass each
EXTRA_BATCH_PASSES = ["batch_normalize"]


@register
class BatchNormalize(BatchUnary):
    """``F.normalize(x_i, p, dim, eps)`` -> ``unbind(F.normalize(stack(x_i), p, dim', eps))``
    with ``dim' = dim + 1`` for a dim counted from the front (a negative dim is unchanged).

    Shapes: x_i (...) -> X (n, ...); each member's output a contiguous slice of the result.
    Retrieval towers L2-normalise each tower's embedding (``F.normalize(tower(x), dim=-1)``,
    a norm, a clamp and a division: three kernels per member) before their dot products.
    Upstream: no such fusion (a place where ours accepts more, ``docs/parity.md``).
    """

    name, op = "batch_normalize", "normalize"
    functions, methods = frozenset({F.normalize}), frozenset()
    params = (("p", 2.0), ("dim", 1), ("eps", 1e-12), ("out", None))
    canonical = staticmethod(F.normalize)
    upstream = "none (beyond upstream's catalogue; same scheme as BatchPointwiseOpsPreGradFusion)"
    description = "Fuse independent same-shape F.normalize calls into one normalize over a stacked input."
    preconditions = (
        "F.normalize with constant p, dim and eps; no out=",
        "same input shape, dtype and device, p, dim and eps in the group; no in-place write to output "
        "or input; members independent",
    )

    def refuse(self, args: dict) -> Miss | None:
        if args["out"] is not None:
            return Miss("out= is given")
        if not isinstance(args["dim"], int):
            return Miss("dim is not a constant int")
        return None

    def fuse(self, rw: Rewriter, nodes: list[Node]) -> None:
        a = self.bound(nodes[0])
        dim = a["dim"] + 1 if a["dim"] >= 0 else a["dim"]
        with rw.inserting_before(nodes[0]):
            x = call(rw, torch.stack, [self.bound(n)["input"] for n in nodes])
            y = call(rw, F.normalize, x, p=a["p"], dim=dim, eps=a["eps"])
            replace_with_getitems(rw, nodes, call(rw, torch.unbind, y))
