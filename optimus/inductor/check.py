"""The safety net of ``optimus_lens.compile(..., check="first-call")``.

Under ``torch.compile`` the Optimus pipeline runs on FakeTensors inside Inductor, where
nothing can be verified. With the check, :class:`CheckedBackend` is the Dynamo backend:
Dynamo hands it each graph with the *real* tensors of the call that reached it (the
first call, or the call that caused a recompile) before the graph has run on them. It

1. copies those inputs, storage by storage so their aliasing is kept
   (:func:`optimus_lens.core.storage.clone_preserving_aliases`);
2. compiles the graph with Inductor and the Optimus pipeline as its
   ``pre_grad_custom_pass`` (what ``check="off"`` runs, unchecked);
3. runs the graph as Dynamo captured it, eagerly, and the compiled graph, each on its own
   fresh copy of the pristine inputs (writes never leak into the caller's tensors or into
   the other run), and compares what a caller sees (:func:`optimus_lens.core.verify.compare_run`):
   output values and dtypes, strides, which outputs overlap inputs or each other, the
   inputs after the call, and in training (grad mode on, an input requiring grad) the
   gradients of a fixed weighted sum of the outputs;
4. on a difference, compiles the graph again without the Optimus passes and runs it the
   same way. If Inductor alone agrees with eager, the Optimus passes are at fault: the
   graph is compiled without them from then on, a :class:`OptimusCheckWarning` names the
   graph, what differed and the ``optimus bisect`` command that finds the step (the graph
   and its inputs are saved for it), and the trace in ``optimus_traces`` records it
   (``final_verify`` failed, ``capture["check"]``). If Inductor alone differs from eager
   as well (its own numerics, or a random op whose numbers Inductor draws differently),
   the difference is not the passes' to judge: the compiled graph is kept and the trace
   says "not-checkable".

Cost, paid once per compiled graph (a recompile is checked again): one eager run and one
compiled run on copies of the graph's inputs (parameters included: one more copy of them
in memory while the check runs), and on a difference one more Inductor compile. A graph
the passes did not change is not checked.
"""

from __future__ import annotations

import shlex
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

from optimus_lens.core.engine import copy_graph_module
from optimus_lens.core.record import snapshot_graph
from optimus_lens.core.storage import clone_preserving_aliases
from optimus_lens.core.trace import Trace, VerifyResult
from optimus_lens.core.verify import Reference, compare_run, execute, reference_of, with_grads

#: values of ``optimus_lens.compile(check=...)``
CHECKS = ("first-call", "off")


class OptimusCheckWarning(UserWarning):
    """A graph compiled with the Optimus passes differed from eager on its first call and
    is compiled without them (the message says what differed and how to find the step)."""


def compare_callables(expected_fn, actual_fn, inputs: tuple) -> tuple[VerifyResult, Reference | None]:
    """Run ``expected_fn`` and ``actual_fn`` (a GraphModule or any callable of the inputs)
    on fresh pristine copies of ``inputs`` each and compare them as
    :func:`optimus_lens.core.verify.compare_run` does, gradients too when grad mode is on
    and an input requires grad (with respect to those inputs). Returns the result and
    the expected run's Reference (None when ``expected_fn`` itself raised: then the
    result is "not-checkable"). A raising ``actual_fn`` is a failed result."""
    grads = torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in inputs)
    try:
        exp = execute(expected_fn, inputs, grads, wrt="requires_grad")
    except Exception as e:  # noqa: BLE001 - the graph itself does not run on copies: nothing to compare
        return VerifyResult(None, checked="not-checkable", message=f"eager run raised {type(e).__name__}: {e}"), None
    ref = reference_of(exp, inputs)
    try:
        act = execute(actual_fn, inputs, grads, wrt="requires_grad")
    except Exception as e:  # noqa: BLE001 - reported as the difference
        return VerifyResult(False, checked="outputs", message=f"the compiled graph raised {type(e).__name__}: {e}"), ref
    res = compare_run(ref, act, inputs)
    if res.ok and grads and ref.grads:
        res = with_grads(res, ref, act)
    return res, ref


