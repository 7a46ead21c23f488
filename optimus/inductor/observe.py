"""PyTorch Inductor's own Optimus passes: run them, count them, and watch them step by step.

Upstream's pre-grad Optimus passes live in ``torch/_inductor/fx_passes/pre_grad.py``
(``pre_grad_passes``), ``group_batch_fusion.py`` (horizontal fusions, one
``GroupBatchFusionBase.fuse(graph, subset)`` call per fused group) and ``split_cat.py``
(split/cat pattern passes, one ``PatternEntry.apply(match, graph, node)`` call per match
inside a ``PatternMatcherPass``). Which of them run is chosen by
``torch._inductor.config.pre_grad_fusion_options`` (a dict ``{pass name: options}``).

* :func:`run_upstream` runs ``pre_grad_passes`` directly (not through ``torch.compile``,
  so no FX-graph or AOT cache can skip it) on a copy of a captured graph and returns
  upstream's counters.
* :func:`fusions_per_pass` turns those counters into "rewrites per pass", undoing
  upstream's counter quirks (see its docstring).
* :func:`observe_upstream` runs the same passes with the Optimus Lens recorder attached,
  so every upstream fusion or pattern replacement becomes one :class:`~optimus_lens.core.trace.Step`
  that the viewer can step through like one of ours.

* :func:`observe` captures a model spec first, as :func:`optimus_lens.frontend.run.optimize`
  does for our passes (the CLI's ``optimus upstream``, the app's upstream source).

Both attribute graph changes to the rule call that made them through
:mod:`optimus_lens.inductor.watch`.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch.fx import GraphModule, Node

from optimus_lens.core import verify as _verify
from optimus_lens.core.engine import copy_graph_module
from optimus_lens.core.record import Recording, node_record, snapshot_graph
from optimus_lens.core.trace import Delta, GraphSnapshot, Step, Trace, VerifyResult
from optimus_lens.frontend.capture import Captured, capture
from optimus_lens.frontend.run import model_and_inputs, run_name
from optimus_lens.inductor.watch import (
    OTHER_PASS,
    Application,
    Watcher,
    entry_name,
    own_counters,
    patched_rules,
    raised_text,
    upstream_config,
    upstream_counters,
)

#: counters that are statistics about rewrites, not rewrites (the ``scmerge_*`` family too)
BOOKKEEPING = frozenset({"pattern_matcher_count", "pattern_matcher_nodes"})

#: counters named after something other than their pass
COUNTER_PASS = {
    "decompose_mm": "decompose_mm_pass",
    "decompose_addmm": "decompose_mm_pass",
    "decompose_bmm": "decompose_mm_pass",
}

UNRECORDED_PATTERN = "unrecorded changes"
META_REFRESH_PATTERN = "values refreshed (meta['val'] recomputed)"
UNSORTED_MESSAGE = "upstream leaves the graph unsorted until its final stable_topological_sort"


# --------------------------------------------------------------------------- results


@dataclass
class UpstreamRun:
    """Result of :func:`run_upstream`.

    ``gm`` is the rewritten copy; ``counters`` the ``counters["inductor"]`` entries the
    run bumped; ``seconds`` the wall time of ``pre_grad_passes`` (s); ``nodes_before`` /
    ``nodes_after`` the node counts of the graph; ``applications`` every rule call in
    order (see :class:`Application`)."""

    gm: GraphModule
    counters: dict[str, int]
    seconds: float
    nodes_before: int
    nodes_after: int
    applications: list[Application] = field(default_factory=list)

    @property
    def fusions(self) -> dict[str, int]:
        """Rewrites per upstream pass, counter quirks undone (:func:`fusions_per_pass`)."""
        return fusions_per_pass(self.counters, self.applications)


# --------------------------------------------------------------------------- options


def _registries() -> tuple[dict, dict]:
    from torch._inductor.fx_passes.group_batch_fusion import PRE_GRAD_FUSIONS
    from torch._inductor.fx_passes.pre_grad import PRE_GRAD_PATTERNS

    return PRE_GRAD_FUSIONS, PRE_GRAD_PATTERNS


def known_pre_grad_passes() -> list[str]:
    """Every name ``pre_grad_fusion_options`` accepts in this torch: the group/batch
    fusions (``PRE_GRAD_FUSIONS``), then the pattern passes (``PRE_GRAD_PATTERNS``)."""
    fusions, patterns = _registries()
    return [*fusions, *(p for p in patterns if p not in fusions)]


def check_options(options: dict) -> None:
    """Raise KeyError naming the known passes if ``options`` holds a name upstream does
    not know (upstream itself fails later, deep inside compilation, with a bare
    ``KeyError``), and TypeError if an entry is not a dict."""
    if not isinstance(options, dict):
        raise TypeError(f"pre_grad_fusion_options must be a dict, not {type(options).__name__}")
    known = known_pre_grad_passes()
    unknown = [k for k in options if k not in known]
    if unknown:
        raise KeyError(f"unknown upstream pre-grad pass(es) {', '.join(map(repr, unknown))}; known: {', '.join(known)}")
    for k, v in options.items():
        if not isinstance(v, dict):
            raise TypeError(f"options for {k!r} must be a dict, not {type(v).__name__}")


#: our passes with no upstream pass of the same name -> upstream's passes doing that work
OUR_PASS_UPSTREAM = {"split_cat_cleanup": ["unbind_stack_pass", "split_cat_pass"]}


def default_options() -> dict:
    """Upstream's ``pre_grad_fusion_options`` equivalent of our default pipeline
    (:func:`optimus_lens.passes.default_pipeline`): each of its passes under the same name, and
    ``split_cat_cleanup`` (identity stack/unbind and split/cat removal) as upstream's
    ``unbind_stack_pass`` and ``split_cat_pass`` (:data:`OUR_PASS_UPSTREAM`), all with
    upstream's default options (``{}``), in pipeline order."""
    from optimus_lens.passes import default_pipeline

    known = set(known_pre_grad_passes())
    out: dict = {}
    for name in default_pipeline().names():
        for up in OUR_PASS_UPSTREAM.get(name, [name]):
            if up in known:
                out.setdefault(up, {})
    return out


