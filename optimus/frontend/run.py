"""One call from a model spec to a recorded Trace: what the CLI and the app both use.

A model spec is one of

* ``sample:NAME`` (or a bare sample NAME) from :mod:`sample_models`;
* ``package.module:factory`` naming a callable that returns ``(model, example_inputs)``,
  imported with the current directory on ``sys.path`` (so ``mymodels:build`` works from
  the folder holding ``mymodels.py``, also through the installed ``optimus`` script);
* ``path/to/file.py:factory``: the same, loaded from that file;
* ``path/to/model.pt2``: a program saved by ``torch.export.save``, run on the example
  inputs it was exported with (:func:`load_exported`);
* ``hf:NAME[?layers=N&hidden=N...]``: a HuggingFace ``transformers`` architecture built
  offline from a small configuration with random weights (:mod:`optimus_lens.frontend.hf`);
* ``log:PATH[#SELECTOR]``: a graph of a compile log (``TORCH_TRACE`` or
  ``TORCH_COMPILE_DEBUG``), with example inputs made from its recorded metas
  (:mod:`optimus_lens.frontend.compile_log`).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.fx import GraphModule

from optimus_lens.core.engine import Engine, RunOptions
from optimus_lens.core.pipeline import Pipeline
from optimus_lens.core.trace import Step, Trace
from optimus_lens.frontend.capture import Captured, capture
from optimus_lens.frontend.postgrad import PostGradRun, check_stage, run_post_grad


class ModelSpecError(ValueError):
    """A model spec that names no model, or whose factory fails or returns the wrong thing."""


def load_model(spec: str) -> tuple[torch.nn.Module, tuple, str]:
    """Build the model a spec names: returns (model, example_inputs, display name).

    Raises ModelSpecError naming the problem: unknown sample, module or file not
    importable, no such factory, the factory raised, it did not return
    ``(nn.Module, inputs)``, or a ``.pt2`` file that ``torch.export.load`` cannot read.
    """
    spec = spec.strip()
    if not spec:
        raise ModelSpecError(
            "empty model spec: use sample:NAME, package.module:factory, path/to/file.py:factory or path/to/model.pt2"
        )
    if spec.startswith("log:"):
        return _load_log(spec)
    if spec.endswith(".pt2"):
        return load_exported(spec)
    if spec.startswith("hf:"):
        return _load_hf(spec)
    if spec.startswith("sample:") or ":" not in spec:
        if not spec.startswith("sample:"):
            _check_bare(spec)
        return _load_sample(spec.split(":", 1)[1] if spec.startswith("sample:") else spec)
    mod_name, _, attr = spec.rpartition(":")
    mod = _import_file(mod_name) if mod_name.endswith(".py") else _import_module(mod_name)
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


def sample_list() -> list[tuple[str, str, str]]:
    """(name, kind, one-line description) of every sample model, in registry order."""
    from optimus_lens import sample_models

    return [(e.name, e.kind, e.description) for e in sample_models.REGISTRY.values()]


def _functions_in(path: Path) -> list[str]:
    """The top-level function names of a Python file, read without running it ([] when it
    cannot be read or parsed)."""
    import ast

    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return []
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")]


def _check_bare(spec: str) -> None:
    """A spec without a colon is a sample's name; one that names a Python file or a dotted
    module is a factory spec missing its ``:factory``. Raises ModelSpecError saying how to
    write it (with the file's functions as candidates), instead of reading it as a sample."""
    from optimus_lens import sample_models

    if spec in sample_models.REGISTRY:
        return
    if spec.endswith(".py") or "/" in spec or "\\" in spec:
        path = Path(spec)
        if spec.endswith(".py") and not path.is_file():
            raise ModelSpecError(f"no file {spec!r} (from {Path.cwd()}); a file spec is path/to/file.py:factory")
        names = _functions_in(path) if path.is_file() else []
        hint = f"; functions in it: {', '.join(names[:8])}" if names else ""
        example = f"{spec}:{names[0]}" if names else f"{spec}:FACTORY"
        raise ModelSpecError(
            f"{spec!r} names a file but no factory: write {example} (a callable returning "
            f"(nn.Module, example_inputs)){hint}"
        )
    if "." in spec:
        raise ModelSpecError(
            f"{spec!r} has no ':factory': write {spec}:FACTORY (a callable returning (nn.Module, "
            "example_inputs)), or sample:NAME for a sample model"
        )


def _load_sample(name: str) -> tuple[torch.nn.Module, tuple, str]:
    import difflib

    from optimus_lens import sample_models

    if name not in sample_models.REGISTRY:
        close = difflib.get_close_matches(name, sample_models.names(), n=4, cutoff=0.5)
        raise ModelSpecError(
            f"unknown sample model {name!r}"
            + (f"; did you mean {', '.join(close)}?" if close else "")
            + f" (`optimus samples` lists all {len(sample_models.names())}; a factory is package.module:factory "
            "or path/to/file.py:factory)"
        )
    try:
        model, inputs = sample_models.get(name)
    except ImportError as e:
        raise ModelSpecError(f"sample {name!r} needs an optional package: {e}") from e
    return model, tuple(inputs), name


def _load_hf(spec: str) -> tuple[torch.nn.Module, tuple, str]:
    from optimus_lens.frontend.hf import HFSpecError, load_hf

    try:
        return load_hf(spec)
    except (HFSpecError, ImportError) as e:
        raise ModelSpecError(str(e)) from e
    except Exception as e:  # noqa: BLE001 - transformers refusing a configuration is the spec's problem
        raise ModelSpecError(f"{spec}: transformers cannot build it: {type(e).__name__}: {e}") from e


def _load_log(spec: str) -> tuple[torch.nn.Module, tuple, str]:
    """A graph of a compile log (:mod:`optimus_lens.frontend.compile_log`) as the model: the
    GraphModule itself, which :func:`optimus_lens.frontend.capture.capture` takes as it is."""
    from optimus_lens.frontend.compile_log import LogError, load_log

    try:
        loaded = load_log(spec)
    except LogError as e:
        raise ModelSpecError(str(e)) from e
    return loaded.gm, loaded.example_inputs, spec


def _import_module(name: str):
    """Import ``name`` with the current directory first on ``sys.path`` for the import."""
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - any import failure is the spec's problem
        raise ModelSpecError(f"cannot import {name!r} (searched from {cwd}): {type(e).__name__}: {e}") from e
    finally:
        if added:
            sys.path.remove(cwd)


def _import_file(path: str):
    """Load ``path`` (a ``.py`` file, relative to the current directory) as a module."""
    file = os.path.abspath(path)
    if not os.path.isfile(file):
        raise ModelSpecError(f"no such model file: {path} (looked for {file})")
    name = "optimus_user_" + "".join(c if c.isalnum() else "_" for c in os.path.splitext(os.path.basename(file))[0])
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ModelSpecError(f"{path}: not a Python file that can be imported")
    mod = importlib.util.module_from_spec(spec)
    folder = os.path.dirname(file)
    added = folder not in sys.path
    if added:  # so the file can import its neighbours
        sys.path.insert(0, folder)
    try:
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    except Exception as e:  # noqa: BLE001
        sys.modules.pop(name, None)
        raise ModelSpecError(f"cannot load {path}: {type(e).__name__}: {e}") from e
    finally:
        if added:
            sys.path.remove(folder)
    return mod


def _raise_table() -> dict:
    """ATen overload -> (torch-level callable, number of positional args it takes): the
    ops Optimus's patterns anchor on, as an exported program spells them."""
    F, aten = torch.nn.functional, torch.ops.aten
    return {
        aten.linear.default: (torch._C._nn.linear, 3),
        aten.layer_norm.default: (F.layer_norm, 5),
        aten.relu.default: (torch.relu, 1),
        aten.tanh.default: (torch.tanh, 1),
        aten.sigmoid.default: (torch.sigmoid, 1),
        aten.detach.default: (torch.detach, 1),
        aten.nan_to_num.default: (torch.nan_to_num, 4),
        aten.clamp.default: (torch.clamp, 3),
        aten.dropout.default: (torch.dropout, 3),
        aten.cat.default: (torch.cat, 2),
        aten.stack.default: (torch.stack, 2),
        aten.split.Tensor: (torch.split, 3),
        aten.split_with_sizes.default: (torch.split, 3),
        aten.unbind.int: (torch.unbind, 2),
        aten.matmul.default: (torch.matmul, 2),
        aten.addmm.default: (torch.addmm, 3),
    }


def load_exported(path: str) -> tuple[torch.nn.Module, tuple, str]:
    """A ``torch.export.save`` file as (module, example inputs, display name).

    An exported program is in ATen IR (``aten.linear.default``, ``aten.split.Tensor``),
    while Optimus's patterns, like upstream's pre-grad passes, match the torch-level ops
    Dynamo records (``torch._C._nn.linear``, ``torch.split``). The ops of
    :func:`_raise_table` are therefore called through their torch-level function (same
    positional arguments, ATen-only trailing ones dropped: ``layer_norm``'s
    ``cudnn_enable``); other ops stay ATen calls and are captured as such. The inputs are
    the positional ``example_inputs`` saved with the program. Raises ModelSpecError for a
    missing or unreadable file, or a program saved without example inputs or with
    keyword inputs.
    """
    if not os.path.isfile(path):
        raise ModelSpecError(f"no such exported program: {path}")
    try:
        ep = torch.export.load(path)
    except Exception as e:  # noqa: BLE001
        raise ModelSpecError(f"torch.export.load cannot read {path}: {type(e).__name__}: {e}") from e
    ex = getattr(ep, "example_inputs", None)
    if not ex or (not ex[0] and not ex[1]):
        raise ModelSpecError(f"{path} was saved without example inputs; export it with example args")
    args, kwargs = ex
    if kwargs:
        raise ModelSpecError(f"{path} takes keyword inputs ({', '.join(kwargs)}); only positional ones are supported")
    gm = ep.module()
    table = _raise_table()
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in table:
            fn, nargs = table[n.target]
            n.target, n.args = fn, n.args[:nargs]
    gm.recompile()
    return gm, tuple(args), os.path.basename(path)


def model_and_inputs(spec_or_model: str | torch.nn.Module, inputs: tuple | None = None) -> tuple:
    """(model, example inputs, display name) for a model spec (:func:`load_model`) or for a
    model object with its ``inputs``. Raises ModelSpecError for a bad spec or a model
    object without inputs."""
    if isinstance(spec_or_model, str):
        return load_model(spec_or_model)
    if inputs is None:
        raise ModelSpecError("a model object needs its example inputs")
    return spec_or_model, tuple(inputs), type(spec_or_model).__name__


def select_passes(names: list[str], passes: list[str] | None = None, skip: list[str] | None = None) -> list[str]:
    """The pass names of ``names`` to run: those in ``passes`` (None: all) less those in
    ``skip``, in pipeline order. Raises KeyError naming an unknown pass of either list."""
    unknown = [n for n in [*(passes or []), *(skip or [])] if n not in names]
    if unknown:
        raise KeyError(f"unknown pass(es) {', '.join(unknown)}; known: {', '.join(names)}")
    keep = set(names if passes is None else passes) - set(skip or [])
    return [n for n in names if n in keep]


@dataclass
class RunResult:
    """A finished run: the Trace, the capture it started from, and the Engine (whose
    ``gm`` is the optimised GraphModule and ``stages`` the per-pass copies). With a
    post-grad stage, ``post_grad`` holds the ATen graphs and the Engine of each (their
    traces are ``trace.graphs``)."""

    trace: Trace
    captured: Captured
    engine: Engine
    spec: str
    post_grad: PostGradRun | None = None


def optimize(
    spec_or_model: str | torch.nn.Module,
    inputs: tuple | None = None,
    passes: list[str] | None = None,
    skip: list[str] | None = None,
    verify: str = "end",
    grads: bool = False,
    record: bool = True,
    capture_method: str = "dynamo",
    graph_index: int | None = None,
    keep_stages: bool = False,
    on_step: Callable[[Step], None] | None = None,
    on_capture: Callable[[Captured], None] | None = None,
    pipeline: Pipeline | None = None,
    captured: Captured | None = None,
    dynamic: bool = False,
    on_error: str = "skip",
    stage: str = "pre-grad",
    mode: str = "inference",
    post_grad_pipeline: Pipeline | None = None,
) -> RunResult:
    """Capture a model and run the Optimus pipeline over it, recording every step.

    ``stage`` picks the graphs: ``"pre-grad"`` (default) the Dynamo graph only;
    ``"post-grad"`` the ATen graphs Inductor's post-grad passes see (the forward graph, and
    with ``mode="training"`` the backward graph), captured from the unchanged program and
    rewritten by ``post_grad_pipeline`` (default:
    :func:`optimus_lens.passes.post_grad.post_grad_pipeline`); ``"all"`` the pre-grad
    pipeline first, then the ATen graphs of the program it rewrote. The ATen graphs'
    traces are ``trace.graphs`` (:mod:`optimus_lens.frontend.postgrad`). With
    ``mode="training"`` a model built from a spec is put in training mode
    (``model.train()``) and the pre-grad steps are verified on gradients too.

    ``passes`` names the enabled passes of the default pipeline (None: all) and ``skip``
    the passes to switch off among those (:func:`select_passes`). ``on_step``
    is called with each Step as it is applied (for progress). ``dynamic`` captures with
    dynamic shapes (Dynamo only); ``on_error`` is :attr:`RunOptions.on_error` (a step that
    raises or leaves the graph invalid is rolled back; "skip" goes on, "stop" raises
    PatternError). Raises ModelSpecError,
    optimus_lens.frontend.capture.CaptureError, optimus_lens.core.engine.PatternError, or KeyError for an
    unknown pass name. ``captured`` runs on an existing capture (its ``gm`` is rewritten
    in place) instead of capturing ``spec_or_model``, which then only names the run.
    Also raises ValueError for an unknown stage or mode and
    optimus_lens.frontend.aten_capture.AtenCaptureError when AOTAutograd cannot trace the program.
    """
    from optimus_lens.passes import default_pipeline

    check_stage(stage, mode)
    if captured is not None:
        name = run_name(spec_or_model)
    else:
        model, inputs, name = model_and_inputs(spec_or_model, inputs)
        if mode == "training" and isinstance(spec_or_model, str):
            model.train()
    pipe = pipeline or default_pipeline()
    if stage == "post-grad":
        pipe = Pipeline([])
    elif passes is not None or skip:
        pipe = pipe.only(select_passes(pipe.names(), passes, skip))
    grads = grads or (mode == "training" and stage != "post-grad")
    if captured is None:
        captured = capture(  # in the mode the run is for: grad on when gradients are verified
            model, tuple(inputs or ()), method=capture_method, graph_index=graph_index, dynamic=dynamic, grad=grads
        )
    if on_capture is not None:
        on_capture(captured)
    engine = Engine(
        captured.gm,
        captured.example_inputs,
        pipe,
        RunOptions(
            verify="off" if stage == "post-grad" else verify,
            record=record,
            grads=grads,
            keep_stages=keep_stages,
            on_error=on_error,
        ),
        model_name=name,
        capture_info={**captured.info(), "stage": stage, "mode": mode},
    )
    for step in engine.steps():
        if on_step is not None:
            on_step(step)
    post = None
    if stage != "pre-grad":
        post = run_post_grad(
            engine.gm,
            captured.example_inputs,
            mode,
            post_grad_pipeline,
            verify=verify,
            record=record,
            keep_stages=keep_stages,
            on_step=on_step,
            on_error=on_error,
            model_name=name,
        )
        engine.trace.graphs = post.traces
    return RunResult(engine.trace, captured, engine, name, post)


def run_name(spec_or_model: str | torch.nn.Module) -> str:
    """The name a run is recorded under, as :func:`load_model` gives it: a sample's bare
    name, another spec as written, a model object's class name (also for
    :func:`optimus_lens.inductor.observe.observe`)."""
    if isinstance(spec_or_model, str):
        return spec_or_model.removeprefix("sample:")
    return type(spec_or_model).__name__


def run_pipeline(
    gm: GraphModule,
    example_inputs: tuple,
    pipeline: Pipeline | None = None,
    options: RunOptions | None = None,
    model_name: str = "",
) -> Trace:
    """Convenience: run ``pipeline`` (default: :func:`optimus_lens.passes.default_pipeline`)
    over ``gm`` in place and return the Trace."""
    if pipeline is None:
        from optimus_lens.passes import default_pipeline

        pipeline = default_pipeline()
    return Engine(gm, example_inputs, pipeline, options, model_name).run()
