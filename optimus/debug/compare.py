"""Our passes next to PyTorch Inductor's own on the same captured graph.

:func:`compare_model` captures a model once, records upstream's pre-grad passes on a copy
(:func:`optimus_lens.inductor.observe.observe`, each step verified) and runs our pipeline on the capture
(:func:`optimus_lens.frontend.run.optimize`, each step verified). Both start from the same FX graph,
so original node names identify the same nodes in both runs, and a step is identified
by (pass, sites): a fused group is the set of nodes it fused.

A :class:`Comparison` holds the node counts, the fused groups of every pass side by
side, the steps only one run made, and the failing steps of each run; a failing
upstream step is an upstream defect (its rewrite changed what the graph computes).

:func:`compare_runs` compares any two runs of one model, each a Trace (``optimus compare
A.json B.json``): two torch versions, two configurations, two logs, where node names
need not agree, so nodes are paired by structure, name and provenance
(:mod:`optimus_lens.core.graphmatch`) and steps by the captured nodes their sites came
from (:class:`RunComparison`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from optimus_lens.core.graphmatch import NodeMatch, match_nodes, origins
from optimus_lens.core.trace import Step, Trace


@dataclass
class Comparison:
    """Our run (``ours``) and upstream's (``upstream``) on one capture.

    ``groups`` maps a pass name to (our groups, upstream's groups), each group the
    sorted site names of one step of that pass. ``only_ours`` / ``only_upstream`` are the
    steps whose (pass, sites) the other run has no step for. ``upstream_defects`` are
    upstream's steps that fail verification of their own, ``ours_failed`` ours: the first
    step of each of the trace's :meth:`~optimus_lens.core.trace.Trace.failure_runs` (the one
    source the banner, the step list and the CLI read too). ``upstream_inherited`` and
    ``ours_inherited`` map each later failing step to the defect it only inherits (the graph
    is still broken from it)."""

    model: str
    ours: Trace
    upstream: Trace
    options: dict
    groups: dict[str, tuple[list[list[str]], list[list[str]]]] = field(default_factory=dict)
    only_ours: list[Step] = field(default_factory=list)
    only_upstream: list[Step] = field(default_factory=list)
    upstream_defects: list[Step] = field(default_factory=list)
    ours_failed: list[Step] = field(default_factory=list)
    upstream_inherited: dict[int, int] = field(default_factory=dict)
    ours_inherited: dict[int, int] = field(default_factory=dict)

    def inherited_of(self, side: str, step: Step) -> list[int]:
        """The step indices of ``side`` ("upstream" or "ours") that fail only because ``step``
        broke the graph."""
        table = self.upstream_inherited if side == "upstream" else self.ours_inherited
        return [i for i, origin in table.items() if origin == step.index]

    @property
    def nodes(self) -> tuple[int, int, int]:
        """(captured, after ours, after upstream) node counts."""
        return self.ours.nodes_before, self.ours.nodes_after, self.upstream.nodes_after

    @property
    def graph(self) -> str:
        """The graph both runs rewrote: ``"pre-grad"``, ``"forward"`` or ``"backward"``."""
        return self.ours.graph


def _key(s: Step) -> tuple[str, frozenset]:
    return s.pass_name, frozenset(s.sites)


def compare_traces(ours: Trace, upstream: Trace, options: dict | None = None) -> Comparison:
    """Side by side data of two traces of the same captured graph (see :class:`Comparison`)."""
    c = Comparison(ours.model or upstream.model, ours, upstream, dict(options or upstream.capture.get("options", {})))
    names = list(dict.fromkeys([*(s.pass_name for s in ours.steps), *(s.pass_name for s in upstream.steps)]))
    for name in names:
        c.groups[name] = (
            [sorted(s.sites) for s in ours.steps_of_pass(name)],
            [sorted(s.sites) for s in upstream.steps_of_pass(name)],
        )
    up_keys = {_key(s) for s in upstream.steps}
    our_keys = {_key(s) for s in ours.steps}
    c.only_ours = [s for s in ours.steps if _key(s) not in up_keys]
    c.only_upstream = [s for s in upstream.steps if _key(s) not in our_keys]
    c.upstream_defects = [s for s, _ in upstream.failure_runs()]
    c.ours_failed = [s for s, _ in ours.failure_runs()]
    c.upstream_inherited, c.ours_inherited = upstream.inherited_failures(), ours.inherited_failures()
    return c


def compare_model(
    spec: str, options: dict | None = None, capture_method: str = "dynamo", graph_index: int | None = None
) -> Comparison:
    """Capture ``spec`` once; record upstream's passes with ``options`` (default:
    :func:`optimus_lens.inductor.observe.default_options`) and run ours — the default pipeline when
    ``options`` is None, else :func:`optimus_lens.passes.upstream_pipeline` of the same
    options — every step of both verified. Raises as :func:`optimus_lens.inductor.observe.observe` and
    :func:`optimus_lens.frontend.run.optimize`."""
    from optimus_lens.frontend.capture import capture
    from optimus_lens.frontend.run import load_model, optimize
    from optimus_lens.inductor.observe import observe
    from optimus_lens.passes import upstream_pipeline

    model, inputs, name = load_model(spec)
    captured = capture(model, inputs, method=capture_method, graph_index=graph_index)
    up = observe(name, options=options, verify=True, captured=captured)  # on a copy: captured.gm stays
    pipe = upstream_pipeline(options) if options is not None else None
    ours = optimize(name, verify="step", pipeline=pipe, captured=captured)
    return compare_traces(ours.trace, up.trace, up.options)


def group_rows(c: Comparison) -> list[dict]:
    """One row per pass: its name, our steps, upstream's steps, whether both fused the
    same groups of the same nodes, and each side's groups as text (sizes and first
    members): the side-by-side table of the CLI and the app."""
    rows = []
    for name, (ours, up) in c.groups.items():
        rows.append(
            {
                "pass": name,
                "ours": len(ours),
                "upstream": len(up),
                "same groups": sorted(map(tuple, ours)) == sorted(map(tuple, up)),
                "our groups": _group_text(ours),
                "upstream groups": _group_text(up),
            }
        )
    return rows


def _group_text(groups: list[list[str]], limit: int = 6) -> str:
    if not groups:
        return "-"
    out = [f"{len(g)}: {', '.join(g[:4])}{' ...' if len(g) > 4 else ''}" for g in groups[:limit]]
    return "; ".join(out) + (f"; +{len(groups) - limit} more" if len(groups) > limit else "")


def comparison_text(c: Comparison) -> str:
    """The comparison as plain text: node counts, a table of steps per pass (ours vs
    upstream, same fused groups or not), the steps only one run made, and every failing
    step, upstream's flagged as upstream defects."""
    before, n_ours, n_up = c.nodes
    rows = [
        f"model {c.model}: {before} nodes captured; ours -> {n_ours} in {len(c.ours.steps)} steps, "
        f"upstream -> {n_up} in {len(c.upstream.steps)} steps"
    ]
    w = max([len("pass"), *(len(p) for p in c.groups)])
    rows.append(f"{'pass':{w}s}  {'ours':>4s}  {'upstream':>8s}  same groups")
    rows.append("-" * (w + 30))
    for r in group_rows(c):
        rows.append(f"{r['pass']:{w}s}  {r['ours']:4d}  {r['upstream']:8d}  {'yes' if r['same groups'] else 'no'}")
        if not r["same groups"]:
            rows.append(f"{'':{w}s}    ours:     {r['our groups']}")
            rows.append(f"{'':{w}s}    upstream: {r['upstream groups']}")
    for title, steps in (("only in ours", c.only_ours), ("only in upstream", c.only_upstream)):
        if steps:
            rows.append(f"\n{title}:")
            rows += [
                f"  step {s.index:3d}  {s.pass_name} / {s.pattern}: {len(s.sites)} sites "
                f"({', '.join(s.sites[:4])}{' ...' if len(s.sites) > 4 else ''})"
                for s in steps
            ]
    for side, head, steps in (
        ("upstream", "UPSTREAM DEFECT: upstream step", c.upstream_defects),
        ("ours", "OUR DEFECT: step", c.ours_failed),
    ):
        for s in steps:
            msg = s.verify.message.splitlines()[0] if s.verify and s.verify.message else ""
            rows.append(f"{head} {s.index} ({s.pass_name} / {s.pattern}) fails verification: {msg}")
            later = c.inherited_of(side, s)
            if later:
                rows.append(f"  {inherited_text(later, s.index)}")
    return "\n".join(rows)


