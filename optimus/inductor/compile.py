"""Our pipeline inside ``torch.compile``: an Inductor ``pre_grad_custom_pass``.

Inductor runs ``torch._inductor.config.pre_grad_custom_pass`` on every Dynamo graph it
compiles, after its own pre-grad passes (torch/_inductor/fx_passes/pre_grad.py, step 7
of ``pre_grad_passes``) and before AOTAutograd. :class:`OptimusPreGradPass` is such a
pass: a ``torch._inductor.custom_graph_pass.CustomGraphPass`` that runs the Optimus
pipeline over the graph in place (no verification: the graph's inputs are FakeTensors)
and records a :class:`~optimus_lens.core.trace.Trace` per graph.

Its :meth:`~OptimusPreGradPass.uuid` hashes the source of every module that can change
what the pipeline does (the whole core, the catalogue, this module) and the bytes of the
user pattern files given to it, plus the enabled passes, so Inductor's FX graph and
AOTAutograd caches stay correct: a changed rule, pass, pipeline or pattern file is a
different key. On a cache hit Inductor reuses the compiled artifact (made with this very
pipeline) without running the pass, so no Trace of its steps is recorded for that graph.

:func:`compile` checks each graph on its first call by default (``check="first-call"``,
:mod:`optimus_lens.inductor.check`): eager against compiled on copies of the real inputs,
and on a difference the graph compiles without our passes, with a warning.

Pre-packing weights (:mod:`optimus_lens.perf.prepack`) needs the real parameters, which a pre-grad
pass does not see; under ``torch.compile`` the same folding of the pipeline's parameter
stacks is Inductor's ``freezing`` (``options={"freezing": True}``, inference only).

Works with torch 2.11 to 2.13: it uses only ``CustomGraphPass``, the
``pre_grad_custom_pass`` option, ``torch._inductor.list_mode_options`` and (the check's
backend) ``torch._inductor.compile_fx.compile_fx`` with ``config_patches``.
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
#: the catalogue, how pattern files become patterns, this module and the first-call check
SOURCES = ("core", "passes", "frontend/patternfile.py", "inductor/compile.py", "inductor/check.py")
#: traces of each pass object, by sink id: a config copy of the pass still fills its owner's list
_SINKS: dict[int, list[Trace]] = {}
_IDS = itertools.count()


def source_hash(root: Path | None = None, extra: tuple[str, ...] = ()) -> str:
    """sha256 over the path and bytes of every file of ``SOURCES`` under ``root`` (the
    installed package by default), then of each file in ``extra`` (user pattern files)."""
    root = root or Path(str(resources.files("optimus_lens")))
    h = hashlib.sha256()
    for name in SOURCES:
        p = root / name
        for f in sorted(p.rglob("*.py")) if p.is_dir() else [p]:
            h.update(f.relative_to(root).as_posix().encode())
            h.update(f.read_bytes())
    for path in extra:
        h.update(b"pattern file:")
        h.update(Path(path).read_bytes())
    return h.hexdigest()


class OptimusPreGradPass(CustomGraphPass):
    """The Optimus pipeline as an Inductor pre-grad custom pass.

    ``passes`` names the enabled passes of the default pipeline (None: all; KeyError for
    an unknown name, raised here rather than mid-compile). ``traces`` is the list each
    graph's Trace is appended to, in compile order (``model`` names them).
    """

    def __init__(
        self,
        passes: list[str] | None = None,
        traces: list[Trace] | None = None,
        model: str = "",
        pattern_files: list[str] | None = None,
    ):
        from optimus_lens.frontend.patternfile import load_pattern_file, pipeline_with
        from optimus_lens.passes import default_pipeline

        pipe = default_pipeline()
        self.pattern_files = [str(f) for f in pattern_files or ()]
        for f in self.pattern_files:
            pipe = pipeline_with(load_pattern_file(f), base=pipe)
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
        """sha256 of the pipeline's source files (the whole core, the catalogue, this
        module), the user pattern files' bytes and the enabled passes (stable across runs)."""
        enabled = ",".join(p.name for p in self.pipeline.enabled())
        sources = source_hash(extra=tuple(self.pattern_files))
        return hashlib.sha256(f"optimus-lens:{sources}:{enabled}".encode()).hexdigest()