# --------------------------------------------------------------------------- counters


def _counter_pass(name: str) -> str | None:
    """The pass a counter counts rewrites of, or None for a statistics counter."""
    if name in BOOKKEEPING or name.startswith("scmerge_"):
        return None
    return COUNTER_PASS.get(name, name)


def fusions_per_pass(counters: dict[str, int], applications: list[Application] | None = None) -> dict[str, int]:
    """Rewrites per upstream pass (pass name -> count; passes with none are left out).

    Upstream bumps ``counters["inductor"][name]`` once per fused group (group/batch
    fusions) or once per rewritten anchor (pattern passes). Its quirks, undone here:

    * statistics counters are dropped: ``pattern_matcher_count`` / ``_nodes`` (every
      pattern-matcher hit, whatever its pass) and the ``scmerge_*`` family
      (``scmerge_split_sections_removed`` is even assigned, not incremented);
    * ``decompose_mm`` / ``decompose_addmm`` / ``decompose_bmm`` count for
      ``decompose_mm_pass``;
    * ``simplify_split_cat`` (``split_cat_pass``, ``SplitCatSimplifier``) bumps
      ``unbind_stack_pass``, never ``split_cat_pass``; with ``applications`` every
      increment is credited to the pass whose rule made it, so these land on
      ``split_cat_pass``. Without them the two cannot be told apart and count for
      ``unbind_stack_pass``;
    * ``normalization_pass`` rewrites and counts every unbind and stack, also those
      already in normal form; with ``applications`` such identity rewrites are not
      counted.

    ``applications`` comes from :func:`run_upstream` (``UpstreamRun.applications``).
    Increments made outside any rule call keep the pass their counter names.
    """
    out: Counter = Counter()
    if applications is None:
        for name, n in counters.items():
            p = _counter_pass(name)
            if p is not None and n:
                out[p] += n
        return {k: v for k, v in out.items() if v}
    credited: Counter = Counter()
    for a in applications:
        for name, n in a.counters.items():
            credited[name] += n
            if _counter_pass(name) is not None and not a.identity:
                out[a.pass_name] += n
    for name, n in counters.items():
        p = _counter_pass(name)
        if p is not None and n - credited[name] > 0:
            out[p] += n - credited[name]
    return {k: v for k, v in out.items() if v}


# --------------------------------------------------------------------------- the watcher


def _is_sorted(gm: GraphModule) -> bool:
    seen: set[Node] = set()
    for n in gm.graph.nodes:
        if any(i not in seen for i in n.all_input_nodes):
            return False
        seen.add(n)
    return True


def _run(gm: GraphModule, example_inputs: tuple, options: dict, w: Watcher) -> tuple[GraphModule, dict, float]:
    from torch._inductor.fx_passes.pre_grad import pre_grad_passes

    with own_counters(), upstream_config(options), patched_rules(w):
        w.open_outside()
        t0 = time.perf_counter()
        try:
            out = pre_grad_passes(gm, list(example_inputs))
        except BaseException:
            w.close_outside(emit=False)
            raise
        seconds = time.perf_counter() - t0
        w.close_outside()
        counts = {k: int(v) for k, v in upstream_counters().items() if v}
    return out, counts, seconds


# --------------------------------------------------------------------------- public API


