"""Run a pipeline of passes over a GraphModule; every applied match is one recorded Step.

A **Pass** is an ordered list of patterns run greedily to a fixed point (at most
``max_iterations`` sweeps). A BatchPattern pass sweeps roots in reverse order and fuses
the independent groups :mod:`optimus_lens.core.search` finds; a RewritePattern pass tries its
patterns at every anchor node, last node first (as Inductor's ``PatternMatcherPass``).
A **Pipeline** is an ordered list of passes, each of which can be switched off.

The graph stays topologically valid after every step (:class:`GraphIndex.repair`);
with ``verify="step"`` it is linted and run after every step.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

from torch.fx import Graph, GraphModule, Node

from optimus_lens.core import aliasing
from optimus_lens.core import strides as _layout
from optimus_lens.core import verify as _verify
from optimus_lens.core.graphcopy import copy_graph, copy_graph_module  # noqa: F401 - published here too
from optimus_lens.core.index import GraphIndex
from optimus_lens.core.memo import graph_unchanged
from optimus_lens.core.miss import Miss
from optimus_lens.core.pattern import BatchPattern, Pattern, RewritePattern, SearchOptions
from optimus_lens.core.pipeline import Estimator, Pass, Pipeline
from optimus_lens.core.record import Recording, RecordingListener, snapshot_graph
from optimus_lens.core.rewriter import DirectMutation, InvalidGraph, LayoutCheck, Rewriter, SymbolicSize
from optimus_lens.core.search import (
    CandidateSearch,
    KeyCache,
    downstream,
    global_groups,
    independent_subsets,
    is_search_root,
    key_classes,
)
from optimus_lens.core.stepcheck import StepCheck, UnsafeRewrite
from optimus_lens.core.trace import PRE_GRAD, Delta, Step, Trace, VerifyResult
from optimus_lens.core.views import refresh_views
from optimus_lens.core.where import raised_in, source_of

VERIFY_MODES = ("step", "end", "off")
ON_ERROR = ("skip", "stop")


class PatternError(RuntimeError):
    """A pattern raised while matching or keying, or (with ``on_error="stop"``) a step
    failed and was rolled back. Carries the pass, pattern and site; the graph is as it
    was before the failing step."""

    def __init__(self, pass_name: str, pattern: str, site: list[str], cause: BaseException):
        self.pass_name, self.pattern, self.site, self.cause = pass_name, pattern, site, cause
        super().__init__(
            f"pattern {pattern!r} in pass {pass_name!r} raised at "
            f"{', '.join(site[:6]) or 'no site'}: {type(cause).__name__}: {cause}"
        )


@dataclass
class RunOptions:
    """``verify``: "step" (lint + run after every step), "end" (once after the pipeline),
    or "off". ``record``: build step deltas (off for timing the search alone).
    ``grads``: compare gradients too. ``keep_stages``: keep a copy of the graph after
    each enabled pass (for per-pass timing). ``on_error``: what to do when a pattern's
    rewrite raises or leaves the graph invalid (the step is rolled back and recorded as
    failed either way): "skip" goes on with that pattern disabled at that site, "stop"
    raises :class:`PatternError`."""

    verify: str = "end"
    record: bool = True
    grads: bool = False
    keep_stages: bool = False
    on_error: str = "skip"

    def __post_init__(self):
        if self.verify not in VERIFY_MODES:
            raise ValueError(f"verify must be one of {VERIFY_MODES}, not {self.verify!r}")
        if self.on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, not {self.on_error!r}")


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the block (restored as it was, also on
    an error). Building or rewriting a graph allocates O(nodes) long-lived objects, and each
    full collection they trigger rescans all of them, so collections grow with the graph:
    without the pause they took 2.8 s of a 24 s recorded run at 85k nodes."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@dataclass
class BatchState:
    """What the engine keeps for one BatchPattern during a pass: its key ``cache``, the
    ``dirty`` search roots (upstream search only: the roots that may find a group),
    the bounded ``search`` and the search options ``opts`` in force (the pass's, else
    the pattern's)."""

    cache: KeyCache
    dirty: set[Node]
    search: CandidateSearch
    opts: SearchOptions


class IndexListener(RecordingListener):
    """The engine's indexes as a Rewriter listener: it collects one step's changes as they
    are made (into ``rec``, the step's record) and, when the step commits,
    updates the ``GraphIndex`` numberings, the target index, the passes' key caches and
    the dirty roots (:meth:`Engine._note_change`).
    A rolled-back step leaves the indexes untouched (the buffer is dropped), so they never
    see a change that did not happen."""

    def __init__(self, engine: Engine, rec: Recording):
        super().__init__(rec)
        self.engine = engine

    def commit(self) -> list[Node]:
        """Apply the step's changes to the indexes; returns the created nodes still alive."""
        rec = self.rec
        created = rec.created_alive()
        # each live rewired node once: a user of all k members of a group (the next layer's stack
        # of 128 inputs) is rewired k times, and every pass below reads each node's inputs
        rewired = [n for n in dict.fromkeys(rec.rewired) if not n._erased]
        quiet = aliasing.analysis(self.engine.gm.graph).quiet  # no place matters but the data edges'
        self.engine.index.update(created, rec.erased, rewired, block=quiet)
        self.engine._note_change(rec, created, rewired)
        return created


class Engine:
    """Runs ``pipeline`` over ``gm`` (mutated in place) and records a :class:`Trace`.

    ``example_inputs`` are real tensors in the GraphModule's placeholder order; the
    original graph's outputs on them are the reference for verification.

    Use :meth:`run` for the finished Trace, or iterate :meth:`steps` to see each Step
    as it is applied (the app does this for its progress bar). ``graph`` names the graph
    in the Trace and its Steps: ``"pre-grad"`` (the Dynamo graph), or ``"forward"`` /
    ``"backward"`` for an ATen graph of the post-grad passes.
    """

    def __init__(
        self,
        gm: GraphModule,
        example_inputs: tuple,
        pipeline: Pipeline,
        options: RunOptions | None = None,
        model_name: str = "",
        capture_info: dict | None = None,
        graph: str = PRE_GRAD,
    ):
        self.gm = gm
        self.inputs = tuple(example_inputs)
        self.pipeline = pipeline
        self.opts = options or RunOptions()
        for p in pipeline.enabled():
            require_estimate(p)
        with gc_paused():  # O(nodes) new objects
            _layout.eager_strides(gm.graph)  # example values with eager mode's strides (eval dropout aliases)
            self.index = GraphIndex(gm.graph)
            aliasing.use_positions(gm.graph, self.index.pos)  # effects read program order from the index
            aliasing.note_inputs(gm.graph, self.inputs)  # inputs that are views of one buffer alias
            self.trace = Trace(  # its snapshot reads which nodes have effects off the analysis just made
                model=model_name,
                initial_graph=snapshot_graph(gm.graph if self.opts.record else Graph()),
                passes=[p.to_json(p.name not in pipeline.disabled) for p in pipeline.passes],
                capture=capture_info or {},
                graph=graph,
            )
        self.stages: list[tuple[str, GraphModule]] = []
        self._ref = None
        if self.opts.verify != "off":
            self._ref = _verify.reference(gm, self.inputs, self.opts.grads)
        if self.opts.keep_stages:
            self.stages.append(("baseline", copy_graph_module(gm)))
        self._batch: dict[BatchPattern, BatchState] = {}
        self._by_target: dict | None = None
        self._refused: dict[str, set[Node]] = {}  # pattern name -> nodes where its step was rolled back
        self.pass_seconds: dict[str, float] = {}

    # ------------------------------------------------------------------ public
    def run(self) -> Trace:
        """Apply every enabled pass; returns the Trace. Raises PatternError if a pattern raises.

        The cyclic garbage collector stays paused for the whole run (see :meth:`steps`);
        the run's cyclic garbage (about ten objects per graph node, mostly dropped
        FakeTensors and FX nodes) is freed by the first collection after it."""
        with gc_paused():
            for _ in self.steps():
                pass
        return self.trace

    def steps(self) -> Iterator[Step]:
        """Apply the pipeline, yielding each Step right after it is applied.

        Python's cyclic garbage collector is paused while the engine works towards the
        next Step (not while the caller handles one): a full collection rescans every
        live object, and there are more of them, and more collections, the larger the
        graph, which made the run superlinear (full collections took 2.8 s of a 24 s
        recorded run at 85k nodes, 0.45 s of 5.5 s at 21k)."""
        work = self._steps()
        while True:
            with gc_paused():
                step = next(work, None)
            if step is None:
                return
            yield step

    def _steps(self) -> Iterator[Step]:
        for p in self.pipeline.enabled():
            t0 = time.perf_counter()
            yield from self._run_pass(p)
            self.pass_seconds[p.name] = time.perf_counter() - t0
            if self.opts.keep_stages:
                self.stages.append((p.name, copy_graph_module(self.gm)))
        self.gm.recompile()
        if self.opts.verify == "end" or (self.opts.verify == "step" and not self.trace.steps):
            self.trace.final_verify = self._check()
        elif self.opts.verify == "step":
            self.trace.final_verify = self.trace.steps[-1].verify

    # ------------------------------------------------------------------ passes
    def _run_pass(self, p: Pass) -> Iterator[Step]:
        """Sweep every pattern of ``p`` until a sweep changes nothing (at most
        ``p.max_iterations`` sweeps each).

        Finds the same groups, in the same order, as re-sweeping the whole graph each
        time (tests/test_search.py checks this against a plain transcription of
        upstream), but a BatchPattern sweep only searches from *dirty* roots: at the
        start of the pass, the roots that can see a node whose group key is shared by at
        least ``min_fuse_set_size`` nodes of the graph (no other root can find a group,
        and a pass with no such key sweeps nothing); a root whose search found no bucket
        that large is clean until a step changes a node within its search range
        (:func:`optimus_lens.core.search.downstream`). Keys are cached for the pass and recomputed
        for nodes a step created or rewired and for nodes whose users changed (a key may
        read a node, its inputs and its users). A RewritePattern sweep visits only its
        anchor nodes, from a target index kept up to date by each step, in the order of a
        full reverse walk."""
        self._begin_pass(p)
        try:
            for _ in range(p.max_iterations):
                changed = False
                for pattern in p.patterns:
                    if isinstance(pattern, BatchPattern):
                        gen = self._sweep_batch(p, pattern)
                    else:
                        gen = self._sweep_rewrite(p, cast(RewritePattern, pattern))
                    for step in gen:
                        changed = True  # a refused step changes keys too: sweep again
                        yield step
                if not changed:
                    return
        finally:
            self._batch = {}

    def _begin_pass(self, p: Pass) -> None:
        """Key every node that has a user (only those are ever searched; with
        ``pattern.anchors`` only those with an anchor target), and mark dirty the roots
        that can see a node of a key class of at least ``min_fuse_set_size``."""
        self._batch = {}
        everyone: list[Node] | None = None
        for pattern in p.patterns:
            if not isinstance(pattern, BatchPattern):
                continue
            opts = p.options or pattern.options
            cache = KeyCache(self._keyer(pattern))
            if pattern.anchors:  # only these nodes can have a key; the others are keyed lazily (None)
                nodes = [n for n in self._anchored(pattern.anchors) if n.users]
            else:
                if everyone is None:
                    everyone = [n for n in self.gm.graph.nodes if n.users]
                nodes = everyone
            if opts.search != "upstream":
                nodes = self._hinted(pattern, nodes, opts, p)
            with graph_unchanged():
                for n in nodes:
                    self._key(pattern, cache, n, p)
            dirty: set[Node] = set()
            if opts.search == "upstream":  # the global search keeps no roots
                big = {k for k, c in cache.counts().items() if c >= opts.min_fuse_set_size}
                sources = [n for n, k in cache.items() if k is not None and k in big]
                reach = downstream(sources, cache.__getitem__, opts.max_fuse_search_depth) if sources else ()
                dirty = {n for n in reach if is_search_root(n)}
            self._batch[pattern] = BatchState(
                cache, dirty, CandidateSearch(cache.__getitem__, opts.max_fuse_search_depth), opts
            )

    def _hinted(self, pattern: BatchPattern, nodes: list[Node], opts: SearchOptions, p: Pass) -> list[Node]:
        """``nodes`` less those whose :meth:`~optimus_lens.core.pattern.BatchPattern.group_hint`
        fewer than ``min_fuse_set_size`` live nodes of ``nodes`` share: no key class of the
        global search can hold them (members share their hint), so they need no key."""
        if not pattern.hints():
            return nodes
        hints: list = []
        counts: dict = {}
        for n in nodes:
            try:
                h = None if n._erased else pattern.group_hint(n)
            except Exception as e:  # noqa: BLE001
                raise PatternError(p.name, pattern.name, [n.name], e) from e
            hints.append(h)
            if h is not None:
                counts[h] = counts.get(h, 0) + 1
        least = opts.min_fuse_set_size
        return [n for n, h in zip(nodes, hints) if h is None or counts[h] >= least]

    def _keyer(self, pattern: BatchPattern) -> Callable[[Node], object]:
        """``pattern.key``, except for nodes where a step of the pattern was rolled back."""
        refused = self._refused.setdefault(pattern.name, set())
        key = pattern.key

        def keyed(n: Node):
            return DISABLED if n in refused else key(n)

        return keyed

    def _key(self, pattern: BatchPattern, cache: KeyCache, n: Node, p: Pass):
        try:
            return cache[n]
        except Exception as e:  # noqa: BLE001
            raise PatternError(p.name, pattern.name, [n.name], e) from e

    def _sweep_global(self, p: Pass, pattern: BatchPattern) -> Iterator[Step]:
        """One sweep of the global search (:func:`optimus_lens.core.search.global_groups`): every
        live node with users and a group key is a candidate; key classes of at least
        ``min_fuse_set_size`` nodes, in graph order of their first member
        (:func:`optimus_lens.core.search.key_classes`), are split into independent groups,
        each fused as one step."""
        state = self._batch[pattern]
        cache, opts = state.cache, state.opts
        nodes = self._anchored(pattern.anchors) if pattern.anchors else list(self.gm.graph.nodes)
        t_match = time.perf_counter()
        with graph_unchanged():
            nodes = self._hinted(pattern, nodes, opts, p)
            todo = key_classes(nodes, lambda n: self._key(pattern, cache, n, p), self.index, opts)
        skipped: set[Node] = set()  # members of groups the profit estimate refused
        for k, members in todo:

            def still(n: Node, k=k) -> bool:
                if n._erased or n in skipped or not n.users:
                    return False
                now = self._key(pattern, cache, n, p)
                return now is k or now == k  # one object while its cached key stands (KeyCache)

            for subset in global_groups(members, self.index, opts, still):
                if opts.profitable_only and not cast(Estimator, p.estimate)(self.gm, pattern.fuse, subset).profitable:
                    skipped.update(subset)
                    continue
                match_s = time.perf_counter() - t_match
                yield self._apply(p, pattern, subset, lambda rw, s=subset: pattern.fuse(rw, s), match_s)  # type: ignore[misc]
                t_match = time.perf_counter()

    def _sweep_batch(self, p: Pass, pattern: BatchPattern) -> Iterator[Step]:
        state = self._batch[pattern]
        dirty, search, opts = state.dirty, state.search, state.opts
        if opts.search != "upstream":
            yield from self._sweep_global(p, pattern)
            return
        if not dirty:
            return
        node = self.gm.graph.output_node()
        t_match = time.perf_counter()
        while node.op != "root":
            if node in dirty:
                try:
                    buckets = search(node)
                except Exception as e:  # noqa: BLE001
                    raise PatternError(p.name, pattern.name, [node.name], e) from e
                grouped = False
                for nodes in buckets.values():
                    if len(nodes) < opts.min_fuse_set_size:
                        continue
                    grouped = True
                    for subset in independent_subsets(nodes, self.index, opts):
                        match_s = time.perf_counter() - t_match
                        yield self._apply(
                            p,
                            pattern,
                            subset,
                            lambda rw, s=subset: pattern.fuse(rw, s),  # type: ignore[misc]
                            match_s,
                        )
                        t_match = time.perf_counter()
                if not grouped:
                    dirty.discard(node)
            node = node.prev

    def _targets(self) -> dict:
        """target -> live call_function / call_method nodes with that target, kept up to date by :meth:`_apply`."""
        if self._by_target is None:
            self._by_target = {}
            for n in self.gm.graph.nodes:
                if n.op in ("call_function", "call_method"):
                    self._by_target.setdefault(n.target, {})[n] = None
        return self._by_target

    def _anchored(self, anchors: frozenset) -> list[Node]:
        """Live nodes whose target (or method name) is one of ``anchors``, from :meth:`_targets`."""
        by_target = self._targets()
        return [n for t in anchors for n in by_target.get(t, ())]

    def _sweep_rewrite(self, p: Pass, pattern: RewritePattern) -> Iterator[Step]:
        if pattern.anchors:
            nodes = self._anchored(pattern.anchors)
            nodes.sort(key=self.index.pos.__getitem__, reverse=True)
        else:
            nodes = list(self.gm.graph.nodes)
            nodes.reverse()
        t_match = time.perf_counter()
        refused = self._refused.get(pattern.name, ())
        for node in nodes:
            if node._erased or node in refused:
                continue
            try:
                m = pattern.match(node)
            except Exception as e:  # noqa: BLE001
                raise PatternError(p.name, pattern.name, [node.name], e) from e
            if m is None or isinstance(m, Miss):
                continue
            match_s = time.perf_counter() - t_match
            step = self._apply(p, pattern, m.nodes, lambda rw, m=m: pattern.rewrite(rw, m), match_s)  # type: ignore[misc]
            if step.error is not None:  # rolled back: not this pattern at this anchor again
                self._refused.setdefault(pattern.name, set()).add(node)
            yield step
            t_match = time.perf_counter()

    # ------------------------------------------------------------------ one step
    def _apply(
        self, p: Pass, pattern: Pattern, site: list[Node], do: Callable[[Rewriter], None], match_s: float
    ) -> Step:
        """Run one ``fuse``/``rewrite`` through a :class:`Rewriter` whose listeners record
        the step and check layouts; validate the result; on any error roll the step back
        (:meth:`_failed`). Then update the indexes and verify."""
        site_names = [n.name for n in site]
        t0 = time.perf_counter()
        rec = Recording()  # the step's record, which the indexes read when it commits
        check, safe = LayoutCheck(), StepCheck(self.index.pos)
        indexes = IndexListener(self, rec)
        rw = Rewriter(self.gm.graph, [indexes, check, safe], level=self.index.level)
        try:
            with rw.guarding(self.gm):
                do(rw)
            rw.validate()
            check.verify(rw.same_strides)
            safe.verify(self.gm.graph, rw.original_args)  # dtype, offsets, outputs, effects
            refresh_views(rw)  # views of what the step replaced: their values in the new storage
        except Exception as e:  # noqa: BLE001 - any failure of the pattern is rolled back and reported
            rw.rollback()
            return self._failed(p, pattern, site, e, match_s, time.perf_counter() - t0)
        try:
            created = indexes.commit()
        except Exception as e:  # noqa: BLE001  (a key of the pass raised on a changed node)
            raise PatternError(p.name, pattern.name, site_names, e) from e
        step = self._step(p, pattern, site_names, match_s, time.perf_counter() - t0, rec, created)
        if self.opts.verify == "step":
            step.verify = self._check()
        return step

    def _step(
        self,
        p: Pass,
        pattern: Pattern,
        sites: list[str],
        match_s: float,
        rewrite_s: float,
        rec: Recording | None = None,
        created: list[Node] | None = None,
        error: dict[str, Any] | None = None,
    ) -> Step:
        """Append the Step of one rewrite to the trace and return it: an applied one with
        ``rec``, its recorded changes, and ``created``, its created nodes still alive; a
        rolled-back one with ``error`` (no changes)."""
        if rec is None:
            erased: list[str] = []
            replaced: dict[str, str] = {}
            delta = Delta([], []) if self.opts.record else None
        else:
            created_ids = {id(n) for n in rec.created}
            erased = [n.name for n in rec.erased if id(n) not in created_ids]
            replaced = dict(rec.replaced)
            delta = rec.delta() if self.opts.record else None
        step = Step(
            index=len(self.trace.steps) + 1,
            pass_name=p.name,
            pattern=pattern.name,
            sites=sites,
            created=[n.name for n in created or ()],
            erased=erased,
            replaced=replaced,
            delta=delta,
            match_s=match_s,
            rewrite_s=rewrite_s,
            nodes_after=len(self.gm.graph.nodes),
            error=error,
            graph=self.trace.graph,
        )
        self.trace.steps.append(step)
        return step

    def _failed(
        self, p: Pass, pattern: Pattern, site: list[Node], e: BaseException, match_s: float, rewrite_s: float
    ) -> Step:
        """Record a rolled-back step (``Step.error``); a BatchPattern is disabled for every
        member of ``site`` (a RewritePattern's sweep disables it at the anchor); with
        ``on_error="stop"`` raise :class:`PatternError` after recording it."""
        kinds = (
            (_layout.LayoutError, "layout"),
            (UnsafeRewrite, "unsafe"),
            (InvalidGraph, "invalid"),
            (DirectMutation, "direct-mutation"),
            (SymbolicSize, "symbolic-size"),
        )
        kind = next((k for t, k in kinds if isinstance(e, t)), "raised")
        site_names = [n.name for n in site]
        error = {
            "kind": kind,
            "type": type(e).__name__,
            "message": str(e),
            "source": raised_in(type(pattern), e) or pattern.source or source_of(type(pattern)),
        }
        step = self._step(p, pattern, site_names, match_s, rewrite_s, error=error)
        if isinstance(pattern, BatchPattern):
            self._refused.setdefault(pattern.name, set()).update(site)
            state = self._batch.get(pattern)
            if state is not None:  # the site's keys changed (refused): the roots that see it search again
                state.cache.forget(site)
                reach = set(site) | downstream(site, state.cache.__getitem__, state.opts.max_fuse_search_depth)
                state.search.forget(reach)
                state.dirty.update(n for n in reach if is_search_root(n) and state.opts.search == "upstream")
        if self.opts.on_error == "stop":
            raise PatternError(p.name, pattern.name, site_names, e) from e
        return step

    def _note_change(self, rec: Recording, created: list[Node], rewired: list[Node]) -> None:
        """Keep the target index, the pass's key caches and dirty roots in step with one
        step (``created``: its live created nodes; ``rewired``: its live rewired nodes, each
        once): O(nodes the step touched and their search neighbourhood)."""
        if self._by_target is not None:
            for n in rec.erased:
                bucket = self._by_target.get(n.target)
                if bucket is not None:
                    bucket.pop(n, None)
            for n in created:
                if n.op in ("call_function", "call_method"):
                    self._by_target.setdefault(n.target, {})[n] = None
        if not self._batch:
            return
        changed = dict.fromkeys(created)
        changed.update(dict.fromkeys(rewired))
        for n in (*created, *rewired):
            changed.update(n._input_nodes)  # FX's dict of the node's inputs (values None)
        changed.update(dict.fromkeys(n for n in (*rec.erased_inputs, *rec.rewired_from) if not n._erased))
        for state in self._batch.values():
            state.cache.forget(changed)
            state.cache.forget(rec.erased)
            state.search.forget(changed)
            state.search.forget(rec.erased)
            state.dirty.difference_update(rec.erased)
            if state.opts.search != "upstream":
                continue
            # created and rewired nodes are users of changed nodes, so they are in reach too
            reach = downstream(changed, state.cache.__getitem__, state.opts.max_fuse_search_depth)
            state.search.forget(reach)
            state.dirty.update(n for n in reach if is_search_root(n))

    def _check(self) -> VerifyResult:
        if self._ref is None:
            return VerifyResult(None, checked="off")
        return _verify.check(self.gm, self.inputs, self._ref, self.opts.grads)


DISABLED = Miss("a step of this pattern was rolled back here")


def require_estimate(p: Pass) -> None:
    """Raise ValueError when a BatchPattern of ``p`` fuses only profitable groups (its
    options, or the pass's, set ``profitable_only`` with the global search) and ``p``
    carries no :attr:`~optimus_lens.core.pipeline.Pass.estimate` to judge them."""
    if p.estimate is not None:
        return
    for pattern in p.patterns:
        if isinstance(pattern, BatchPattern):
            opts = p.options or pattern.options
            if opts.profitable_only and opts.search != "upstream":
                raise ValueError(
                    f"pass {p.name!r}: {pattern.name} fuses only profitable groups (profitable_only) but the pass "
                    "has no estimate (Pass.estimate, e.g. optimus_lens.passes.profit.group_estimate)"
                )
