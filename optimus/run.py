"""One call from a model spec to a recorded Trace: what the CLI and the app both use.

A model spec is ``sample:NAME`` (or a bare sample NAME) from :mod:`sample_models`, or
``package.module:factory`` naming a callable that returns ``(model, example_inputs)``.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

import torch

from optimus.capture import Captured, capture
from optimus.engine import Engine, Pipeline, RunOptions
from optimus.trace import Step, Trace


class ModelSpecError(ValueError):
    """A model spec that names no model, or whose factory fails or returns the wrong thing."""


def load_model(spec: str) -> tuple[torch.nn.Module, tuple, str]:
    """Build the model a spec names: returns (model, example_inputs, display name).

    Raises ModelSpecError naming the problem: unknown sample, module not importable,
    no such factory, the factory raised, or it did not return ``(nn.Module, inputs)``.
    """
    spec = spec.strip()
    if not spec:
        raise ModelSpecError("empty model spec: use sample:NAME or package.module:factory")
    if spec.startswith("sample:") or ":" not in spec:
        import sample_models

        name = spec.split(":", 1)[1] if spec.startswith("sample:") else spec
        if name not in sample_models.REGISTRY:
            raise ModelSpecError(f"unknown sample model {name!r}; samples: {', '.join(sample_models.names())}")
        try:
            model, inputs = sample_models.get(name)
        except ImportError as e:
            raise ModelSpecError(f"sample {name!r} needs an optional package: {e}") from e
        return model, tuple(inputs), name
    mod_name, _, attr = spec.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except Exception as e:  # noqa: BLE001 - any import failure is the spec's problem
        raise ModelSpecError(f"cannot import {mod_name!r}: {type(e).__name__}: {e}") from e
    factory = getattr(mod, attr, None)
    if not callable(factory):
        raise ModelSpecError(f"{mod_name!r} has no callable {attr!r}")
    try:
        out = factory()
    except Exception as e:  # noqa: BLE001
        raise ModelSpecError(f"{spec} raised {type(e).__name__}: {e}") from e
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], torch.nn.Module)):
        raise ModelSpecError(f"{spec} must return (nn.Module, example_inputs), got {type(out).__name__}")
    model, inputs = out
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    return model, tuple(inputs), spec


@dataclass
class RunResult:
    """A finished run: the Trace, the capture it started from, and the Engine (whose
    ``gm`` is the optimised GraphModule and ``stages`` the per-pass copies)."""

    trace: Trace
    captured: Captured
    engine: Engine
    spec: str


def optimize(spec_or_model: str | torch.nn.Module, inputs: tuple | None = None, passes: list[str] | None = None,
             verify: str = "end", grads: bool = False, record: bool = True, capture_method: str = "dynamo",
             graph_index: int | None = None, keep_stages: bool = False,
             on_step: Callable[[Step], None] | None = None,
             on_capture: Callable[[Captured], None] | None = None,
             pipeline: Pipeline | None = None, dynamic: bool = False, on_error: str = "skip") -> RunResult:
    """Capture a model and run the Optimus pipeline over it, recording every step.

    ``passes`` names the enabled passes of the default pipeline (None: all). ``on_step``
    is called with each Step as it is applied (for progress). ``dynamic`` captures with
    dynamic shapes (Dynamo only); ``on_error`` is :attr:`RunOptions.on_error` (a step that
    raises or leaves the graph invalid is rolled back; "skip" goes on, "stop" raises
    PatternError). Raises ModelSpecError,
    optimus.capture.CaptureError, optimus.engine.PatternError, or KeyError for an
    unknown pass name.
    """
    from optimus.passes import default_pipeline

    if isinstance(spec_or_model, str):
        model, inputs, name = load_model(spec_or_model)
    else:
        if inputs is None:
            raise ModelSpecError("a model object needs its example inputs")
        model, name = spec_or_model, type(spec_or_model).__name__
    pipe = pipeline or default_pipeline()
    if passes is not None:
        pipe = pipe.only(list(passes))
    captured = capture(model, tuple(inputs), method=capture_method, graph_index=graph_index, dynamic=dynamic)
    if on_capture is not None:
        on_capture(captured)
    engine = Engine(captured.gm, captured.example_inputs, pipe,
                    RunOptions(verify=verify, record=record, grads=grads, keep_stages=keep_stages, on_error=on_error),
                    model_name=name, capture_info=captured.info())
    for step in engine.steps():
        if on_step is not None:
            on_step(step)
    return RunResult(engine.trace, captured, engine, name)