def inherited_text(later: list[int], origin: int, sentence: bool = False) -> str:
    """The one thing every view says of the steps ``later`` that fail only because step
    ``origin`` broke the graph: in parentheses (the CLI's line), or as a ``sentence`` (the app's)."""
    many = len(later) > 1
    text = (
        f"step{'s' if many else ''} {', '.join(map(str, later))} fail{'' if many else 's'} the same way only "
        f"because the graph is still broken from step {origin}"
    )
    return f"{text[0].upper()}{text[1:]}." if sentence else f"({text})"


# --------------------------------------------------------------------------- any two runs


@dataclass
class RunComparison:
    """Two runs of one model, each a Trace (two torch versions, two configurations, ours and
    upstream's, two logs): ``start`` pairs the nodes of their captured graphs, ``final``
    those of their final graphs (:func:`optimus_lens.core.graphmatch.match_nodes`: by
    structure, name and provenance). A step is identified by its pass and the captured
    nodes its sites were made from (:func:`optimus_lens.core.graphmatch.origins`, ``b``'s
    named as ``a``'s through ``start``), so a fusion of the same group is the same step in
    both runs whatever the names; ``only_a`` / ``only_b`` are the steps the other run has
    no counterpart of, ``groups`` per pass each run's step count and whether they fused
    the same groups. ``failed_a`` / ``failed_b``: steps that failed verification or were
    rolled back."""

    a_label: str
    b_label: str
    a: Trace
    b: Trace
    start: NodeMatch
    final: NodeMatch
    groups: dict[str, tuple[int, int, bool]] = field(default_factory=dict)
    only_a: list[Step] = field(default_factory=list)
    only_b: list[Step] = field(default_factory=list)
    failed_a: list[Step] = field(default_factory=list)
    failed_b: list[Step] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        """Same steps (by pass and group) and final graphs equal node for node."""
        return self.final.identical and not self.only_a and not self.only_b

    def _side(self, label: str, t: Trace) -> str:
        torch_v = t.capture.get("torch")
        return f"{label} ({t.model}{', torch ' + torch_v if torch_v else ''}: {t.nodes_before}->{t.nodes_after} nodes, {len(t.steps)} steps)"

    def summary(self) -> str:
        """One line for a CI log."""
        c = self.final.counts()
        if self.final.identical:
            graphs = f"final graphs the same node for node ({len(self.final.pairs)} nodes)"
        else:
            graphs = (
                f"final graphs differ: {c['structure']} nodes the same, {c['name'] + c['provenance']} paired by "
                f"name or provenance only, {c['only_a']} only in A, {c['only_b']} only in B"
            )
        steps = f"steps only in A: {_by_pass(self.only_a)}, only in B: {_by_pass(self.only_b)}"
        bad = [
            f"{n} failed steps {', '.join(str(s.index) for s in f)}"
            for n, f in (("A", self.failed_a), ("B", self.failed_b))
            if f
        ]
        return (
            f"{'SAME' if self.identical else 'DIFFERENT'}: A={self._side(self.a_label, self.a)} "
            f"B={self._side(self.b_label, self.b)}; {graphs}; {steps}" + (f"; {'; '.join(bad)}" if bad else "")
        )

    def text(self, limit: int = 12) -> str:
        """The report: both runs, steps per pass side by side, the steps only one run made,
        the nodes of each final graph without a counterpart, and the summary line."""
        rows = [f"A: {self._side(self.a_label, self.a)}", f"B: {self._side(self.b_label, self.b)}"]
        if not self.start.identical:
            c = self.start.counts()
            rows.append(
                f"captured graphs differ: {c['structure']} nodes the same, {c['only_a']} only in A, {c['only_b']} only in B"
            )
        if self.groups:
            w = max([len("pass"), *(len(p) for p in self.groups)])
            rows.append(f"{'pass':{w}s}  {'A':>4s}  {'B':>4s}  same groups")
            rows += [
                f"{p:{w}s}  {na:4d}  {nb:4d}  {'yes' if same else 'no'}" for p, (na, nb, same) in self.groups.items()
            ]
        for title, steps in (("only in A", self.only_a), ("only in B", self.only_b)):
            if steps:
                rows.append(f"steps {title}:")
                rows += [
                    f"  step {s.index:3d}  {s.pass_name} / {s.pattern}: {len(s.sites)} sites "
                    f"({', '.join(s.sites[:4])}{' ...' if len(s.sites) > 4 else ''})"
                    for s in steps[:limit]
                ] + ([f"  ... {len(steps) - limit} more"] if len(steps) > limit else [])
        for title, names, t in (("A", self.final.only_a, self.a), ("B", self.final.only_b, self.b)):
            if names:
                g = t.graph_at(len(t.steps))
                shown = ", ".join(f"{n} ({g.nodes[n].short_target})" for n in names[:limit])
                rows.append(f"final nodes only in {title}: {shown}{' ...' if len(names) > limit else ''}")
        for name, failed in (("A", self.failed_a), ("B", self.failed_b)):
            for s in failed:
                msg = (
                    s.verify.message.splitlines()[0]
                    if s.verify and s.verify.message
                    else (s.error or {}).get("message", "")
                )
                rows.append(f"{name} step {s.index} ({s.pass_name} / {s.pattern}) fails: {msg}")
        rows.append(self.summary())
        return "\n".join(rows)

    def to_json(self) -> dict:
        """The comparison as plain data (``optimus compare --json``; docs/json.md)."""

        def side(label: str, t: Trace, failed: list[Step]) -> dict:
            return {
                "label": label,
                "model": t.model,
                "torch": t.capture.get("torch"),
                "nodes_before": t.nodes_before,
                "nodes_after": t.nodes_after,
                "steps": len(t.steps),
                "failed_steps": [s.index for s in failed],
            }

        def steps(ss: list[Step]) -> list[dict]:
            return [{"index": s.index, "pass": s.pass_name, "pattern": s.pattern, "sites": s.sites} for s in ss]

        return {
            "a": side(self.a_label, self.a, self.failed_a),
            "b": side(self.b_label, self.b, self.failed_b),
            "identical": self.identical,
            "captured": {**self.start.counts(), "identical": self.start.identical},
            "final": {
                **self.final.counts(),
                "identical": self.final.identical,
                "only_a": self.final.only_a,
                "only_b": self.final.only_b,
                "pairs": [{"a": x, "b": y, "how": self.final.how[x]} for x, y in self.final.pairs.items()],
            },
            "passes": [{"pass": p, "a": na, "b": nb, "same_groups": same} for p, (na, nb, same) in self.groups.items()],
            "steps_only_a": steps(self.only_a),
            "steps_only_b": steps(self.only_b),
            "summary": self.summary(),
        }


