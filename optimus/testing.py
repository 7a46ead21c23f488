"""pytest helpers: assert in a test that a pattern fires, and that a run stays correct.

    from optimus_lens.testing import assert_fires, assert_verified

    def test_towers_fuse():
        model, inputs = build()
        assert_fires(model, inputs, "batch_linear", 2)        # exactly 2 steps
        assert_fires(model, inputs, "batch_linear", ">=2")    # or any expectation of `optimus check`
        assert_fires(model, inputs, "remove_split_cat", 0)    # never fires
        assert_verified(model, inputs)                         # every step keeps the outputs

``model`` is an ``nn.Module`` with its example ``inputs``, or a model spec
(``sample:NAME``, ``pkg.mod:factory``, ``log:PATH``) with ``inputs=None``. Both run
:func:`optimus_lens.frontend.run.optimize` and check its trace the way ``optimus check``
does (:mod:`optimus_lens.debug.expect`); a failure is an ``AssertionError`` whose message
says what the run did, so pytest shows it. Both return the Trace for further checks.
"""

from __future__ import annotations

from optimus_lens.core.trace import Trace
from optimus_lens.debug.expect import check_trace, parse_expectation
from optimus_lens.frontend.run import optimize


def _run(model, inputs, verify: str, **options) -> Trace:
    return optimize(model, inputs, verify=verify, **options).trace


def _expectation(pattern: str, n: int | str | None):
    if n is None:
        return parse_expectation(f"{pattern}>=1")
    if isinstance(n, int):
        return parse_expectation(f"{pattern}={n}")
    text = n.strip()
    return parse_expectation(f"{pattern}{text if text[:1] in '<>=!' else '=' + text}")


def assert_fires(
    model,
    inputs: tuple | None = None,
    pattern: str = "",
    n: int | str | None = None,
    *,
    verify: str = "end",
    **options,
) -> Trace:
    """Run the pipeline on ``model`` and assert that ``pattern`` (a pattern or pass name)
    made ``n`` steps: an int is an exact count, a string a comparison (``">=2"``,
    ``"<3"``, ``"!=0"``), None at least one. The run is verified as ``verify`` says
    (``"off"``, ``"end"``, ``"step"``) and a verification failure fails the assertion too.
    ``options`` go to :func:`optimus_lens.frontend.run.optimize` (``passes``, ``skip``,
    ``pipeline``, ``capture_method``, ...). Raises AssertionError naming the count and the
    steps per pattern; ExpectationError for a name the run does not know."""
    __tracebackhide__ = True
    if not pattern:
        raise ValueError("assert_fires needs a pattern name")
    trace = _run(model, inputs, verify, **options)
    result = check_trace(trace, [_expectation(pattern, n)], verify)
    if not result.ok:
        made = ", ".join(f"{p} x{c}" for p, c in _per_pattern(trace).items()) or "no step"
        raise AssertionError("; ".join(result.failure_lines()) + f" (the run made: {made})")
    return trace


def assert_verified(
    model,
    inputs: tuple | None = None,
    *,
    verify: str = "step",
    grads: bool = False,
    **options,
) -> Trace:
    """Run the pipeline on ``model`` verifying every step (``verify="step"``, default) or
    the final graph (``"end"``), gradients too with ``grads``, and assert that nothing
    failed verification or was rolled back. Raises AssertionError naming each failing step
    and its first message line."""
    __tracebackhide__ = True
    if verify == "off":
        raise ValueError("assert_verified needs verify='step' or 'end'")
    trace = _run(model, inputs, verify, grads=grads, **options)
    result = check_trace(trace, [], verify)
    if not result.ok:
        raise AssertionError("; ".join(result.failure_lines()))
    return trace


def _per_pattern(trace: Trace) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in trace.steps:
        if not s.error:
            out[s.pattern] = out.get(s.pattern, 0) + 1
    return out


__all__ = ["assert_fires", "assert_verified"]
