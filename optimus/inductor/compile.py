"""Our pipeline inside ``torch.compile``: an Inductor ``pre_grad_custom_pass``.

Inductor runs ``torch._inductor.config.pre_grad_custom_pass`` on every Dynamo graph it
compiles, after its own pre-grad passes (torch/_inductor/fx_passes/pre_grad.py, step 7
of ``pre_grad_passes``) and before AOTAutograd. :class:`OptimusPreGradPass` is such a
pass: a ``torch._inductor.custom_graph_pass.CustomGraphPass`` that runs the Optimus
pipeline over the graph in place (no verification: the graph's inputs are FakeTensors)
and records a :class:`~optimus_lens.core.trace.Trace` per graph.

Its :meth:`~OptimusPreGradPass.uuid` hashes the source of every module that can change
what the pipeline does, plus the enabled passes, so Inductor's FX graph and AOTAutograd
caches stay correct: a changed pass or pipeline is a different key. On a cache hit
Inductor reuses the compiled artifact (made with this very pipeline) without running the
pass, so no Trace is recorded for that graph.

Pre-packing weights (:mod:`optimus_lens.perf.prepack`) needs the real parameters, which a pre-grad
pass does not see; under ``torch.compile`` the same folding of the pipeline's parameter
stacks is Inductor's ``freezing`` (``options={"freezing": True}``, inference only).

Works with torch 2.11 to 2.13: it uses only ``CustomGraphPass``, the
``pre_grad_custom_pass`` option and ``torch._inductor.list_mode_options``.
"""

from __future__ import annotations

import hashlib
import itertools
import sys
import types
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

from optimus_lens.core.trace import Trace

#: what decides what the pipeline does to a graph, relative to the package: the whole core,
#: the catalogue and this module
_SOURCES = ("core", "passes", "inductor/compile.py")
#: traces of each pass object, by sink id: a config copy of the pass still fills its owner's list
_SINKS: dict[int, list[Trace]] = {}
_IDS = itertools.count()


def _source_hash() -> str:
    root = Path(str(resources.files("optimus_lens")))
    h = hashlib.sha256()
    for name in _SOURCES:
        p = root / name
        for f in sorted(p.rglob("*.py")) if p.is_dir() else [p]:
            h.update(f.relative_to(root).as_posix().encode())
            h.update(f.read_bytes())
    return h.hexdigest()


class OptimusPreGradPass(CustomGraphPass):
    """The Optimus pipeline as an Inductor pre-grad custom pass.

    ``passes`` names the enabled passes of the default pipeline (None: all; KeyError for
    an unknown name, raised here rather than mid-compile). ``traces`` is the list each
    graph's Trace is appended to, in compile order (``model`` names them).
    """

    def __init__(self, passes: list[str] | None = None, traces: list[Trace] | None = None, model: str = ""):
        from optimus_lens.passes import default_pipeline

        pipe = default_pipeline()
        self.pipeline = pipe.only(list(passes)) if passes is not None else pipe
        self.model = model
        self.sink = next(_IDS)
        _SINKS[self.sink] = traces if traces is not None else []

    @property
    def traces(self) -> list[Trace]:
        return _SINKS[self.sink]

    def __call__(self, graph: torch.fx.Graph) -> None:
        from optimus_lens.core.engine import Engine, RunOptions

        gm = graph.owning_module
        if gm is None:
            raise RuntimeError("pre_grad_custom_pass got a graph with no owning GraphModule")
        engine = Engine(
            gm,
            (),
            self.pipeline,
            RunOptions(verify="off", record=True),
            model_name=f"{self.model} graph {len(self.traces)}".strip(),
            capture_info={"method": "torch.compile pre_grad_custom_pass", "torch": torch.__version__},
        )
        self.traces.append(engine.run())

    def uuid(self) -> Any:
        """sha256 of the pipeline's source files and the enabled passes (stable across runs)."""
        enabled = ",".join(p.name for p in self.pipeline.enabled())
        return hashlib.sha256(f"optimus-lens:{_source_hash()}:{enabled}".encode()).hexdigest()


def compile(model, passes: list[str] | None = None, **torch_compile_kwargs):  # noqa: A001 - mirrors torch.compile
    """``torch.compile(model, **torch_compile_kwargs)`` with the Optimus pipeline installed
    as Inductor's ``pre_grad_custom_pass`` for this compiled callable only (passed through
    ``options``; a ``mode`` is expanded into its options, as ``torch.compile`` allows only
    one of the two).

    Returns the compiled callable with ``optimus_traces``: a list that fills with one
    Trace per graph as graphs compile (on the first call, and on recompiles). Raises
    ValueError for a backend other than Inductor or an ``options`` dict that already
    sets ``pre_grad_custom_pass``, and KeyError for an unknown pass name.
    """
    kw = dict(torch_compile_kwargs)
    backend = kw.get("backend", "inductor")
    if backend != "inductor":
        raise ValueError(f"optimus_lens.compile runs inside Inductor; backend {backend!r} has no pre-grad passes")
    options = dict(kw.pop("options", None) or {})
    if "pre_grad_custom_pass" in options:
        raise ValueError("options already set pre_grad_custom_pass; optimus_lens.compile installs its own")
    mode = kw.pop("mode", None)
    if mode is not None:
        from torch._inductor import list_mode_options

        options = {**list_mode_options(mode, kw.get("dynamic")), **options}
    traces: list[Trace] = []
    options["pre_grad_custom_pass"] = OptimusPreGradPass(passes, traces, type(model).__name__)
    compiled = torch.compile(model, options=options, **kw)
    compiled.optimus_traces = traces  # type: ignore[attr-defined]
    return compiled


class _CallableModule(types.ModuleType):
    """``optimus_lens.compile`` is this module; calling it calls :func:`compile`."""

    def __call__(self, model, passes: list[str] | None = None, **torch_compile_kwargs):
        return compile(model, passes, **torch_compile_kwargs)


sys.modules[__name__].__class__ = _CallableModule