def _by_pass(steps: list[Step]) -> str:
    if not steps:
        return "none"
    counts: dict[str, int] = {}
    for s in steps:
        counts[s.pass_name] = counts.get(s.pass_name, 0) + 1
    return ", ".join(f"{p} x{n}" for p, n in counts.items())


def compare_runs(a: Trace, b: Trace, a_label: str = "A", b_label: str = "B") -> RunComparison:
    """Compare two runs of one model (see :class:`RunComparison`)."""
    start = match_nodes(a.initial_graph, b.initial_graph)
    back = {y: x for x, y in start.pairs.items()}
    oa = origins(a)
    ob = {n: frozenset(back.get(o, f"B:{o}") for o in s) for n, s in origins(b).items()}

    def key(s: Step, o: dict) -> tuple[str, frozenset]:
        return s.pass_name, frozenset().union(*(o.get(x, frozenset([x])) for x in s.sites)) if s.sites else frozenset()

    ka = [key(s, oa) for s in a.steps if not s.error]
    kb = [key(s, ob) for s in b.steps if not s.error]
    out = RunComparison(
        a_label, b_label, a, b, start, match_nodes(a.graph_at(len(a.steps)), b.graph_at(len(b.steps)), oa, ob)
    )
    sa, sb = set(ka), set(kb)
    out.only_a = [s for s, k in zip((s for s in a.steps if not s.error), ka) if k not in sb]
    out.only_b = [s for s, k in zip((s for s in b.steps if not s.error), kb) if k not in sa]
    for p in dict.fromkeys([k[0] for k in ka] + [k[0] for k in kb]):
        ga = sorted(map(sorted, (k[1] for k in ka if k[0] == p)))
        gb = sorted(map(sorted, (k[1] for k in kb if k[0] == p)))
        out.groups[p] = (len(ga), len(gb), ga == gb)
    out.failed_a, out.failed_b = a.failed_steps(), b.failed_steps()
    return out


