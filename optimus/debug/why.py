"""Why a pattern does or does not apply at a node, answered from the run itself.

``optimus why`` and the app ask one question: for a node of the graph before step N
(or of the captured graph), what does each pattern of the pipeline do with it? The
answer comes from a dry run of the same engine, pipeline and search options on a copy
of the graph, never from a separate rule of thumb:

* the run fuses or rewrites the node at step M >= N: "fuses at step M with ...";
* another step erases it first: "erased at step M by ...";
* otherwise, the reason read on the graph where the pattern's pass stopped (its fixed
  point): the condition that failed (the pattern's :class:`~optimus_lens.core.miss.Miss`), or
  for a batch fusion, how many nodes share its group key, how many of them are mutually
  independent, and which members it depends on or feeds.

:class:`DryRun` runs the engine once and answers for any node (``explain``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch.fx import GraphModule, Node

from optimus_lens.core.engine import Engine, RunOptions, copy_graph_module
from optimus_lens.core.index import GraphIndex
from optimus_lens.core.memo import graph_unchanged
from optimus_lens.core.miss import Miss
from optimus_lens.core.pattern import BatchPattern, RewritePattern, why_not
from optimus_lens.core.pipeline import Pass, Pipeline
from optimus_lens.core.record import target_name
from optimus_lens.core.search import fusion_candidates, is_search_root, max_antichain
from optimus_lens.core.trace import Step

LIST = 6  # node names listed in a reason before "..."


class WhyError(ValueError):
    """Bad input to ``why``: no such node at that step, step out of range, unknown pattern."""


@dataclass
class Verdict:
    """One pattern's answer for one node: ``step`` is the step that applies it there (None
    if none does); ``text`` says what happens or the reason it does not; ``with_nodes``
    the other sites of that step (the group it joins); ``partial`` for a near miss, the
    nodes of its best partial match (a match-language pattern's nodes matched before the
    failed condition, or the other nodes sharing a batch fusion's group key)."""

    pattern: str
    pass_name: str
    applies: bool
    text: str
    step: int | None = None
    with_nodes: list[str] = field(default_factory=list)
    partial: list[str] = field(default_factory=list)


@dataclass
class WhyReport:
    """Every asked pattern's verdict for node ``node`` of the graph before step ``step``
    (``steps + 1``: the final graph)."""

    node: str
    op: str
    step: int
    steps: int
    verdicts: list[Verdict]

    def to_json(self) -> dict:
        """``{"node", "op", "step", "steps", "verdicts": [{"pattern", "pass", "applies", "text",
        "step", "with_nodes", "partial"}]}`` (``optimus why --json``)."""
        return {
            "node": self.node,
            "op": self.op,
            "step": self.step,
            "steps": self.steps,
            "verdicts": [
                {
                    "pattern": v.pattern,
                    "pass": v.pass_name,
                    "applies": v.applies,
                    "text": v.text,
                    "step": v.step,
                    "with_nodes": list(v.with_nodes),
                    "partial": list(v.partial),
                }
                for v in self.verdicts
            ],
        }

    @classmethod
    def from_json(cls, data: dict) -> WhyReport:
        """The inverse of :meth:`to_json`. Raises KeyError or TypeError for another shape."""
        verdicts = [
            Verdict(
                v["pattern"],
                v["pass"],
                bool(v["applies"]),
                v["text"],
                v.get("step"),
                list(v.get("with_nodes", [])),
                list(v.get("partial", [])),
            )
            for v in data["verdicts"]
        ]
        return cls(data["node"], data["op"], int(data["step"]), int(data["steps"]), verdicts)

    def text(self) -> str:
        where = (
            "the captured graph"
            if self.step == 1
            else ("the final graph" if self.step > self.steps else f"the graph before step {self.step}")
        )
        width = max([7, *(len(v.pattern) for v in self.verdicts)])
        lines = [
            f"{self.node} = {self.op}  (in {where}; the run has {self.steps} step{'' if self.steps == 1 else 's'})"
        ]
        i = 0
        while i < len(self.verdicts):
            v = self.verdicts[i]
            j = i
            while j + 1 < len(self.verdicts) and self.verdicts[j + 1].text == v.text and not v.applies:
                j += 1
            if j - i >= 2:  # one line for a run of patterns with the same answer
                label = f"{j - i + 1} patterns {v.pattern}..{self.verdicts[j].pattern}"
                lines.append(f"  {label}\n  {'':{width}s} no : {v.text}")
            else:
                for w in self.verdicts[i : j + 1]:
                    lines.append(f"  {w.pattern:{width}s} {'yes' if w.applies else 'no '}: {w.text}")
            i = j + 1
        return "\n".join(lines)


def _near(text: str, nodes) -> Miss:
    """A reason carrying the nodes of a near miss (``partial``) for drawing."""
    m = Miss(text)
    m.partial = list(nodes)
    return m


def _partial(reason) -> list[str]:
    """The names of a reason's best partial match (none for a plain string)."""
    return [n if isinstance(n, str) else n.name for n in getattr(reason, "partial", None) or []]


def _names(nodes, limit: int = LIST) -> str:
    names = [n if isinstance(n, str) else n.name for n in nodes]
    return ", ".join(names[:limit]) + (f", ... ({len(names)} in all)" if len(names) > limit else "")


class DryRun:
    """The engine run over a copy of ``gm`` with ``pipeline`` (verification off), kept so
    any node can be explained: the steps, the graph before step ``step`` (1-based;
    ``len(steps) + 1`` for the final graph; None: the captured graph) and the graph at
    the end of every enabled pass. ``gm`` is not changed.

    Raises WhyError when ``step`` is outside 1..steps+1; engine errors (PatternError)
    propagate."""

    def __init__(self, gm: GraphModule, pipeline: Pipeline, step: int | None = None):
        self.pipeline = pipeline
        eng = Engine(copy_graph_module(gm), (), pipeline, RunOptions(verify="off", record=False, keep_stages=True))
        self.before: GraphModule | None = copy_graph_module(gm) if step in (None, 1) else None
        for k, _ in enumerate(eng.steps(), 1):
            if step is not None and k == step - 1:
                self.before = copy_graph_module(eng.gm)
        self.steps: list[Step] = eng.trace.steps
        if step is None:
            step = 1
        if not 1 <= step <= len(self.steps) + 1:
            raise WhyError(
                f"step {step} is outside 1..{len(self.steps) + 1} (the run has {len(self.steps)} steps; "
                f"{len(self.steps) + 1} is the final graph)"
            )
        if self.before is None:
            self.before = copy_graph_module(eng.gm)
        self.step = step
        self.stages = dict(eng.stages[1:])  # pass name -> graph after the pass
        self.order = [p.name for p in pipeline.enabled()]
        self._classes: dict = {}
        self._indexes: dict = {}
        self._anti: dict = {}

    # ------------------------------------------------------------------ public
    def node(self, name: str) -> Node:
        """The node ``name`` of the graph before the step. Raises WhyError naming where the
        node was created or erased when it is not there."""
        for n in self.before.graph.nodes:
            if n.name == name:
                return n
        where = self._where(name)
        names = [n.name for n in self.before.graph.nodes if n.op != "placeholder"]
        graph = (
            "the captured graph"
            if self.step == 1
            else ("the final graph" if self.step > len(self.steps) else f"the graph before step {self.step}")
        )
        raise WhyError(f"no node {name!r} in {graph}{where}; nodes: {_names(names, 40)}")

    def explain(self, name: str, patterns: list[str] | None = None) -> WhyReport:
        """Every pattern's verdict (those named in ``patterns``, else every pattern of an
        enabled pass) for node ``name``. Raises WhyError for an unknown node or a pattern
        not in the pipeline."""
        node = self.node(name)
        pairs = [(p, q) for p in self.pipeline.enabled() for q in p.patterns]
        if patterns is not None:
            known = {q.name for _, q in pairs}
            unknown = [x for x in patterns if x not in known]
            if unknown:
                raise WhyError(
                    f"pattern(s) {', '.join(unknown)} not in the enabled passes; known: {', '.join(sorted(known))}"
                )
            pairs = [(p, q) for p, q in pairs if q.name in patterns]
        verdicts = [self._verdict(node, p, q) for p, q in pairs]
        return WhyReport(name, f"{node.op} {target_name(node)}", self.step, len(self.steps), verdicts)

    # ------------------------------------------------------------------ verdicts
    def _verdict(self, node: Node, p: Pass, pattern) -> Verdict:
        name = node.name
        later = self.steps[self.step - 1 :]
        for s in later:
            if s.pattern == pattern.name and name in s.sites:
                others = [x for x in s.sites if x != name]
                if isinstance(pattern, BatchPattern):
                    text = f"fuses at step {s.index} with {_names(others)} ({len(s.sites)} members)"
                else:
                    text = f"rewrites at step {s.index}" + (f" with {_names(others)}" if others else "")
                return Verdict(pattern.name, p.name, True, text, s.index, others)
        here = self._current_pass()
        mine = self.order.index(p.name)
        if mine < here and self.step > 1:  # its pass ran before the step asked about: read the graph as it is
            reason = self._reason(node, p, pattern, self.before, ended=False)
            return Verdict(
                pattern.name,
                p.name,
                False,
                f"its pass {p.name} ran before step {self.step}; on this graph: {reason}",
                partial=_partial(reason),
            )
        for s in later:
            if self.order.index(s.pass_name) > mine:
                break
            if name in s.erased:
                return Verdict(
                    pattern.name,
                    p.name,
                    False,
                    f"step {s.index} ({s.pattern}) erases it before this pattern applies to it",
                )
        stage = self.stages[p.name]
        live = next((n for n in stage.graph.nodes if n.name == name), None)
        if live is None:
            s = next((s for s in later if name in s.erased or name in s.sites), None)
            by = f" at step {s.index} ({s.pattern})" if s else ""
            return Verdict(pattern.name, p.name, False, f"erased{by} before pass {p.name} ended")
        reason = self._reason(live, p, pattern, stage)
        return Verdict(pattern.name, p.name, False, reason, partial=_partial(reason))

    def _current_pass(self) -> int:
        if self.step <= len(self.steps):
            return self.order.index(self.steps[self.step - 1].pass_name)
        return len(self.order)

    def _reason(self, node: Node, p: Pass, pattern, gm: GraphModule, ended: bool = True) -> str:
        """Why ``pattern`` does not apply at ``node`` of ``gm``: the graph where its pass
        ended (``ended``) or a graph after the pass."""
        try:
            if isinstance(pattern, RewritePattern):
                r = why_not(pattern, node)
                if r is None:
                    return (
                        (f"matches here, but the pass stopped at its limit of {p.max_iterations} sweeps")
                        if ended
                        else "it would match here"
                    )
                return r
            return self._batch_reason(node, p, pattern, gm)
        except Exception as e:  # noqa: BLE001 - a raising pattern is itself the answer
            return f"raised {type(e).__name__}: {e}"

    def _batch_reason(self, node: Node, p: Pass, pattern: BatchPattern, gm: GraphModule) -> str:
        k = pattern.key(node)
        if k is None:
            return "no match"
        if isinstance(k, Miss):
            return str(k)
        if not node.users:
            return "its output is unused (only nodes with users are candidates)"
        opts = p.options or pattern.options
        need = opts.min_fuse_set_size
        members = self._class(gm, pattern).get(k, [])
        others = [m for m in members if m is not node]
        if len(members) < need:
            return _near(
                f"{len(members)} node(s) share its group key ({_names(others) or 'no other'}); a group needs {need}",
                others,
            )
        anti = self._antichain(gm, pattern, k, members)
        related = self._comparable(node, members)
        if len(anti) < need:
            return _near(
                f"{len(members)} nodes share its group key but at most {len(anti)} of them are mutually "
                f"independent (a group needs {need}); it depends on or feeds {_names(related) or 'none'}",
                others,
            )
        if opts.search == "upstream":
            return _near(self._upstream_reason(node, members, opts, pattern, gm), others)
        if opts.profitable_only and node in anti and p.estimate is not None:
            est = p.estimate(gm, pattern.fuse, list(anti))
            if not est.profitable:
                return _near(
                    f"{len(anti)} independent nodes share its group key ({_names([m for m in anti if m is not node])}), "
                    f"but the profit estimate expects fusing them to cost time ({est.text()}); this pass fuses "
                    "only groups the estimate expects to gain (profitable_only)",
                    others,
                )
        return _near(
            f"{len(members)} nodes share its group key and {len(anti)} are independent, but not with it: "
            f"it depends on or feeds {_names(related)}",
            others,
        )

    def _upstream_reason(self, node: Node, members: list[Node], opts, pattern: BatchPattern, gm: GraphModule) -> str:
        """Upstream's bounded search: the largest bucket holding ``node`` that any root
        finds within ``max_fuse_search_depth`` hops."""
        key = pattern.key(node)

        def k(n):
            r = pattern.key(n)
            return None if isinstance(r, Miss) else r

        best, root = 0, None
        with graph_unchanged():
            for r in gm.graph.nodes:
                if not is_search_root(r):
                    continue
                got = fusion_candidates(r, k, opts.max_fuse_search_depth).get(key, [])
                if node in got and len(got) > best:
                    best, root = len(got), r
        where = (
            f"at most {best} of them within {opts.max_fuse_search_depth} producer hops of one root ({root.name})"
            if root is not None
            else f"no search root reaches it within {opts.max_fuse_search_depth} hops (a match on the way stops the walk)"
        )
        return (
            f"{len(members)} nodes share its group key, but upstream's bounded search sees {where}; "
            f"a group needs {opts.min_fuse_set_size} independent ones (--search global finds groups anywhere)"
        )

    # ------------------------------------------------------------------ helpers
    def _class(self, gm: GraphModule, pattern: BatchPattern) -> dict:
        got = self._classes.get((id(gm), pattern.name))
        if got is None:
            got = {}
            with graph_unchanged():
                for n in gm.graph.nodes:
                    if not n.users:
                        continue
                    try:
                        k = pattern.key(n)
                    except Exception:  # noqa: BLE001 - a node the key cannot read is in no class
                        continue
                    if k is not None and not isinstance(k, Miss):
                        got.setdefault(k, []).append(n)
            self._classes[(id(gm), pattern.name)] = got
        return got

    def _antichain(self, gm: GraphModule, pattern: BatchPattern, k, members: list[Node]) -> list[Node]:
        got = self._anti.get((id(gm), pattern.name, k))
        if got is None:
            got = self._anti[(id(gm), pattern.name, k)] = max_antichain(members, self._index(gm))
        return got

    def _index(self, gm: GraphModule) -> GraphIndex:
        got = self._indexes.get(id(gm))
        if got is None:
            got = self._indexes[id(gm)] = GraphIndex(gm.graph)
        return got

    @staticmethod
    def _comparable(node: Node, members: list[Node]) -> list[Node]:
        """Members that are ancestors or descendants of ``node``."""
        member = set(members)

        def walk(start, nxt):
            seen, stack, out = set(), [start], []
            while stack:
                for m in nxt(stack.pop()):
                    if m not in seen:
                        seen.add(m)
                        stack.append(m)
                        if m in member:
                            out.append(m)
            return out

        return walk(node, lambda n: n.all_input_nodes) + walk(node, lambda n: n.users)

    def _where(self, name: str) -> str:
        for s in self.steps:
            if name in s.created:
                return f" (step {s.index}, {s.pattern}, creates it: ask with --step {s.index + 1} or later)"
            if name in s.erased or name in s.sites:
                if s.index < self.step:
                    return f" (step {s.index}, {s.pattern}, erased it: ask with --step {s.index} or earlier)"
        return ""


# --------------------------------------------------------------------------- a trace's graphs


def _same_steps(a: list[Step], b: list[Step]) -> bool:
    return [(s.pattern, s.sites) for s in a] == [(s.pattern, s.sites) for s in b]


def trace_dry_run(trace, step: int, spec: str | None = None, pipeline: Pipeline | None = None) -> tuple[DryRun, str]:
    """A :class:`DryRun` that answers for the graph before step ``step`` of ``trace``
    (1-based; ``len(trace.steps) + 1``: its final graph), and one line saying what was run:

    * a trace of our pipeline whose model ``spec`` is at hand: the model captured again
      (the trace's capture method and graph), then the engine with ``pipeline`` (default:
      :func:`optimus_lens.passes.default_pipeline`) limited to the trace's enabled passes; the
      dry run's steps are the trace's own, so "fuses at step M" names a step of the trace;
    * otherwise (PyTorch Inductor's passes observed, or a trace file of a model not at
      hand): the graph before that step rebuilt from the trace (:mod:`optimus_lens.debug.rebuild`,
      random inputs of the recorded shapes, strides and dtypes) and our whole pipeline run
      from there — "what Optimus Lens's patterns do with this graph"; step numbers in the
      answers are then the dry run's own.

    Raises WhyError (step outside 1..steps+1, a graph that cannot be rebuilt or run),
    optimus_lens.frontend.run.ModelSpecError and optimus_lens.frontend.capture.CaptureError (the model's spec)."""
    from optimus_lens.core.record import snapshot_graph
    from optimus_lens.passes import default_pipeline

    n = len(trace.steps)
    if not 1 <= step <= n + 1:
        raise WhyError(f"step {step} is outside 1..{n + 1} (the trace has {n} steps; {n + 1} is the final graph)")
    pipeline = pipeline or default_pipeline()
    where = "the final graph" if step > n else f"the graph before step {step}"
    upstream = bool((trace.capture or {}).get("upstream"))
    if spec is not None and not upstream:
        from optimus_lens.frontend.capture import capture
        from optimus_lens.frontend.run import load_model

        model, inputs, _ = load_model(spec)
        cap = trace.capture or {}
        gm = capture(
            model,
            inputs,
            method=cap.get("method", "dynamo"),
            graph_index=cap.get("graph_index"),
            grad=cap.get("grad", False),
        ).gm
        if snapshot_graph(gm.graph).signature() == trace.initial_graph.signature():
            names = [p["name"] for p in trace.passes if p.get("enabled", True)] or pipeline.names()
            dry = DryRun(gm, pipeline.only([x for x in names if x in pipeline.names()]), step)
            if _same_steps(dry.steps, trace.steps):
                return dry, f"a dry run of the trace's passes on {spec}, read at {where}"
    from optimus_lens.debug.rebuild import RebuildError, graph_module, propagate, random_inputs

    snap = trace.graph_at(step - 1)
    try:
        gm = graph_module(snap)
        propagate(gm, random_inputs(snap))
    except Exception as e:  # noqa: BLE001 - a graph that cannot be rebuilt or propagated is the answer
        kind = "cannot be rebuilt" if isinstance(e, RebuildError) else "cannot be run on random inputs"
        raise WhyError(f"{where} of the trace {kind}: {type(e).__name__}: {e}") from e
    return (
        DryRun(gm, pipeline, None),
        f"Optimus Lens's pipeline run on {where}, rebuilt from the trace (step numbers are that run's own)",
    )
