"""Our passes next to PyTorch Inductor's own on the same captured graph.

:func:`compare_model` captures a model once, records upstream's pre-grad passes on a copy
(:func:`optimus_lens.inductor.observe.observe`, each step verified) and runs our pipeline on the capture
(:func:`optimus_lens.frontend.run.optimize`, each step verified). Both start from the same FX graph,
so original node names identify the same nodes in both runs, and a step is identified
by (pass, sites): a fused group is the set of nodes it fused.

A :class:`Comparison` holds the node counts, the fused groups of every pass side by
side, the steps only one run made, and the failing steps of each run; a failing
upstream step is an upstream defect (its rewrite changed what the graph computes).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from optimus_lens.core.trace import Step, Trace


@dataclass
class Comparison:
    """Our run (``ours``) and upstream's (``upstream``) on one capture.

    ``groups`` maps a pass name to (our groups, upstream's groups), each group the
    sorted site names of one step of that pass. ``only_ours`` / ``only_upstream`` are the
    steps whose (pass, sites) the other run has no step for. ``upstream_defects`` are
    upstream's steps that failed verification; ``ours_failed`` ours."""

    model: str
    ours: Trace
    upstream: Trace
    options: dict
    groups: dict[str, tuple[list[list[str]], list[list[str]]]] = field(default_factory=dict)
    only_ours: list[Step] = field(default_factory=list)
    only_upstream: list[Step] = field(default_factory=list)
    upstream_defects: list[Step] = field(default_factory=list)
    ours_failed: list[Step] = field(default_factory=list)

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
    c.upstream_defects = upstream.failed_steps()
    c.ours_failed = ours.failed_steps()
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
    for s in c.upstream_defects:
        msg = s.verify.message.splitlines()[0] if s.verify and s.verify.message else ""
        rows.append(f"UPSTREAM DEFECT: upstream step {s.index} ({s.pass_name} / {s.pattern}) fails verification: {msg}")
    for s in c.ours_failed:
        msg = s.verify.message.splitlines()[0] if s.verify and s.verify.message else ""
        rows.append(f"OUR DEFECT: step {s.index} ({s.pass_name} / {s.pattern}) fails verification: {msg}")
    return "\n".join(rows)


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
