"""Find the first step whose graph no longer computes what the original graph does.

With ``verify="step"`` every step is checked as it is applied and the first failing step
is read off the trace. With verification off a run checks nothing, so
:func:`bisect_trace` binary-searches the recorded steps instead: it rebuilds the graph
after step ``k`` from the trace (:func:`optimus_lens.debug.rebuild.graph_module`, the replayed
deltas) and runs it on the model's example inputs, checking only
``2 + ceil(log2(steps))`` graphs (the original, the final one, then one per halving)
rather than one per step.

The search assumes a graph, once wrong, stays wrong (later rewrites rarely repair a
broken value); it returns a step ``k`` whose before-graph matches the original and whose
after-graph does not, which is the first failing step under that assumption.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from optimus_lens.core import verify
from optimus_lens.core.trace import Trace, VerifyResult
from optimus_lens.debug.rebuild import graph_module


@dataclass
class BisectResult:
    """Outcome of a bisection over a trace of ``steps`` steps.

    ``first_bad`` is the step found (None when the final graph matches, or when nothing
    could be checked: ``message`` says why); ``probes`` lists every graph checked as
    (steps applied, result), in the order checked; ``direct`` is True when the step
    was read from per-step verification rather than searched."""

    steps: int
    first_bad: int | None
    probes: list[tuple[int, VerifyResult]] = field(default_factory=list)
    direct: bool = False
    message: str = ""

    @property
    def max_probes(self) -> int:
        """The most graphs a search over this many steps checks after the original: the
        final graph plus ``ceil(log2(steps))``."""
        return 1 + (math.ceil(math.log2(self.steps)) if self.steps > 1 else 0)


def first_failing(trace: Trace) -> BisectResult:
    """The first step that failed per-step verification (``verify="step"``), no search."""
    failed = trace.failed_steps()
    return BisectResult(
        len(trace.steps),
        failed[0].index if failed else None,
        direct=True,
        message="" if failed else "every verified step matches the original graph",
    )


def bisect_trace(trace: Trace, inputs: tuple, grads: bool = False) -> BisectResult:
    """Binary-search ``trace`` for the first step whose graph differs from the original.

    ``inputs`` are the real example inputs of the captured graph (placeholder order, as
    :func:`optimus_lens.frontend.capture.capture` returns them). The original is the trace's initial
    snapshot rebuilt, so probes and reference are built the same way. Each probe is an
    :func:`optimus_lens.core.verify.check` (lint, run, dtype-aware comparison). Raises
    :class:`optimus_lens.debug.rebuild.RebuildError` when a graph cannot be rebuilt."""
    n = len(trace.steps)
    ref = verify.reference(graph_module(trace.graph_at(0)), inputs, grads)
    result = BisectResult(n, None)
    if not ref.deterministic:
        result.message = "the original graph gives different outputs on two seeded runs: nothing to compare"
        return result

    def bad(k: int) -> bool:
        res = verify.check(graph_module(trace.graph_at(k)), inputs, ref, grads)
        result.probes.append((k, res))
        return res.ok is False

    if n == 0 or not bad(n):
        result.message = "the final graph matches the original" if n else "the trace has no steps"
        return result
    lo, hi = 0, n  # graph after lo steps matches (lo == 0: the original), after hi it does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if bad(mid):
            hi = mid
        else:
            lo = mid
    result.first_bad = hi
    return result


def bisect_spec(
    trace: Trace, spec: str, capture_method: str = "dynamo", graph_index: int | None = None, grads: bool = False
) -> BisectResult:
    """:func:`bisect_trace` for a trace of model ``spec`` made earlier (the app's trace on
    screen): captures the model again for its example inputs and checks that the capture
    is the trace's initial graph. Raises optimus_lens.frontend.run.ModelSpecError /
    optimus_lens.frontend.capture.CaptureError, and ValueError when the model now captures to another
    graph than the trace's."""
    from optimus_lens.core.record import snapshot_graph
    from optimus_lens.frontend.capture import capture
    from optimus_lens.frontend.run import load_model

    model, inputs, _ = load_model(spec)
    c = capture(
        model, inputs, method=capture_method, graph_index=graph_index, grad=(trace.capture or {}).get("grad", False)
    )
    if snapshot_graph(c.gm.graph).signature() != trace.initial_graph.signature():
        raise ValueError(f"{spec} now captures to a different graph than the trace's; run it again first")
    return bisect_trace(trace, c.example_inputs, grads)