class CheckedBackend:
    """A Dynamo backend: Inductor with ``optimus_pass`` as its ``pre_grad_custom_pass``
    (``options``: the rest of Inductor's options), each graph checked on its first call
    against eager and compiled without the passes on a difference (module docstring).

    ``bisect_args`` are the ``optimus bisect`` arguments that select the same pipeline
    (``["--passes", "a,b", "--pattern-file", path]``); ``save_dir`` is where a failing graph
    and its inputs are written for it (default: a new temporary directory)."""

    def __init__(self, optimus_pass, options: dict, bisect_args: list[str], save_dir: str | None = None):
        self.optimus_pass = optimus_pass
        self.options = dict(options)
        self.bisect_args = list(bisect_args)
        self.save_dir = save_dir

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        from torch._inductor.compile_fx import compile_fx

        original = copy_graph_module(gm)  # before Inductor's and our pre-grad passes rewrite gm
        traces = self.optimus_pass.traces
        n = len(traces)
        compiled = compile_fx(
            gm, example_inputs, config_patches={**self.options, "pre_grad_custom_pass": self.optimus_pass}
        )
        trace = traces[-1] if len(traces) > n else None
        if trace is not None and not trace.steps:
            return compiled  # the passes changed nothing: this is Inductor's own graph
        if trace is None:  # an Inductor cache hit: the passes did not run, their artifact is checked all the same
            trace = Trace(
                model=f"{self.optimus_pass.model} graph {n}".strip(),
                initial_graph=snapshot_graph(original.graph),
                capture={"method": "torch.compile pre_grad_custom_pass", "cache": "hit", "torch": torch.__version__},
            )
            traces.append(trace)
        # checked when first run, outside Dynamo's compile (a training graph compiles its backward lazily)
        return FirstCall(self, original, compiled, trace)

    def decide(self, original: torch.fx.GraphModule, compiled, trace: Trace, args: tuple):
        """The callable to run ``original``'s graph with from now on: ``compiled`` when it
        agrees with eager on ``args`` (real inputs the graph has not run on yet), else the
        graph compiled without the Optimus passes when that one agrees (with a warning);
        the trace records the result (module docstring)."""
        from torch._inductor.compile_fx import compile_fx

        pristine = clone_preserving_aliases(tuple(args))
        res, _ = compare_callables(original, compiled, pristine)
        check: dict[str, Any] = {"mode": "first-call", "fallback": False}
        trace.capture["check"] = check
        if res.ok is not False:
            trace.final_verify = _first_call(res)
            return compiled
        plain = compile_fx(copy_graph_module(original), list(pristine), config_patches=self.options)
        alone, _ = compare_callables(original, plain, pristine)
        if alone.ok is False:
            trace.final_verify = VerifyResult(
                None,
                checked="not-checkable",
                message=f"first call: Inductor without the Optimus passes differs from eager too ({alone.message}); "
                f"with them: {res.message}",
            )
            return compiled
        trace.final_verify = _first_call(res)
        check["fallback"] = True
        check["bisect"] = self._bisect_command(original, pristine, trace)
        err = f", max abs err {res.max_abs_err:.3g}" if res.max_abs_err is not None else ""
        warnings.warn(
            f"optimus_lens.compile: {trace.model}: compiled with the Optimus passes, the graph differs from eager on "
            f"its first call ({res.checked}: {res.message}{err}); it is compiled without them. "
            f"Find the step: {check['bisect']}",
            OptimusCheckWarning,
            stacklevel=3,
        )
        return plain

    def _bisect_command(self, original: torch.fx.GraphModule, inputs: tuple, trace: Trace) -> str:
        """Save the graph as Dynamo captured it and its pristine inputs as a model factory
        (``graph_N.py:build``) and return the ``optimus bisect`` command line for it, or
        a sentence saying why the graph could not be saved."""
        folder = Path(self.save_dir or tempfile.mkdtemp(prefix="optimus-check-"))
        stem = "graph_" + "".join(c if c.isalnum() else "_" for c in trace.model.lower()).strip("_")
        try:
            folder.mkdir(parents=True, exist_ok=True)
            torch.save(original, folder / f"{stem}.pt")
            torch.save(tuple(inputs), folder / f"{stem}_inputs.pt")
            (folder / f"{stem}.py").write_text(_FACTORY.format(model=trace.model, stem=stem))
            trace.save(folder / f"{stem}_trace.json")
        except Exception as e:  # noqa: BLE001 - the warning still says what differed
            return f"(the graph could not be saved for optimus bisect: {type(e).__name__}: {e})"
        return shlex.join(["optimus", "bisect", str(folder / f"{stem}.py") + ":build", *self.bisect_args])


class FirstCall:
    """What :class:`CheckedBackend` hands Dynamo for one graph: on its first call, the
    check (:meth:`CheckedBackend.decide`) on that call's inputs picks the compiled
    callable every call then runs."""

    def __init__(self, backend: CheckedBackend, original: torch.fx.GraphModule, compiled, trace: Trace):
        self.backend, self.original, self.compiled, self.trace = backend, original, compiled, trace
        self.fn = None

    def __call__(self, *args):
        if self.fn is None:
            self.fn = self.backend.decide(self.original, self.compiled, self.trace, args)
            self.original = self.compiled = None  # keep only what runs
        return self.fn(*args)


def _first_call(res: VerifyResult) -> VerifyResult:
    """``res`` with ``checked`` saying it is the first-call check."""
    return VerifyResult(res.ok, res.max_abs_err, res.max_rel_err, f"first-call {res.checked}", res.message)


_FACTORY = '''"""{model} as Dynamo captured it for optimus_lens.compile, with the inputs of its
first call: written by the first-call check because, compiled with the Optimus passes, it
differed from eager. Use: optimus bisect THIS_FILE:build"""

from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def build():
    gm = torch.load(HERE / "{stem}.pt", weights_only=False)
    return gm, tuple(torch.load(HERE / "{stem}_inputs.pt", weights_only=False))
'''
