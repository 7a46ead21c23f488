"""Optimus Lens: the Optimus operator-level FX transformation framework, step-recorded.

The one import namespace of the distribution: the core (this package's modules and
``passes``), ``optimus_lens.viz`` (Trace -> pictures, the report), ``optimus_lens.app``
(the Streamlit app) and ``optimus_lens.sample_models``. Data flows one way:
``capture -> engine (passes, search, recorder) -> Trace``; ``viz`` renders a Trace and
``app`` shows it. The core never imports ``viz`` or ``app``; ``viz`` never imports ``app``
or streamlit (``tests/test_layering.py``).
"""

from optimus_lens.core.trace import GraphSnapshot, Step, Trace, VerifyResult

__all__ = ["GraphSnapshot", "Step", "Trace", "VerifyResult", "compile", "optimize"]


def __getattr__(name: str):
    # ``optimus_lens.compile(model, **torch_compile_kwargs)``: torch.compile with our passes as
    # Inductor's pre_grad_custom_pass (optimus/inductor/compile.py, a callable module). Imported on
    # first use: it imports torch._inductor, which takes seconds. ``optimus_lens.optimize``
    # is :func:`optimus_lens.frontend.run.optimize` (capture, run the pipeline, record every step).
    if name == "optimize":
        from optimus_lens.frontend.run import optimize

        return optimize
    if name == "compile":
        import importlib

        return importlib.import_module("optimus_lens.inductor.compile")
    raise AttributeError(f"module 'optimus_lens' has no attribute {name!r}")
