"""Optimus Lens: the Optimus operator-level FX transformation framework, step-recorded.

Data flows one way: ``capture -> engine (passes, search, recorder) -> Trace``;
``viz`` renders a Trace and ``app`` shows it. This package never imports viz or app.
"""
from optimus.trace import GraphSnapshot, Step, Trace, VerifyResult

__all__ = ["GraphSnapshot", "Step", "Trace", "VerifyResult"]