def compare_post_grad(
    spec: str,
    options: dict | None = None,
    mode: str = "inference",
    capture_method: str = "dynamo",
    graph_index: int | None = None,
) -> list[Comparison]:
    """Capture ``spec`` and its ATen graphs once (``mode``: inference, the forward graph;
    training, forward and backward); on each graph record upstream's ``post_grad_passes``
    with ``post_grad_fusion_options`` = ``options`` (default:
    :func:`optimus_lens.inductor.observe_post.default_post_grad_options`) on a copy, then run
    ours on the graph itself — :func:`optimus_lens.passes.post_grad.post_grad_pipeline` when
    ``options`` is None, else :func:`optimus_lens.passes.post_grad.upstream_post_grad_pipeline`
    of the same options — every step of both verified. One Comparison per graph, in run
    order; the groups table holds upstream's Optimus passes (the fusions and pattern
    passes its options name), its other post-grad passes are in ``upstream`` only.
    Raises as :func:`optimus_lens.inductor.observe_post.observe_post_grad` does."""
    from optimus_lens.frontend.capture import capture
    from optimus_lens.frontend.postgrad import run_post_grad
    from optimus_lens.frontend.run import load_model
    from optimus_lens.inductor.observe_post import observe_post_grad
    from optimus_lens.passes.post_grad import upstream_post_grad_pipeline

    model, inputs, name = load_model(spec)
    if mode == "training":
        model.train()
    captured = capture(model, inputs, method=capture_method, graph_index=graph_index)
    up = observe_post_grad(name, options=options, mode=mode, captured=captured)  # copies of the ATen graphs
    pipe = upstream_post_grad_pipeline(options) if options is not None else None
    ours = run_post_grad(
        captured.gm, captured.example_inputs, mode, pipe, verify="step", capture=up.aten, model_name=name
    )
    out = []
    for mine, theirs in zip(ours.traces, up.trace.graphs):
        optimus = Trace(
            model=theirs.model,
            initial_graph=theirs.initial_graph,
            steps=[s for s in theirs.steps if s.pass_name in up.options],
            capture=theirs.capture,
            graph=theirs.graph,
        )
        c = compare_traces(mine, optimus, up.options)
        c.upstream = theirs
        c.upstream_defects = theirs.failed_steps()
        out.append(c)
    return out
