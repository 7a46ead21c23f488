"""Optimus Lens: the Optimus operator-level FX transformation framework, step-recorded.

The one import namespace of the distribution: the core (this package's layer folders:
``core``, ``passes``, ``frontend``, ``inductor``, ``debug``, ``perf``, ...),
``optimus_lens.viz`` (Trace -> pictures, the report), ``optimus_lens.app`` (the Streamlit
app) and ``optimus_lens.sample_models``. Data flows one way:
``capture -> engine (passes, search, recorder) -> Trace``; ``viz`` renders a Trace and
``app`` shows it. The core never imports ``viz`` or ``app``; ``viz`` never imports ``app``
or streamlit (``tests/test_layering.py`` holds the rules).

The published entry points, imported on first use (they import torch and the catalogue):

* ``optimus_lens.optimize(spec_or_model, ...)``: capture, run the default pipeline,
  record every step (:func:`optimus_lens.frontend.run.optimize`);
* ``optimus_lens.run_pipeline(gm, example_inputs, pipeline=None, options=None)``: run a
  pipeline over a captured GraphModule in place (:func:`optimus_lens.frontend.run.run_pipeline`),
  with ``options`` an ``optimus_lens.RunOptions`` (:class:`optimus_lens.core.engine.RunOptions`);
* ``optimus_lens.compile(model, **torch_compile_kwargs)``: ``torch.compile`` with our
  passes as Inductor's ``pre_grad_custom_pass`` (:mod:`optimus_lens.inductor.compile`, a
  callable module; it imports ``torch._inductor``, which takes seconds).
"""

from typing import TYPE_CHECKING

from optimus_lens.core.trace import GraphSnapshot, Step, Trace, VerifyResult

if TYPE_CHECKING:
    from optimus_lens.core.engine import RunOptions
    from optimus_lens.frontend.run import optimize, run_pipeline
    from optimus_lens.inductor import compile

__all__ = ["GraphSnapshot", "RunOptions", "Step", "Trace", "VerifyResult", "compile", "optimize", "run_pipeline"]


def __getattr__(name: str):
    if name == "optimize":
        from optimus_lens.frontend.run import optimize

        return optimize
    if name == "run_pipeline":
        from optimus_lens.frontend.run import run_pipeline

        return run_pipeline
    if name == "RunOptions":
        from optimus_lens.core.engine import RunOptions

        return RunOptions
    if name == "compile":
        import importlib

        return importlib.import_module("optimus_lens.inductor.compile")
    raise AttributeError(f"module 'optimus_lens' has no attribute {name!r}")
