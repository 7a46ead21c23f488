"""Capture: nn.Module + example inputs -> the pre-grad FX GraphModule Optimus works on.

Default (``method="dynamo"``): the graph Dynamo hands a ``torch.compile`` backend —
torch IR (``torch._C._nn.linear``, ``F.layer_norm``, ``torch.split`` ...), parameters
lifted to placeholders, every node carrying ``example_value`` (FakeTensor),
``stack_trace`` and ``nn_module_stack``. This is the graph upstream's
``pre_grad_passes`` sees. Graph breaks are reported — how many graphs and why — and
the caller chooses which graph to optimise; none is dropped silently.

``method="symbolic"``: ``torch.fx`` symbolic tracing (through nn modules, so
``nn.Linear`` becomes ``F.linear``) followed by FakeTensor propagation for shapes.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import torch
from torch.fx import GraphModule

from optimus_lens.core.storage import clone_preserving_aliases

METHODS = ("dynamo", "symbolic")


class CaptureError(RuntimeError):
    """The model could not be captured (Dynamo or FX tracing raised, or no graph came out)."""


@dataclass
class Captured:
    """A captured model.

    ``gm`` is the chosen graph (``graph_index`` of ``graphs``), ``example_inputs`` the real
    tensors for its placeholders (user inputs, then lifted parameters and buffers, as
    Dynamo passes them). ``breaks`` holds one reason per graph break; ``seconds`` is the
    capture wall time (s).
    """

    gm: GraphModule
    example_inputs: tuple
    graphs: list[tuple[GraphModule, tuple]] = field(default_factory=list)
    graph_index: int = 0
    breaks: list[str] = field(default_factory=list)
    method: str = "dynamo"
    seconds: float = 0.0
    dynamo_graphs: int | None = None
    eager: list[str] = field(default_factory=list)
    dynamic: bool = False
    #: where a graph read from a compile log came from (:meth:`LoggedGraph.info
    #: <optimus_lens.frontend.compile_log.LoggedGraph.info>`); None for a captured model
    log: dict | None = None
    grad: bool = False

    def info(self) -> dict:
        """Plain-data summary stored in the Trace (``trace.capture``). ``dynamo_graphs``
        and ``breaks`` are what ``torch._dynamo.explain`` reports; ``graphs`` counts the
        graphs handed to the backend (recompilations included); ``eager`` names the code
        Dynamo ran outside any graph."""
        out = {
            "method": self.method,
            "dynamic": self.dynamic,
            "grad": self.grad,
            "graphs": len(self.graphs),
            "graph_index": self.graph_index,
            "graph_nodes": [len(g.graph.nodes) for g, _ in self.graphs],
            "breaks": self.breaks,
            "dynamo_graphs": self.dynamo_graphs,
            "eager": self.eager,
            "seconds": round(self.seconds, 3),
            "torch": torch.__version__,
        }
        if self.log is not None:  # the log's graphs of this artifact, not just the one loaded
            out["log"] = self.log
            out["graphs"] = self.log.get("graphs", out["graphs"])
            out["graph_nodes"] = self.log.get("graph_nodes", out["graph_nodes"])
        return out

    def summary(self) -> str:
        """For humans: the graph chosen, and every graph break (full reason) and piece of
        code run outside any graph, if there are any."""
        if self.log is not None:
            return _log_summary(self)
        n = len(self.graphs)
        base = f"captured {len(self.gm.graph.nodes)} nodes with {self.method} in {self.seconds:.2f} s"
        lines = []
        if n > 1 or self.breaks:
            explain = (
                f"torch._dynamo.explain: {self.dynamo_graphs} graph(s), {len(self.breaks)} graph break(s)"
                if self.dynamo_graphs is not None
                else f"{len(self.breaks)} graph break(s)"
            )
            again = f"; {n} compiled graphs with recompilations" if self.dynamo_graphs not in (None, n) else ""
            lines.append(
                f"{base}: {explain}{again}; showing graph {self.graph_index} (0-based) of {n} (--graph N picks another)"
            )
            for i, b in enumerate(self.breaks, 1):
                lines.append(f"  break {i}: " + b.replace("\n", "\n    "))
        else:
            lines.append(base)
        for e in self.eager:
            lines.append("  runs outside any graph: " + e.replace("\n", "\n    "))
        return "\n".join(lines)


def capture(
    model: torch.nn.Module,
    example_inputs: tuple,
    method: str = "dynamo",
    graph_index: int | None = None,
    dynamic: bool = False,
    copy_inputs: bool = True,
    grad: bool = False,
) -> Captured:
    """Capture ``model`` on ``example_inputs``.

    ``grad``: capture with grad mode on, as a training step runs the model (for a run
    that verifies gradients); off, as inference does. The model's own regions are kept
    either way: a ``with torch.no_grad():`` block inside ``forward`` is a
    ``_set_grad_enabled(False)`` ... ``(True)`` pair in a grad-mode capture (under
    ``no_grad`` it is invisible, the whole graph runs without grad), an ``enable_grad``
    block the reverse, ``torch.autocast(...)`` an ``_enter_autocast`` / ``_exit_autocast``
    pair in both (:mod:`optimus_lens.core.aliasing` reads them as regions).

    ``dynamic`` (Dynamo only): capture with dynamic shapes (``torch.compile(dynamic=True)``):
    sizes become SymInts (``s0``, ...) in every ``example_value``, with SymInt placeholders
    for the sizes the graph reads, so the graph holds for other input shapes.

    With graph breaks, ``graph_index`` picks the graph (default: the one with the most
    nodes). ``copy_inputs`` (default) runs Dynamo on a deep copy of ``example_inputs``;
    without it the example inputs of the user-input placeholders are the caller's own
    tensors (what :func:`optimus_lens.perf.trainable.transform` maps them by). Raises CaptureError with the tracer's message when the model cannot be
    captured, and ValueError for an unknown ``method`` or an out-of-range ``graph_index``.
    """
    from optimus_lens.frontend.compile_log import is_logged

    if isinstance(model, GraphModule) and is_logged(model):
        return _logged(model, example_inputs, graph_index)
    if method not in METHODS:
        raise ValueError(f"capture method must be one of {METHODS}, not {method!r}")
    if not isinstance(example_inputs, tuple):
        example_inputs = tuple(example_inputs) if isinstance(example_inputs, list) else (example_inputs,)
    t0 = time.perf_counter()
    dynamo_graphs: int | None = None
    eager: list[str] = []
    breaks: list = []
    try:
        if method == "symbolic":
            graphs, breaks = [_symbolic(model, example_inputs)], []
        else:
            graphs, breaks, dynamo_graphs, eager = _dynamo(model, example_inputs, dynamic, copy_inputs, grad)
    except CaptureError:
        raise
    except Exception as e:  # noqa: BLE001 - any capture failure is bad input, explained
        raise CaptureError(f"capturing {type(model).__name__} failed: {type(e).__name__}: {e}") from e
    if not graphs:
        why = (
            f" (Dynamo ran it outside any graph: {eager[0]})"
            if eager
            else ": the model has no tensor operations to capture"
        )
        raise CaptureError(f"Dynamo produced no graph{why}")
    if graph_index is None:
        graph_index = max(range(len(graphs)), key=lambda i: len(graphs[i][0].graph.nodes))
    if not 0 <= graph_index < len(graphs):
        raise ValueError(f"graph_index {graph_index} is outside 0..{len(graphs) - 1}")
    gm, ex = graphs[graph_index]
    return Captured(
        gm, ex, graphs, graph_index, breaks, method, time.perf_counter() - t0, dynamo_graphs, eager, dynamic, grad=grad
    )


def _logged(gm: GraphModule, example_inputs: tuple, graph_index: int | None) -> Captured:
    """A graph read from a compile log (:mod:`optimus_lens.frontend.compile_log`) is already
    the graph Dynamo captured: no tracing. Its graph breaks are the log's graphs;
    ``graph_index`` picks another graph of the same artifact (the log's frames, in
    order). Raises ValueError for an index outside them."""
    from optimus_lens.frontend.compile_log import load_entry, read_log

    t0 = time.perf_counter()
    info = gm.meta["optimus_log"]
    log = read_log(info["path"])
    same = log.graphs(info["artifact"])
    if graph_index is not None:
        if not 0 <= graph_index < len(same):
            raise ValueError(f"graph_index {graph_index} is outside 0..{len(same) - 1} (the log's {info['artifact']}s)")
        loaded = load_entry(log, same[graph_index])
        gm, example_inputs, info = loaded.gm, loaded.example_inputs, loaded.gm.meta["optimus_log"]
    index = next((i for i, e in enumerate(same) if e.index == info["index"]), 0)
    info = {**info, "graph_nodes": [e.nodes for e in same]}
    breaks = [b for cid in log.breaks for b in log.breaks[cid]]
    return Captured(
        gm,
        tuple(example_inputs),
        [(gm, tuple(example_inputs))],
        index,
        breaks,
        "log",
        time.perf_counter() - t0,
        len(log.graphs()),
        [],
        False,
        log=info,
    )


def _log_summary(c: Captured) -> str:
    info = c.log or {}
    n = info.get("graphs", 1)
    lines = [
        f"read {info.get('compile_id')}:{info.get('artifact')} ({len(c.gm.graph.nodes)} nodes) from the compile log "
        f"{info.get('path')} (torch {info.get('torch') or '?'}); it holds {n} {info.get('artifact')} graph(s)"
        + (f", this is {c.graph_index} (0-based; --graph N picks another)" if n > 1 else "")
    ]
    for i, b in enumerate(c.breaks, 1):
        lines.append(f"  break {i}: " + b.replace("\n", "\n    "))
    for note in info.get("notes", []):
        lines.append(f"  input: {note}")
    return "\n".join(lines)


def _copied(inputs: tuple) -> tuple:
    """A deep copy of the example inputs, so that a capture never changes the caller's
    objects (an input may cache values derived from its tensors, as torchrec's
    KeyedJaggedTensor does in ``to_dict()``; ``deepcopy`` keeps inputs that share a
    storage sharing one); where an input cannot be deep-copied (a non-leaf tensor), its
    tensors are copied storage by storage and other objects are shared."""
    try:
        return copy.deepcopy(inputs)
    except Exception:  # noqa: BLE001 - e.g. a non-leaf tensor: copy the tensors storage by storage
        return clone_preserving_aliases(inputs)


def _dynamo(
    model, inputs, dynamic: bool = False, copy_inputs: bool = True, grad: bool = False
) -> tuple[list, list[str], int | None, list[str]]:
    """Graphs from a ``torch.compile`` backend (with their example inputs), then graph
    count and break reasons from ``torch._dynamo.explain``, and the frames Dynamo ran
    eagerly, each with its reason (from Dynamo's ``unimplemented`` counters). Traced with
    grad mode ``grad``."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    graphs: list[tuple[GraphModule, tuple]] = []
    state = _StateGuard(model)

    def backend(gm: GraphModule, ex):
        # the backend runs before the graph does: these copies are the inputs as the
        # model received them (a model that writes its input is verified on unwritten data);
        # with copy_inputs=False the inputs themselves (optimus_lens.transform maps
        # placeholders to the model's parameters by identity)
        ex = tuple(_concrete(e) for e in ex)
        graphs.append((gm, clone_preserving_aliases(ex) if copy_inputs else ex))
        state.note(ex)
        return gm.forward

    torch._dynamo.reset()
    seen = dict(counters["unimplemented"])  # Dynamo's counters are global: read only what this run adds
    try:
        with torch.set_grad_enabled(grad):
            torch.compile(model, backend=backend, dynamic=dynamic)(*(_copied(inputs) if copy_inputs else inputs))
    except Exception as e:  # noqa: BLE001 - turned into a specific, explained error
        raise CaptureError(
            f"Dynamo could not capture {type(model).__name__}: {type(e).__name__}: "
            f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        ) from e
    finally:
        torch._dynamo.reset()
        state.restore()
    new = [r for r, k in counters["unimplemented"].items() if k > seen.get(r, 0)]
    eager = [_reason_text(r) for r in new if "frame skipped" in r or "Skipping the frame" in r]
    dynamo_graphs: int | None = None
    breaks: list = []
    if len(graphs) > 1 or new:
        try:
            dynamo_graphs, breaks = _explain(model, inputs, grad)
        finally:
            state.restore()
    return graphs, breaks, dynamo_graphs, eager


class _StateGuard:
    """Puts back the model's own tensors (parameters, buffers: graph inputs the caller
    owns) that a capture run wrote in place (``self.count.add_(1)``, running statistics),
    from the copies the backend took before each graph ran; a tensor is restored when
    its version counter moved. The caller's example inputs are never written: the
    capture runs on a deep copy of them."""

    def __init__(self, model):
        self.tensors: dict[int, tuple[torch.Tensor, int]] = {}
        if isinstance(model, torch.nn.Module):
            for t in (*model.parameters(), *model.buffers()):
                self.tensors.setdefault(id(t), (t, t._version))
        self.copies: dict[int, torch.Tensor] = {}

    def note(self, ex: tuple) -> None:
        """Remember pristine copies of the model's tensors among a graph's inputs ``ex``."""
        mine = [t for t in ex if isinstance(t, torch.Tensor) and id(t) in self.tensors and id(t) not in self.copies]
        for t, c in zip(mine, clone_preserving_aliases(tuple(mine))):
            self.copies[id(t)] = c

    def restore(self) -> None:
        with torch.no_grad():
            for key, (t, version) in self.tensors.items():
                if t._version != version and key in self.copies:
                    t.copy_(self.copies[key])
                    self.tensors[key] = (t, t._version)


def _reason_text(reason: str) -> str:
    """Dynamo's reason without its blank lines and documentation link."""
    lines = [ln.rstrip() for ln in reason.strip().splitlines()]
    return "\n".join(ln for ln in lines if ln and not ln.lstrip().startswith("For more details"))


def _explain(model, inputs, grad: bool = False) -> tuple[int | None, list[str]]:
    """``torch._dynamo.explain``'s graph count and one text per break: the full reason
    (operator, explanation, Dynamo's hint) and the user frame it happened in."""
    import torch._dynamo

    try:
        with torch.set_grad_enabled(grad):
            out = torch._dynamo.explain(model)(*_copied(inputs))
    except Exception as e:  # noqa: BLE001
        return None, [f"(reasons unavailable: explain raised {type(e).__name__}: {e})"]
    finally:
        torch._dynamo.reset()
    reasons = []
    for br in out.break_reasons:
        where = ""
        if br.user_stack:
            fr = br.user_stack[-1]
            where = f"\nat {fr.filename}:{fr.lineno} in {fr.name}" + (f": {fr.line.strip()}" if fr.line else "")
        reasons.append(f"{_reason_text(br.reason)}{where}")
    return out.graph_count, reasons


class _IntoModules(torch.fx.Tracer):
    """Traces through every nn.Module, so nn.Linear appears as F.linear as under Dynamo."""

    def is_leaf_module(self, m, qualname):  # noqa: D401
        return False


def _symbolic(model, inputs) -> tuple[GraphModule, tuple]:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    tracer = _IntoModules()
    tracer.record_stack_traces = True
    try:
        graph = tracer.trace(model)
    except Exception as e:  # noqa: BLE001
        raise CaptureError(f"symbolic tracing failed for {type(model).__name__}: {type(e).__name__}: {e}") from e
    gm = GraphModule(tracer.root, graph, type(model).__name__)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        FakeTensorProp(gm, mode).propagate(*_copied(inputs))
    except Exception as e:  # noqa: BLE001
        raise CaptureError(f"shape propagation failed: {type(e).__name__}: {e}") from e
    for n in gm.graph.nodes:
        if "val" in n.meta:
            n.meta["example_value"] = n.meta["val"]
    return gm, _copied(tuple(inputs))  # reference runs call the graph on these: not the caller's objects


def _concrete(x):
    """A SymInt example input (dynamic shapes hand the backend the size symbols) as the
    int it stands for in this call; anything else as it is."""
    if isinstance(x, (torch.SymInt, torch.SymFloat)):
        hint = x.node.hint
        return type(hint)(hint) if hint is not None else x
    return x