def run_upstream(gm: GraphModule, example_inputs: tuple, options: dict) -> UpstreamRun:
    """Run upstream's ``pre_grad_passes(gm, example_inputs)`` with
    ``pre_grad_fusion_options=options`` on a copy of ``gm`` (``gm`` is not changed).

    ``example_inputs`` are the graph's real inputs (as :func:`optimus_lens.frontend.capture.capture`
    returns them). The pass is called directly, so Inductor's caches cannot skip it;
    ``counters["inductor"]`` is cleared for the run and restored afterwards, and
    ``UpstreamRun.counters`` holds what the run bumped. Also restored: the config and
    every wrapped upstream function. Raises KeyError for a pass name upstream does not
    know (:func:`check_options`); exceptions from upstream's passes propagate.
    """
    check_options(options)
    copy = copy_graph_module(gm)
    before = len(copy.graph.nodes)
    w = Watcher(copy, lambda app, rec, touched: None)
    out, counts, seconds = _run(copy, example_inputs, options, w)
    return UpstreamRun(out, counts, seconds, before, len(out.graph.nodes), w.applications)


def step_delta(rec: Recording, touched: list[Node]) -> tuple[list[Node], list[str], Delta]:
    """What one upstream application changed, from its Recording and the nodes whose
    arguments it reassigned: (created nodes still alive, erased names, the Delta)."""
    created_ids = {id(n) for n in rec.created}
    created = rec.created_alive()
    nodes = {id(n): n for n in rec.touched()}
    for n in touched:
        nodes.setdefault(id(n), n)
    removed = [n.name for n in rec.erased if id(n) not in created_ids]
    return created, removed, Delta([node_record(n) for n in nodes.values() if not n._erased], removed)


def snapshot_records(snap: GraphSnapshot) -> dict[str, dict]:
    """A snapshot's records as plain dicts, for comparing two snapshots field by field."""
    return {name: asdict(r) for name, r in snap.nodes.items()}


def observe_upstream(
    gm: GraphModule,
    example_inputs: tuple,
    options: dict,
    model_name: str = "",
    verify: bool = False,
    keep_going: bool = False,
) -> Trace:
    """Run upstream's pre-grad passes (as :func:`run_upstream`, on a copy of ``gm``) with
    the Optimus Lens recorder attached; returns a :class:`~optimus_lens.core.trace.Trace`.

    Every upstream rule call that changed the graph is one Step: ``pass_name`` is the
    ``pre_grad_fusion_options`` key (the fusion name, or ``PatternMatcherPass.pass_name``),
    ``pattern`` the fusion class (``PreGradBatchLinearFusion``) or the pattern handler
    (``merge_splits``), ``sites`` the fused subset or the match's nodes. Changes made
    between rule calls (``numpy_compat_normalization``, ``fuse_fx``, ...) become Steps of
    pass ``"pre_grad_passes"``. ``Trace.graph_at(len(steps))`` equals the rewritten graph;
    should a change escape the recorder, a last Step ``"unrecorded changes"`` holds the
    difference, so it is visible rather than lost.

    With ``verify``, each Step is checked against the original graph's outputs when the
    graph is topologically sorted at that point; upstream inserts fused nodes before the
    first member of a group and sorts only at the start of the next fusion and at the
    end, so other Steps are marked ``not-checkable``. ``final_verify`` checks the result.
    Raises KeyError for an unknown pass name, and what upstream's passes raise. With
    ``keep_going``, a rule call that raises ends the run instead: it becomes the last
    Step (what it changed before raising, if anything), failed with ``checked="raised"``
    and the exception in its message, and ``final_verify`` says the same; exceptions
    raised outside any rule call still propagate.
    """
    check_options(options)
    copy = copy_graph_module(gm)
    inputs = tuple(example_inputs)
    ref = _verify.reference(copy, inputs) if verify else None
    trace = Trace(
        model=model_name,
        initial_graph=snapshot_graph(copy.graph),
        passes=[_pass_json(k, v) for k, v in options.items()],
        capture={"upstream": True, "torch": torch.__version__, "options": _jsonable(options)},
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
            nodes_after=len(copy.graph.nodes),
        )
        trace.steps.append(step)
        return step

    def on_change(app: Application, rec: Recording, touched: list[Node]) -> None:
        step = add_step(app, rec, touched)
        if ref is not None:
            step.verify = (
                _verify.check(copy, inputs, ref)
                if _is_sorted(copy)
                else VerifyResult(None, checked="not-checkable", message=UNSORTED_MESSAGE)
            )

    w = Watcher(copy, on_change)
    try:
        out, counts, seconds = _run(copy, inputs, options, w)
    except Exception as e:
        if not keep_going or w.failure is None or w.failure[3] is not e:
            raise
        app, rec, touched, _ = w.failure
        text = raised_text(e, app.pass_name, app.pattern)
        raised = VerifyResult(False, checked="raised", message=text)
        add_step(app, rec, touched).verify = raised
        trace.final_verify = raised
        trace.capture.update({"raised": text})
        return trace
    add_unrecorded(trace, out)
    trace.capture.update({"counters": counts, "seconds": round(seconds, 4)})
    if ref is not None:
        trace.final_verify = _verify.check(out, inputs, ref)
    return trace


