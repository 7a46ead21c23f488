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
  passes as Inductor's ``pre_grad_custom_pass`` (:mod:`optimus_lens.inductor.compile`; it
  imports ``torch._inductor``, which takes seconds); with ``pack=True`` and
  ``example_inputs``, the trainable module of :func:`transform` with packed parameters,
  its graphs compiled (:func:`optimus_lens.perf.transform.compile_packed`);
* ``optimus_lens.transform(model, example_inputs, mode="training"|"inference")``: the
  model as an ``nn.Module`` running the transformed graph, packed parameters in training,
  pre-packed weights in inference, the model's own parameters
  (:func:`optimus_lens.perf.transform.transform`; docs/training.md).
"""

from typing import TYPE_CHECKING

from optimus_lens.core.trace import GraphSnapshot, Step, Trace, VerifyResult

if TYPE_CHECKING:
    from optimus_lens.core.engine import RunOptions
    from optimus_lens.frontend.run import optimize, run_pipeline
    from optimus_lens.perf.transform import transform

__all__ = [
    "GraphSnapshot",
    "RunOptions",
    "Step",
    "Trace",
    "VerifyResult",
    "compile",
    "optimize",
    "run_pipeline",
    "transform",
]


def compile(model, passes=None, *, pack: bool = False, example_inputs=None, **torch_compile_kwargs):  # noqa: A001
    """``torch.compile`` with the Optimus pipeline. Without ``pack``: our passes as
    Inductor's ``pre_grad_custom_pass`` (:func:`optimus_lens.inductor.compile.compile`;
    ``mode`` and the other keywords are torch.compile's). With ``pack=True``: training with
    packed parameters, which needs the real parameters before compiling, so
    ``example_inputs`` (one call's positional arguments) is required; returns
    :func:`optimus_lens.perf.transform.compile_packed`'s module (its graphs compiled with
    ``torch_compile_kwargs``). Raises ValueError for ``pack=True`` without example inputs,
    and what those functions raise."""
    if pack:
        if example_inputs is None:
            raise ValueError(
                "optimus_lens.compile(..., pack=True) needs example_inputs: packing reads the real parameters"
            )
        from optimus_lens.perf.transform import compile_packed

        return compile_packed(model, example_inputs, passes, **torch_compile_kwargs)
    if example_inputs is not None:
        raise ValueError("example_inputs is only used with pack=True")
    from optimus_lens.inductor.compile import compile as inductor_compile

    return inductor_compile(model, passes, **torch_compile_kwargs)


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
    if name == "transform":
        from optimus_lens.perf.transform import transform

        return transform
    raise AttributeError(f"module 'optimus_lens' has no attribute {name!r}")
