"""A guided walk through one predefined pattern, built from the pattern itself.

:func:`walkthrough` runs one pattern (a one-pattern :class:`~optimus_lens.core.pipeline.Pass`)
over its teaching model (the sample model whose ``teaches`` names it,
:func:`optimus_lens.teach.lookup.teaching_model`) and gathers what a lesson shows, as
the plain data of :mod:`optimus_lens.teach.data`:

1. the graph before, and what the pattern looks for (its ``description`` and
   ``preconditions``, as registered);
2. the search: for a batch pattern, recorded from the engine's own search functions
   (:func:`optimus_lens.teach.replay.search_frames`), one ``Frame`` per move a learner
   can scrub, and the same search on a variant where one member depends on another;
   for a rewrite pattern, every anchor node and what ``match`` said;
3. the match: each step's sites;
4. the graph after, with provenance (the Trace's steps);
5. what it bought: node counts, latency before/after measured side by side by
   :func:`optimus_lens.perf.bench.measure` (median, p10-p90), and peak memory;

plus an ``Exercise`` (:func:`optimus_lens.teach.variants.exercise`): a variant of the
teaching model's graph where the pattern does not fire, with the answer
:class:`optimus_lens.debug.why.DryRun` gives to "why not?"; and the slides' text
(:func:`optimus_lens.teach.slides.lesson_slides`).

Nothing here is written per pattern: every sentence comes from the pattern's
registration, the engine's own search functions, the trace or the why-not machinery.
:mod:`optimus_lens.viz.lesson` draws a Walkthrough; the app's Teach page shows it.
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule

from optimus_lens.core.engine import Engine, RunOptions, copy_graph_module
from optimus_lens.core.memo import graph_unchanged
from optimus_lens.core.miss import Miss
from optimus_lens.core.pattern import BatchPattern, Pattern, why_not
from optimus_lens.core.pipeline import Pass, Pipeline
from optimus_lens.passes.profit import group_estimate
from optimus_lens.perf.bench import measure
from optimus_lens.perf.timings import Stage
from optimus_lens.teach.data import Gain, Walkthrough
from optimus_lens.teach.lookup import lesson_pipeline, predefined_pattern, search_options, teaching_model
from optimus_lens.teach.replay import key_text, search_frames
from optimus_lens.teach.slides import lesson_slides
from optimus_lens.teach.variants import dependent_search, exercise


def _gain(
    before: GraphModule, after: GraphModule, inputs: tuple, repeats: int, warmup: int, threads: int | None = 1
) -> Gain:
    """Both graphs timed by :func:`optimus_lens.perf.bench.measure` on the CPU with ``threads`` torch
    threads (restored after; None: as set). One thread is the default: the teaching models
    are tiny, and on a loaded machine a multi-threaded kernel's thread pool waits for cores
    (a 6 x 8 x 16 bmm measured 20 ms with 2 threads at load 8, 3 us with one), which would
    teach the machine's load, not the pattern; one thread is timed by its CPU time."""
    old = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        res = measure(
            [Stage("before", before, inputs, "baseline"), Stage("after", after, inputs, "pass")],
            repeats=repeats,
            warmup=warmup,
            device="cpu",
        )
    finally:
        torch.set_num_threads(old)
    b, a = res.stages
    return Gain(
        sum(1 for _ in before.graph.nodes),
        sum(1 for _ in after.graph.nodes),
        (b.median_ms, b.p10_ms, b.p90_ms),
        (a.median_ms, a.p10_ms, a.p90_ms),
        b.peak_bytes,
        a.peak_bytes,
        b.peak_source,
        res.method,
        res.device,
        repeats,
    )


def _anchors(gm: GraphModule, pattern: Pattern) -> dict[str, str | None]:
    out = {}
    with graph_unchanged():
        for n in gm.graph.nodes:
            if n.op not in ("call_function", "call_method"):
                continue
            if pattern.anchors and n.target not in pattern.anchors:
                continue
            try:
                out[n.name] = why_not(pattern, n)
            except Exception as e:  # noqa: BLE001 - a raising pattern is itself the answer
                out[n.name] = f"raised {type(e).__name__}: {e}"
    return out


def _why_sites(gm: GraphModule, pattern: Pattern, sites: list[str]) -> str:
    """Why a step's sites went together, read on the graph before: the group key the
    members share (a batch pattern) or the anchor node whose ``match`` returned the site."""
    by = {n.name: n for n in gm.graph.nodes}
    if isinstance(pattern, BatchPattern):
        with graph_unchanged():
            k = pattern.key(by[sites[0]]) if sites[0] in by else None
        return (
            f"all {len(sites)} share the group key {key_text(k)} and none depends on another"
            if k is not None and not isinstance(k, Miss)
            else ""
        )
    return f"{pattern.name}.match({sites[0]}) returned these nodes: the anchor and the rest of its match"


def walkthrough(
    pattern_name: str,
    repeats: int = 7,
    warmup: int = 2,
    timing: bool = True,
    search: str | None = None,
    threads: int | None = 1,
) -> Walkthrough:
    """The walk through ``pattern_name`` on its teaching model (see the module docstring).

    ``repeats``/``warmup``: samples per graph for the latency figures (``timing`` False
    leaves them out: ``gain`` None; ``threads``: CPU threads while timing, see
    :func:`_gain`). ``search`` ("global" or "upstream") picks which
    search a batch pattern's frames replay (default: the pattern's own, global).
    Raises TeachError for an unknown pattern or one no teaching model teaches."""
    from optimus_lens.frontend.capture import capture
    from optimus_lens.frontend.run import model_and_inputs

    pattern = predefined_pattern(pattern_name)
    model_name = teaching_model(pattern_name)
    from optimus_lens import sample_models

    model, inputs, _ = model_and_inputs("sample:" + model_name)
    cap = capture(model, tuple(inputs))
    before = copy_graph_module(cap.gm)
    search_data = search_frames(before, pattern, search) if isinstance(pattern, BatchPattern) else None
    anchors = {} if isinstance(pattern, BatchPattern) else _anchors(before, pattern)
    pipe = lesson_pipeline(pattern)
    if search is not None and isinstance(pattern, BatchPattern):
        pipe = Pipeline(
            [Pass(pattern.name, [pattern], options=search_options(pattern, search), estimate=group_estimate)]
        )
    eng = Engine(
        cap.gm, cap.example_inputs, pipe, RunOptions(verify="end"), model_name=model_name, capture_info=cap.info()
    )
    trace = eng.run()
    after = eng.gm
    gain = _gain(before, after, cap.example_inputs, repeats, warmup, threads) if timing and trace.steps else None
    w = Walkthrough(
        pattern.name,
        pattern.kind,
        pattern.description,
        list(pattern.preconditions),
        pattern.upstream,
        pattern.source,
        model_name,
        sample_models.REGISTRY[model_name].description,
        trace,
        [list(s.sites) for s in trace.steps if s.error is None],
        search_data,
        anchors,
        dependent_search(before, pattern, trace.steps[0].sites, search)
        if search_data is not None and trace.steps
        else None,
        why_sites=[_why_sites(before, pattern, s.sites) for s in trace.steps if s.error is None],
        gain=gain,
        exercise=exercise(pattern, before, after, trace),
    )
    w.slides = lesson_slides(w)
    return w
