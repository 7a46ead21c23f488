"""What a step buys: kernels saved and bytes copied per call, and a time estimate.

A horizontal fusion trades kernel launches for copies: n linears become one batched
matmul, but their inputs (and weights: parameters are graph inputs, so every call
re-stacks them) are copied into one ``stack``/``cat``. Whether that pays depends on the
sizes. The model here is deliberately simple, for eager execution:

* **kernels**: nodes that launch work, i.e. every call_function / call_method except
  views and tuple indexing (``getitem``, ``view``, ``reshape``, ``transpose``, ``split``,
  ``unbind``, ...: no data moves); a composite op counts the kernels it launches
  (``KERNELS``: ``F.normalize`` is three);
* **bytes copied**: the output bytes of ``stack`` / ``cat`` nodes (they materialise a copy);
* **estimate (us)** = kernels saved x ``KERNEL_US`` - bytes copied / ``BYTES_PER_US``,
  with ``KERNEL_US`` = 3 us (CPU eager dispatch of one op from an FX GraphModule) and
  ``BYTES_PER_US`` = 16000 (16 GB/s: a copy of a few hundred KiB, cache-resident, one
  core). Both were fitted to the per-pass changes ``benchmarks/real_models.py`` measures
  on its three samples (2-core CPU VM, torch 2.13); a step with a negative estimate is
  called unprofitable.

The estimate is per step: a fusion whose stacks a later cleanup step removes (an
``unbind`` then ``stack`` pair) can be unprofitable alone and profitable with the cleanup,
so :func:`pass_estimates` also sums the steps of each pass, and :func:`group_estimate`
charges nothing for a stack of every piece of one unbind in order (:func:`cancelled_stack`).

Both constants are CPU eager figures; on GPU launches cost more and copies less, so the
estimate is conservative there. :func:`step_estimate` reads a recorded Trace;
:func:`group_estimate` tries a fusion on a copy of the graph (the estimate the catalogue's
passes give the engine for the ``profitable_only`` search option).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.fx import GraphModule, Node

from optimus_lens.core import meta
from optimus_lens.core.engine import copy_graph
from optimus_lens.core.miss import Miss
from optimus_lens.core.record import target_name
from optimus_lens.core.rewriter import Rewriter
from optimus_lens.passes.split_cat.identities import REMOVE_UNBIND_STACK

KERNEL_US = 3.0
BYTES_PER_US = 16000.0
FREE = frozenset(
    {
        "getitem",
        "view",
        "reshape",
        "unflatten",
        "flatten",
        "transpose",
        "movedim",
        "permute",
        "squeeze",
        "unsqueeze",
        "split",
        "unbind",
        "expand",
        "narrow",
        "select",
        "chunk",
        "t",
        "size",
        "dim",
        "split_with_sizes",
        "view_as",
        "expand_as",
        "detach",
    }
)
COPIES = frozenset({"stack", "cat", "concat", "concatenate"})
#: composite ops: kernels one call launches in eager (the rest launch one). F.normalize is
#: a norm, a clamp_min and a division (torch/nn/functional.py)
KERNELS = {"normalize": 3}


@dataclass
class Estimate:
    """``kernels_saved`` (launches fewer per call), ``bytes_copied`` (more bytes copied by
    stack/cat per call; negative when copies are removed) and ``us`` (estimated time
    saved per call, microseconds; negative: a slowdown)."""

    kernels_saved: int
    bytes_copied: int

    @property
    def us(self) -> float:
        return self.kernels_saved * KERNEL_US - self.bytes_copied / BYTES_PER_US

    @property
    def profitable(self) -> bool:
        return self.us >= 0

    def text(self) -> str:
        """E.g. ``"14 kernels fewer, 96.0 KiB more copied per call: estimate saves 35.9 us"``."""
        k, kib = self.kernels_saved, self.bytes_copied / 1024
        kernels = f"{abs(k)} kernel{'s' * (abs(k) != 1)} {'fewer' if k >= 0 else 'more'}"
        copied = f"{abs(kib):.1f} KiB {'more' if kib >= 0 else 'less'} copied per call"
        gain = f"saves {self.us:.1f} us" if self.profitable else f"costs {-self.us:.1f} us (unprofitable)"
        return f"{kernels}, {copied}: estimate {gain}"


def _short(target: str) -> str:
    return target.rsplit(".", 1)[-1]


def _cost(kind: str, target: str, nbytes: int) -> tuple[int, int]:
    if kind not in ("call_function", "call_method"):
        return 0, 0
    t = _short(target)
    if t in FREE:
        return 0, 0
    return KERNELS.get(t, 1), (nbytes if t in COPIES else 0)


def _nbytes_record(shape, dtype: str | None) -> int:
    if not isinstance(shape, list) or not all(isinstance(d, int) for d in shape) or dtype is None:
        return 0
    try:
        itemsize = torch.empty((), dtype=getattr(torch, dtype.replace("torch.", ""))).element_size()
    except (AttributeError, TypeError):
        return 0
    n = 1
    for d in shape:
        n *= d
    return n * itemsize


def step_estimate(trace, index: int) -> Estimate:
    """The estimate of step ``index`` (1-based) of a recorded ``trace``: nodes of the graph
    before the step that are gone after it, against nodes that are new after it."""
    b, a = trace.before(index).nodes, trace.after(index).nodes
    k = nb = 0
    for name in b.keys() - a.keys():
        r = b[name]
        kk, bb = _cost(r.op, r.target, _nbytes_record(r.shape, r.dtype))
        k, nb = k + kk, nb - bb
    for name in a.keys() - b.keys():
        r = a[name]
        kk, bb = _cost(r.op, r.target, _nbytes_record(r.shape, r.dtype))
        k, nb = k - kk, nb + bb
    return Estimate(k, nb)


def _node_cost(n: Node) -> tuple[int, int]:
    t = meta.tensor(n)
    nbytes = t.numel() * t.element_size() if t is not None and all(isinstance(d, int) for d in t.shape) else 0
    return _cost(n.op, target_name(n), nbytes)


def group_estimate(gm: GraphModule, fuse, nodes: list[Node]) -> Estimate:
    """The estimate of ``fuse(rw, nodes)`` (a BatchPattern's ``fuse``), found by fusing
    the same nodes in a copy of ``gm``'s graph (:func:`optimus_lens.core.engine.copy_graph`)
    through a :class:`~optimus_lens.core.rewriter.Rewriter` with no listeners (``gm`` is not
    changed). The catalogue's passes carry it as their :attr:`~optimus_lens.core.pipeline.Pass.estimate`. O(graph) per call. Whatever ``fuse`` raises
    propagates (the engine then runs the step, which rolls it back and records why)."""
    env: dict[Node, Node] = {}
    g = copy_graph(gm.graph, env)
    before = set(g.nodes)
    fuse(Rewriter(g), [env[n] for n in nodes])
    after = set(g.nodes)
    k = nb = 0
    for n in before - after:
        kk, bb = _node_cost(n)
        k, nb = k + kk, nb - bb
    for n in after - before:
        if cancelled_stack(n):
            continue
        kk, bb = _node_cost(n)
        k, nb = k - kk, nb + bb
    return Estimate(k, nb)


def cancelled_stack(n: Node) -> bool:
    """True for a stack that ``remove_unbind_stack`` cancels in the cleanup after the
    fusions (every piece of one unbind, in order, on its dim: that pattern's own match
    decides), so :func:`group_estimate` charges it neither a kernel nor a copy (a fusion
    that consumes the pieces of the previous one, e.g. a sum of stacked products, stacks
    them back as they were)."""
    if n.op != "call_function" or n.target is not torch.stack:
        return False
    return not isinstance(REMOVE_UNBIND_STACK.match(n), Miss)


def pass_estimates(trace) -> dict[str, Estimate]:
    """The summed estimate of the steps of each pass of a recorded ``trace``, in run order."""
    out: dict[str, Estimate] = {}
    for st in trace.steps:
        e = step_estimate(trace, st.index)
        prev = out.get(st.pass_name, Estimate(0, 0))
        out[st.pass_name] = Estimate(prev.kernels_saved + e.kernels_saved, prev.bytes_copied + e.bytes_copied)
    return out
