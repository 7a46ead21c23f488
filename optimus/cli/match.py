"""``optimus match MODEL --pattern-file F``: where a pattern file's patterns match a model's
graph, and the near misses, changing nothing."""

from __future__ import annotations

import argparse

from optimus_lens.cli.errors import EXIT_OK, PatternRaised, input_errors
from optimus_lens.cli.jsonout import add_json, json_output
from optimus_lens.cli.options import SOURCE, STAGE


def add_parsers(sub) -> None:
    """Add ``match`` to the subcommands ``sub``."""
    m = sub.add_parser(
        "match",
        help="preview where a pattern file's patterns match a model's graph, changing nothing",
        parents=[SOURCE, STAGE],
    )
    m.add_argument("--pattern-file", required=True, help="the pattern file (see docs/pattern-lab.md)")
    m.add_argument("--misses", type=int, default=10, help="near misses to print per pattern (default: 10)")
    add_json(m, "the matches and near misses")
    m.add_argument("--trace", help="write the graph the patterns were matched on as a trace with no steps")
    m.add_argument(
        "--draw",
        metavar="PATH.html",
        help="write a page drawing each graph with its best near miss (or its matches) and, "
        "for Inductor patterns, the pattern's own graph beside it",
    )
    m.set_defaults(fn=cmd_match)


def cmd_match(a: argparse.Namespace) -> int:
    """Print each pattern's matches and its first ``--misses`` near misses (node and reason).
    Raises PatternRaised when a pattern raises while matching."""
    from optimus_lens.frontend.capture import capture
    from optimus_lens.frontend.patternfile import PatternPreviewError, load_pattern_file, pattern_infos, preview
    from optimus_lens.frontend.postgrad import aten_graphs_of
    from optimus_lens.frontend.run import load_model

    with input_errors():
        pf = load_pattern_file(a.pattern_file)
        model, inputs, _ = load_model(a.model)
        if a.mode == "training":
            model.train()
        c = capture(model, inputs, method=a.capture, graph_index=a.graph)
        graphs = (
            [("pre-grad", c.gm)]
            if a.stage == "pre-grad"
            else [(g.name, g.gm) for g in aten_graphs_of(c.gm, c.example_inputs, a.stage, a.mode).graphs]
        )
    every, found_in = {}, {}
    infos = pattern_infos(pf.patterns)
    with json_output(a, "match") as emit:
        for name, gm in graphs:
            if len(graphs) > 1 or a.stage != "pre-grad":
                print(f"== {name} graph ({'Dynamo' if name == 'pre-grad' else 'ATen'}) ==")
            try:
                found = preview(gm, pf.patterns)
            except PatternPreviewError as e:
                raise PatternRaised(str(e)) from e
            every[name] = {"nodes": len(gm.graph.nodes), **found.to_json()}
            found_in[name] = found
            _print_found(pf, found, gm, a.misses)
        head: dict = {"model": a.model, "pattern_file": a.pattern_file}
        if infos:  # Inductor patterns: each one's own graph, what its search function traced to
            head["patterns"] = [i.to_json() for i in infos]
        # pre-grad: one graph's matches at the top level (version 1); post-grad: one entry per ATen graph
        emit({**head, **every["pre-grad"]} if a.stage == "pre-grad" else {**head, "stage": a.stage, "graphs": every})
    if a.trace or a.draw:
        from optimus_lens.core.record import snapshot_graph
        from optimus_lens.core.trace import Trace

        name, gm = graphs[0]
        t = Trace(model=a.model, initial_graph=snapshot_graph(gm.graph), graph=name)
        t.graphs = [Trace(model=a.model, initial_graph=snapshot_graph(g.graph), graph=n) for n, g in graphs[1:]]
        if a.trace:
            t.save(a.trace)
        if a.draw:
            _draw(a, t, found_in, infos)
    return EXIT_OK


def _draw(a: argparse.Namespace, trace, found_in: dict, infos: list) -> None:
    """``--draw``: one page, a section per graph (the drawing is the app's: viz.matchview)."""
    from pathlib import Path

    from optimus_lens.viz import matchview

    sections = [matchview_section(g.graph, g.initial_graph, found_in[g.graph], infos) for g in [trace, *trace.graphs]]
    Path(a.draw).write_text(matchview.match_page(f"{Path(a.pattern_file).name} on {a.model}", sections))
    print(f"drawn: {a.draw}")


def matchview_section(name: str, snap, found, infos: list):
    """One graph's section of the match page: its best near miss (the one that got furthest)
    drawn with the pattern's own graph beside it, else its matches."""
    from optimus_lens.viz import matchview

    best = found.best_near_miss()
    lines = [f"{len(found.matches)} match(es), {len(found.near_misses)} near miss(es) in {len(snap)} nodes"]
    if best is None:
        view = matchview.model_view(snap, matches=[(f"{m.pattern} at {m.anchor}", m.sites) for m in found.matches])
        return matchview.Section(f"{name} graph", lines, view)
    miss = matchview.Miss(
        best.pattern, best.node, best.reason, best.partial, best.stopped, best.pattern_partial, best.pattern_stopped
    )
    lines.append(f"best partial match: {best.pattern} from {best.node}: {best.reason}")
    info = next((i for i in infos if i.name == best.pattern and i.graph is not None), None)
    pattern = None if info is None else matchview.pattern_view(info.graph, miss)
    return matchview.Section(
        f"{name} graph",
        lines,
        matchview.model_view(snap, miss),
        pattern,
        f"the pattern {best.pattern}: what it matches ({info.form})" if info else "",
    )


def _print_found(pf, found, gm, misses: int) -> None:
    """One graph's matches and first ``misses`` near misses, pattern by pattern."""
    for p in pf.patterns:
        mine = [m for m in found.matches if m.pattern == p.name]
        near = [m for m in found.near_misses if m.pattern == p.name]
        print(f"{p.name}  ({p.source}): {len(mine)} match(es), {len(near)} near miss(es)")
        if getattr(p, "pattern_text", None):  # an Inductor pattern: what it matches, as Inductor prints it
            print("  pattern: " + p.pattern_text.replace("\n", "\n           "))
        for m in mine:
            print(f"  match at {m.anchor}: {', '.join(m.sites)}")
            if m.bindings:
                print(f"    bound: {', '.join(f'{k}={v}' for k, v in m.bindings.items())}")
        for m in near[:misses]:
            print(f"  no match at {m.node}: {m.reason}")
        if len(near) > misses:
            print(f"  ... {len(near) - misses} more near miss(es) (--misses N shows more)")
    print(f"\n{len(found.matches)} match(es) in {len(gm.graph.nodes)} nodes; the graph is unchanged")