def add_unrecorded(trace: Trace, out: GraphModule, pass_name: str = OTHER_PASS) -> Step | None:
    """Append a last Step ``"unrecorded changes"`` (of ``pass_name``) holding the difference
    between the trace's last graph and ``out``'s, should a change have escaped the
    recorder, so it is visible rather than lost; returns it, or None when they are equal.
    When only values changed (shape, dtype, strides: upstream's post-grad
    ``FakeTensorUpdater`` refreshes ``meta["val"]`` at the end, filling the values its
    fusions did not compute), the step's pattern says so (``META_REFRESH_PATTERN``)."""
    final = snapshot_graph(out.graph)
    replay = trace.graph_at(len(trace.steps))
    if snapshot_records(replay) == snapshot_records(final):
        return None
    upsert = [r for name, r in final.nodes.items() if replay.nodes.get(name) != r]
    removed = [name for name in replay.nodes if name not in final.nodes]
    structure = ("op", "target", "args", "kwargs", "inputs")
    meta_only = not removed and all(
        r.name in replay.nodes and all(getattr(r, k) == getattr(replay.nodes[r.name], k) for k in structure)
        for r in upsert
    )
    step = Step(
        index=len(trace.steps) + 1,
        pass_name=pass_name,
        pattern=META_REFRESH_PATTERN if meta_only else UNRECORDED_PATTERN,
        sites=[],
        created=[r.name for r in upsert if r.name not in replay.nodes],
        erased=removed,
        replaced={},
        delta=Delta(upsert, removed),
        match_s=0.0,
        rewrite_s=0.0,
        nodes_after=len(out.graph.nodes),
        graph=trace.graph,
    )
    trace.steps.append(step)
    return step


@dataclass
class ObserveResult:
    """A recorded run of PyTorch's own pre-grad passes: the Trace (one Step per upstream
    rewrite), the capture it started from (untouched: upstream ran on a copy), and the
    ``pre_grad_fusion_options`` used."""

    trace: Trace
    captured: Captured
    options: dict
    spec: str


def observe(
    spec_or_model: str | torch.nn.Module,
    inputs: tuple | None = None,
    options: dict | None = None,
    verify: bool = True,
    capture_method: str = "dynamo",
    graph_index: int | None = None,
    captured: Captured | None = None,
    keep_going: bool = True,
) -> ObserveResult:
    """Capture a model and record Inductor's pre-grad passes on it step by step
    (:func:`observe_upstream`), each step verified against the original graph where
    upstream leaves the graph sorted (``verify``): upstream's counterpart of
    :func:`optimus_lens.frontend.run.optimize`.

    ``options`` is upstream's ``pre_grad_fusion_options`` (default:
    :func:`default_options`, the equivalent of our default pipeline). ``captured`` reuses
    a capture instead of capturing again. With ``keep_going`` (default) an upstream rule
    that raises becomes the trace's last, failed step instead of an exception (see
    :func:`observe_upstream`). Raises optimus_lens.frontend.run.ModelSpecError,
    optimus_lens.frontend.capture.CaptureError, KeyError / TypeError for bad options,
    and what upstream raises outside its rules (or in them, without ``keep_going``)."""
    if captured is None:
        model, inputs, name = model_and_inputs(spec_or_model, inputs)
        captured = capture(model, tuple(inputs), method=capture_method, graph_index=graph_index)
    else:
        name = run_name(spec_or_model)
    opts = default_options() if options is None else options
    trace = observe_upstream(
        captured.gm, captured.example_inputs, opts, model_name=name, verify=verify, keep_going=keep_going
    )
    trace.capture.update({k: v for k, v in captured.info().items() if k not in trace.capture})
    return ObserveResult(trace, captured, opts, name)


def _pass_json(name: str, opts: dict) -> dict:
    fusions, patterns = _registries()
    if name in fusions:
        pats, kind = [fusions[name].__name__], "group/batch fusion (group_batch_fusion.py)"
    else:
        entries = [e for es in patterns[name].patterns.values() for e in es]
        pats, kind = list(dict.fromkeys(entry_name(e) for e in entries)), "pattern pass (split_cat.py)"
    return {
        "name": name,
        "enabled": True,
        "patterns": pats,
        "options": _jsonable(opts),
        "description": f"upstream {kind}",
    }


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x if x is None or isinstance(x, (bool, int, float, str)) else repr(x)
