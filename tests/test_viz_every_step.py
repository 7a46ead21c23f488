"""Every view of every step of every sample model (and of random models) draws.

A view that raises is a crash of the product: this runs each shipped sample through the
default pipeline (verify off), builds the before and after view of every step with the
default options and with each view option (for samples above ``BIG`` nodes: each option on
the first step of each pattern), draws each step's before/after/diff picture on its shared
layout, lays the default views out with Graphviz, and writes the HTML report of each trace. Labels are checked to come from structured data
(e.g. a getitem's index), never from splitting display text.
"""

from __future__ import annotations

import functools
import random

import pytest
import torch

from optimus_lens import sample_models
from optimus_lens.core.trace import NodeRecord
from optimus_lens.frontend.run import optimize
from optimus_lens.sample_models.random_models import build as build_random
from optimus_lens.sample_models.random_models import random_spec
from optimus_lens.viz import (
    ViewOptions,
    node_label,
    render_svg,
    render_view,
    snapshot_view,
    step_picture,
    step_view,
    trace_layout,
)
from optimus_lens.viz.report import embedded_svgs, html_report

try:  # the realistic samples need transformers
    import transformers  # noqa: F401

    HAS_TRANSFORMERS = True
except ImportError:
    HAS_TRANSFORMERS = False

#: each view option a user can pick, besides the defaults
VIEW_OPTIONS = [
    ViewOptions(),
    ViewOptions(fold_params=False),
    ViewOptions(clusters=False),
    ViewOptions(full=True),
    ViewOptions(hops=1, max_nodes=20),
    ViewOptions(fold=True),
    ViewOptions(fold=False),
    ViewOptions(modules=True),
]


def _samples():
    out = []
    for n in sample_models.names():
        skip = sample_models.REGISTRY[n].kind == "realistic" and not HAS_TRANSFORMERS
        out.append(pytest.param(n, marks=[pytest.mark.skip(reason="transformers not installed")] if skip else [], id=n))
    return out


#: above this many nodes, each view option is drawn for the first step of each pattern (and the
#: default views and pictures for every step), to keep the test's time in bounds
BIG = 1000


def _draw_every_step(trace) -> int:
    drawn = 0
    if not trace.steps:
        assert "<svg" in render_svg(snapshot_view(trace, 0))
    shared = trace_layout(trace)
    first_of_pattern = {s.pattern: s.index for s in reversed(trace.steps)}.values()
    for i in range(1, len(trace.steps) + 1):
        every_option = len(trace.initial_graph) <= BIG or i in first_of_pattern
        for side in ("before", "after"):
            for opts in VIEW_OPTIONS if every_option else VIEW_OPTIONS[:1]:
                view = step_view(trace, i, side, opts)
                assert view.shown > 0
                if opts == ViewOptions():
                    assert "<svg" in render_svg(view)
                drawn += 1
        for opts in VIEW_OPTIONS[:1] + (VIEW_OPTIONS[5:] if every_option else []):  # before, after, diff: one layout
            pic = step_picture(trace, i, opts, layout=shared)
            svgs = [render_view(v).svg for v in pic.views().values()]
            assert all("<svg" in s for s in svgs) and "cannot label" not in "".join(svgs)
            drawn += 3
    html = html_report(trace)
    assert len(embedded_svgs(html)) == len(trace.steps) or (not trace.steps and "Captured graph" in html)
    assert "class='err'" not in html and "cannot label" not in html
    return drawn


@functools.cache
def _trace(name: str):
    return optimize(f"sample:{name}", verify="off").trace


@pytest.mark.parametrize("name", _samples())
def test_every_view_of_every_step_of_the_sample_renders(name):
    _draw_every_step(_trace(name))


def test_a_128_way_fusion_of_industrial_recsys_is_drawn_in_at_most_60_nodes_with_every_member_accounted_for():
    trace = _trace("industrial_recsys")
    step = next(s for s in trace.steps if s.pattern == "batch_linear" and len(s.sites) >= 128)
    pic = step_picture(trace, step.index)
    for view, names in ((pic.before, step.sites), (pic.after, step.created), (pic.diff, step.sites + step.created)):
        assert view.shown <= 60
        d = view.drawn
        represented = {m for n in d.order for m in d.members.get(n, [n])}
        assert set(names) <= represented  # each site / created node is drawn or a member of a drawn "×k" node
    d = pic.before.drawn
    folded_sites = [n for n in d.order if len(d.members.get(n, [])) > 1 and set(d.members[n]) <= set(step.sites)]
    assert sum(len(d.members[n]) for n in folded_sites) == len(step.sites)  # the sites are drawn as a few ×k nodes
    assert all(f"×{len(d.members[n])}" in pic.before.source for n in folded_sites)


def test_every_view_of_every_step_of_random_models_renders():
    rng = random.Random(7)
    for _ in range(4):
        model, inputs = build_random(random_spec(rng))
        _draw_every_step(optimize(model, inputs, verify="off").trace)


def test_getitem_label_takes_its_index_from_the_argument_not_from_cut_text():
    long_arg = {"node": "position_ids_with_a_very_long_name_that_is_cut"}
    rec = NodeRecord(
        "getitem_3",
        "call_function",
        "_operator.getitem",
        args=[long_arg, {"slice": [None, 7, None]}],
        inputs=[long_arg["node"]],
        shape=[1, 7],
        dtype="int64",
    )
    assert "getitem [:7:]" in node_label(rec)
    rec = NodeRecord(
        "getitem_4",
        "call_function",
        "_operator.getitem",
        args=[{"node": "split"}, 2],
        inputs=["split"],
        shape=[4, 8],
        dtype="float32",
    )
    assert "getitem [2]" in node_label(rec)


def test_the_report_of_recsys_towers_is_one_offline_file_under_2_mb_with_each_drawing_once():
    trace = _trace("recsys_towers")
    html = html_report(trace)
    svgs = embedded_svgs(html)
    assert len(html.encode()) < 2_000_000
    assert len(svgs) == len(trace.steps) and all(len(d) == 3 for d in svgs.values())
    assert "<script src" not in html and "http://" not in html.split("<svg", 1)[0].replace("http://www.w3.org", "")
    assert html.count("function lensMount") == 1


def test_a_rolled_back_step_shows_its_error_and_source_in_the_step_facts_and_the_report():
    from optimus_lens.core.miss import Miss
    from optimus_lens.core.pattern import Match, RewritePattern
    from optimus_lens.core.pipeline import Pass, Pipeline
    from optimus_lens.viz.text import step_facts

    class RaisesAfterCreating(RewritePattern):
        name = "raises_after_creating_viz"
        anchors = frozenset({torch.relu, torch.nn.functional.relu})

        def match(self, node):
            return Match(node, [node]) if node.target in self.anchors else Miss("not a relu")

        def rewrite(self, rw, m):
            with rw.inserting_before(m.anchor):
                rw.call(torch.sigmoid, m.anchor.args[0])
            raise RuntimeError("broken on purpose")

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
    trace = optimize(model, (torch.randn(2, 4),), pipeline=Pipeline([Pass("p", [RaisesAfterCreating()])])).trace
    (step,) = trace.steps
    facts = dict(step_facts(step))
    assert "broken on purpose" in facts["ROLLED BACK"] and "test_viz_every_step.py" in facts["ROLLED BACK"]
    assert "broken on purpose" in html_report(trace)