def compile(  # noqa: A001 - mirrors torch.compile
    model,
    passes: list[str] | None = None,
    pattern_files: list[str] | None = None,
    check: str = "first-call",
    **torch_compile_kwargs,
):
    """``torch.compile(model, **torch_compile_kwargs)`` with the Optimus pipeline installed
    as Inductor's ``pre_grad_custom_pass`` for this compiled callable only (a ``mode`` is
    expanded into its options, as ``torch.compile`` allows only one of the two).

    ``passes`` names the enabled passes (None: all); ``pattern_files`` are pattern files
    (:mod:`optimus_lens.frontend.patternfile`) whose patterns run as extra passes after the
    default pipeline, each named after its file; their bytes are part of the Inductor
    cache key, as is the source of the core, the catalogue and this module.

    ``check`` (default ``"first-call"``): each graph, when it compiles (the first call
    that reaches it, and every recompile), is run eagerly and compiled on copies of that
    call's real inputs; on a difference it is compiled without the Optimus passes, an
    :class:`optimus_lens.inductor.check.OptimusCheckWarning` names the graph, what
    differed and the ``optimus bisect`` command to run, and the graph's trace records it
    (:mod:`optimus_lens.inductor.check`). It is the default because the passes run
    unverified inside Inductor (FakeTensors), so without it a wrong rewrite is silent; its
    cost is paid once per compiled graph: one eager and one compiled run and a copy of the
    graph's inputs (parameters included) while they run, small beside the compile itself.
    ``check="off"`` compiles with the passes and checks nothing (a model too big for a
    second copy of its parameters, or a benchmark of compile time).

    Returns the compiled callable with ``optimus_traces``: a list that fills with one
    Trace per graph as graphs compile (on the first call, and on recompiles); with the
    check, each Trace's ``final_verify`` is the check's result. Raises ValueError for a
    backend other than Inductor, an ``options`` dict that already sets
    ``pre_grad_custom_pass`` or an unknown ``check``; KeyError for an unknown pass name;
    optimus_lens.frontend.patternfile.PatternFileError for a pattern file that does not load.
    """
    from optimus_lens.inductor.check import CHECKS, CheckedBackend

    if check not in CHECKS:
        raise ValueError(f"check must be one of {CHECKS}, not {check!r}")
    kw = dict(torch_compile_kwargs)
    backend = kw.pop("backend", "inductor")
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
    name = getattr(model, "__name__", None) or type(model).__name__
    optimus_pass = OptimusPreGradPass(passes, traces, name, pattern_files)
    if check == "off":
        compiled = torch.compile(model, options={**options, "pre_grad_custom_pass": optimus_pass}, **kw)
    else:
        bisect_args = ["--passes", ",".join(passes)] if passes is not None else []
        for f in optimus_pass.pattern_files:
            bisect_args += ["--pattern-file", f]
        compiled = torch.compile(model, backend=CheckedBackend(optimus_pass, options, bisect_args), **kw)
    compiled.optimus_traces = traces  # type: ignore[attr-defined]
    return compiled


class _CallableModule(types.ModuleType):
    """``optimus_lens.compile`` is this module; calling it calls :func:`compile`."""

    def __call__(
        self,
        model,
        passes: list[str] | None = None,
        pattern_files: list[str] | None = None,
        check: str = "first-call",
        **torch_compile_kwargs,
    ):
        return compile(model, passes, pattern_files, check, **torch_compile_kwargs)


sys.modules[__name__].__class__ = _CallableModule
