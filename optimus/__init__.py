"""Optimus Lens: the Optimus operator-level FX transformation framework, step-recorded.

Data flows one way: ``capture -> engine (passes, search, recorder) -> Trace``;
``viz`` renders a Trace and ``app`` shows it. This package never imports viz or app.
"""
from optimus.trace import GraphSnapshot, Step, Trace, VerifyResult

__all__ = ["GraphSnapshot", "Step", "Trace", "VerifyResult", "compile"]


def __getattr__(name: str):
    # ``optimus.compile(model, **torch_compile_kwargs)``: torch.compile with our passes as
    # Inductor's pre_grad_custom_pass (optimus/compile.py, a callable module). Imported on
    # first use: it imports torch._inductor, which takes seconds.
    if name == "compile":
        import importlib

        return importlib.import_module("optimus.compile")
    raise AttributeError(f"module 'optimus' has no attribute {name!r}")
