"""PyTorch Inductor's own post-grad passes, watched step by step on the ATen graphs.

Upstream runs ``post_grad_passes(gm, is_inference)`` (torch/_inductor/fx_passes/post_grad.py)
once on the forward graph and once on the backward graph: its Optimus half
(``group_batch_fusion_passes(graph, pre_grad=False)`` with ``POST_GRAD_FUSIONS``, then every
``post_grad_fusion_options`` key of ``POST_GRAD_PATTERNS``) among Inductor's other passes
(``remove_noop_ops``, ``remove_assert_ops``, the three ``pass_patterns`` pattern-matcher
passes, ``reinplace_inplaceable_ops``, ``decompose_auto_functionalized``, ...).

:func:`observe_post_grad_graph` calls ``post_grad_passes`` itself (no cache can skip it) on
a copy of one captured ATen graph (:mod:`optimus_lens.frontend.aten_capture`), with
``post_grad_fusion_options`` = ``options``, under the graph's FakeTensorMode (as
``compile_fx_inner`` does), and records with the watcher of :mod:`optimus_lens.inductor.watch`:

* every group/batch fusion (one ``fuse(graph, subset)`` call) is a Step, pass = the fusion
  name (``batch_aten_sub``), pattern = its class (``BatchSubPostGradFusion``);
* every pattern-matcher match (one ``PatternEntry.apply``) is a Step, pass = its
  ``PatternMatcherPass.pass_name`` (``normalization_aten_pass``) or, for Inductor's unnamed
  pattern passes, the pass it runs in (``pass_pattern_0``), pattern = the handler;
* every other named pass (a ``GraphTransformObserver`` block: ``remove_noop_ops``,
  ``reinplace_inplaceable_ops``, ...) is one Step with everything it created and erased.

Each Step is verified against the graph's original outputs on its recorded inputs; where
upstream leaves the graph unsorted (its fusions insert before the first or last member and
sort only before the next fusion and at the end) a topologically sorted copy is run
instead, which is what upstream's final ``stable_topological_sort`` would give.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import GraphModule, Node

from optimus_lens.core import verify as _verify
from optimus_lens.core.engine import copy_graph_module
from optimus_lens.core.record import Recording, snapshot_graph
from optimus_lens.core.trace import Step, Trace, VerifyResult
from optimus_lens.frontend.aten_capture import AtenCapture, AtenGraph, capture_aten
from optimus_lens.frontend.capture import Captured, capture
from optimus_lens.frontend.run import model_and_inputs, run_name
from optimus_lens.inductor.observe import add_unrecorded, step_delta
from optimus_lens.inductor.watch import Application, Watcher, own_counters, patched_rules, upstream_counters

#: the name of the changes made outside any named post-grad pass
POST_GRAD_OTHER = "post_grad_passes"
SORTED_NOTE = "checked on a topologically sorted copy (upstream sorts the graph at the end of post_grad_passes)"


def _registries() -> tuple[dict, dict]:
    from torch._inductor.fx_passes.group_batch_fusion import POST_GRAD_FUSIONS
    from torch._inductor.fx_passes.split_cat import POST_GRAD_PATTERNS

    return POST_GRAD_FUSIONS, POST_GRAD_PATTERNS


def known_post_grad_passes() -> list[str]:
    """Every name ``post_grad_fusion_options`` accepts in this torch: the group/batch
    fusions (``POST_GRAD_FUSIONS``), then the pattern passes (``POST_GRAD_PATTERNS``)."""
    fusions, patterns = _registries()
    return [*fusions, *(p for p in patterns if p not in fusions)]


def check_post_grad_options(options: dict) -> None:
    """Raise KeyError naming the known passes for a name upstream does not know (upstream
    itself fails deep in compilation with ``InductorError: KeyError``), TypeError for a
    dict entry that is not a dict."""
    if not isinstance(options, dict):
        raise TypeError(f"post_grad_fusion_options must be a dict, not {type(options).__name__}")
    known = known_post_grad_passes()
    unknown = [k for k in options if k not in known]
    if unknown:
        raise KeyError(
            f"unknown upstream post-grad pass(es) {', '.join(map(repr, unknown))}; known: {', '.join(known)}"
        )
    for k, v in options.items():
        if not isinstance(v, dict):
            raise TypeError(f"options for {k!r} must be a dict, not {type(v).__name__}")


def default_post_grad_options() -> dict:
    """Upstream's ``post_grad_fusion_options`` equivalent of our default post-grad pipeline
    (:func:`optimus_lens.passes.post_grad.post_grad_pipeline`): each enabled pass under its
    own name with upstream's defaults (``{}``), ``group_linear`` with ``require_fbgemm``
    (so that it is dropped, not fatal, where fbgemm is absent), in pipeline order."""
    from optimus_lens.passes.post_grad import post_grad_pipeline

    known = set(known_post_grad_passes())
    return {
        p.name: ({"require_fbgemm": True} if p.name == "group_linear" else {})
        for p in post_grad_pipeline().enabled()
        if p.name in known
    }


def options_notes(options: dict) -> list[str]:
    """What upstream will silently not do with ``options`` here: ``group_linear`` with
    ``require_fbgemm`` where fbgemm is absent (dropped), and without it (the compile fails)."""
    from optimus_lens.passes.post_grad.decompose import gmm_missing

    notes = []
    missing = gmm_missing()
    if "group_linear" in options and missing:
        if options["group_linear"].get("require_fbgemm"):
            notes.append("group_linear: dropped by upstream (require_fbgemm, and " + missing.split(";")[0] + ")")
        else:
            notes.append("group_linear: upstream will fail on its first group: " + missing.split(";")[0])
    return notes


def _fake_mode(gm: GraphModule) -> Any:
    from torch._subclasses.fake_tensor import FakeTensor

    for n in gm.graph.nodes:
        v = n.meta.get("val")
        if isinstance(v, FakeTensor):
            return v.fake_mode
    return None


def _is_sorted(gm: GraphModule) -> bool:
    seen: set[Node] = set()
    for n in gm.graph.nodes:
        if any(i not in seen for i in n.all_input_nodes):
            return False
        seen.add(n)
    return True


def sorted_copy(gm: GraphModule) -> GraphModule:
    """A copy of ``gm`` in a topological order that keeps the list order where it can
    (each node after its inputs, inputs placed first, as upstream's
    ``stable_topological_sort`` orders): a graph upstream left unsorted, made runnable
    without changing it. O(nodes + edges)."""
    from torch.fx import Graph

    g = Graph()
    g._codegen = gm.graph._codegen
    env: dict[Node, Node] = {}
    for start in gm.graph.nodes:
        stack = [(start, iter(start.all_input_nodes))]
        if start in env:
            continue
        while stack:
            n, it = stack[-1]
            nxt = next((i for i in it if i not in env), None)
            if nxt is not None:
                stack.append((nxt, iter(nxt.all_input_nodes)))
                continue
            stack.pop()
            if n not in env:
                env[n] = g.node_copy(n, lambda x: env[x])
    return GraphModule(gm, g)


def _check(gm: GraphModule, inputs: tuple, ref: _verify.Reference) -> VerifyResult:
    """Verify ``gm`` as it is, or a topologically sorted copy where upstream left it unsorted."""
    if _is_sorted(gm):
        return _verify.check(gm, inputs, ref)
    res = _verify.check(sorted_copy(gm), inputs, ref)
    res.message = f"{res.message}; {SORTED_NOTE}" if res.message else SORTED_NOTE
    return res


def observe_post_grad_graph(
    graph: AtenGraph, options: dict, model_name: str = "", verify: bool = True, keep_going: bool = True
) -> Trace:
    """Run upstream's ``post_grad_passes`` on a copy of ``graph`` (``graph.gm`` is not
    changed) with ``post_grad_fusion_options=options``, recording every upstream rewrite as
    a Step (see the module doc); returns the graph's Trace (``Trace.graph`` is the graph's
    name). ``capture`` holds upstream's counters for the graph, the seconds the passes
    took and :func:`options_notes`. With ``keep_going`` a rule that raises ends the trace
    with a failed Step (``checked="raised"``) instead of an exception. Raises KeyError /
    TypeError for bad options."""
    from torch._inductor.fx_passes.post_grad import post_grad_passes

    check_post_grad_options(options)
    gm = copy_graph_module(graph.gm)
    inputs = graph.example_inputs
    ref = _verify.reference(gm, inputs) if verify else None
    trace = Trace(
        model=model_name,
        initial_graph=snapshot_graph(gm.graph),
        passes=[_pass_json(k, v) for k, v in options.items()],
        capture={
            **graph.info(),
            "upstream": True,
            "torch": torch.__version__,
            "options": options,
            "notes": options_notes(options),
        },
        graph=graph.name,
    )

    def add_step(app: Application, rec: Recording, touched: list[Node]) -> Step:
        created, removed, delta = step_delta(rec, touched)
        step = Step(
            index=len(trace.steps) + 1,
            pass_name=app.pass_name,
            pattern=app.pattern,
            sites=list(app.sites),
            created=[n.name for n in created],
            erased=removed,
            replaced=dict(rec.replaced),
            delta=delta,
            match_s=app.match_s,
            rewrite_s=app.seconds,
            nodes_after=len(gm.graph.nodes),
            graph=graph.name,
        )
        trace.steps.append(step)
        return step

    def on_change(app: Application, rec: Recording, touched: list[Node]) -> None:
        step = add_step(app, rec, touched)
        if ref is not None:
            step.verify = _check(gm, inputs, ref)

    w = Watcher(gm, on_change, other=POST_GRAD_OTHER)
    t0 = time.perf_counter()
    try:
        with upstream_post_grad(gm, options), patched_rules(w, spans=True):
            w.open_outside()
            try:
                post_grad_passes(gm, graph.is_inference)
            except BaseException:
                w.close_outside(emit=False)
                raise
            w.close_outside()
            counts = {k: int(v) for k, v in upstream_counters().items() if v}
    except Exception as e:
        if not keep_going:
            raise
        app = w.failure[0] if w.failure is not None and w.failure[3] is e else None
        if app is not None:
            _, rec, touched, _ = w.failure  # type: ignore[misc]
            step = add_step(app, rec, touched)
        else:
            step = add_step(Application(POST_GRAD_OTHER, "post_grad_passes", [], {}, True, False, 0.0), Recording(), [])
        raised = VerifyResult(
            False, checked="raised", message=f"{step.pattern} raised {type(e).__name__}: {_first_line(e)}"
        )
        step.verify = raised
        trace.final_verify = raised
        trace.capture["raised"] = f"{type(e).__name__}: {_first_line(e)}"
        return trace
    seconds = time.perf_counter() - t0
    extra = add_unrecorded(trace, gm, POST_GRAD_OTHER)
    if extra is not None and ref is not None:
        extra.verify = _check(gm, inputs, ref)
    trace.capture.update({"counters": counts, "seconds": round(seconds, 4)})
    if ref is not None:
        trace.final_verify = _check(gm, inputs, ref)
    return trace


def _pass_json(name: str, opts: dict) -> dict:
    fusions, patterns = _registries()
    if name in fusions:
        pats, kind = [fusions[name].__name__], "post-grad group/batch fusion (group_batch_fusion.py)"
    else:
        from optimus_lens.inductor.watch import entry_name

        entries = [e for es in patterns[name].patterns.values() for e in es]
        pats, kind = list(dict.fromkeys(entry_name(e) for e in entries)), "post-grad pattern pass (split_cat.py)"
    return {"name": name, "enabled": True, "patterns": pats, "options": dict(opts), "description": f"upstream {kind}"}


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


@dataclass
class PostGradObserveResult:
    """A recorded run of upstream's post-grad passes on a model's ATen graphs: ``trace``
    (the pre-grad graph, unchanged, with one trace per ATen graph in ``trace.graphs``),
    the capture and ATen capture it started from, and the ``post_grad_fusion_options``."""

    trace: Trace
    captured: Captured
    aten: AtenCapture
    options: dict
    spec: str
    notes: list[str] = field(default_factory=list)


def observe_post_grad(
    spec_or_model: str | torch.nn.Module,
    inputs: tuple | None = None,
    options: dict | None = None,
    mode: str = "inference",
    verify: bool = True,
    capture_method: str = "dynamo",
    graph_index: int | None = None,
    captured: Captured | None = None,
    aten: AtenCapture | None = None,
    pre_grad_gm: GraphModule | None = None,
    keep_going: bool = True,
) -> PostGradObserveResult:
    """Capture a model (or reuse ``captured``), capture its ATen graphs in ``mode`` (or reuse
    ``aten``) from the captured program (or from ``pre_grad_gm``, a program already
    rewritten before grad), and record upstream's post-grad passes on each
    (:func:`observe_post_grad_graph`): upstream's counterpart of
    :func:`optimus_lens.frontend.run.optimize` with ``stage="post-grad"``. ``options`` is
    upstream's ``post_grad_fusion_options`` (default: :func:`default_post_grad_options`).
    Raises ModelSpecError, CaptureError, AtenCaptureError, KeyError / TypeError for bad
    options."""
    opts = default_post_grad_options() if options is None else options
    check_post_grad_options(opts)
    if captured is None:
        model, inputs, name = model_and_inputs(spec_or_model, inputs)
        if mode == "training" and isinstance(spec_or_model, str):
            model.train()
        captured = capture(model, tuple(inputs), method=capture_method, graph_index=graph_index)
    else:
        name = run_name(spec_or_model)
    program = pre_grad_gm if pre_grad_gm is not None else captured.gm
    aten = aten if aten is not None else capture_aten(program, captured.example_inputs, mode)
    top = Trace(
        model=name,
        initial_graph=snapshot_graph(program.graph),
        capture={**captured.info(), "upstream": True, "stage": "post-grad", "mode": mode, "options": opts},
    )
    top.graphs = [observe_post_grad_graph(g, opts, name, verify, keep_going) for g in aten.graphs]
    return PostGradObserveResult(top, captured, aten, opts, name, options_notes(opts))


def run_post_grad_upstream(graph: AtenGraph, options: dict) -> GraphModule:
    """Upstream's ``post_grad_passes`` with ``post_grad_fusion_options=options`` on a copy of
    ``graph`` (unchanged), unrecorded: the graph Inductor would lower (the bench's
    ``upstream`` post-grad stage). Raises KeyError / TypeError for bad options and what
    upstream raises."""
    from torch._inductor.fx_passes.post_grad import post_grad_passes

    check_post_grad_options(options)
    gm = copy_graph_module(graph.gm)
    with upstream_post_grad(gm, options):
        post_grad_passes(gm, graph.is_inference)
    return gm


@contextmanager
def upstream_post_grad(gm, options: dict) -> Iterator[None]:
    """What upstream's ``post_grad_passes`` runs under here: our own counters, Inductor's
    config with ``post_grad_fusion_options=options`` and no custom passes, and ``gm``'s fake
    mode (the metas its passes propagate are FakeTensors of that mode)."""
    import torch._inductor.config as cfg
    from torch._inductor.virtualized import V

    mode = _fake_mode(gm)
    with (
        own_counters(),
        cfg.patch(
            post_grad_fusion_options=options,
            post_grad_custom_pre_pass=None,
            post_grad_custom_post_pass=None,
            pattern_matcher=True,
        ),
        V.set_fake_mode(mode) if mode is not None else nullcontext(),
    ):
        yield
