"""Every view of every step of every sample model (and of random models) draws.

A view that raises is a crash of the product: this runs each shipped sample through the
default pipeline (verify off), builds the before and after view of every step with the
default options and with each view option, lays the default views out with Graphviz, and
writes the HTML report of each trace. Labels are checked to come from structured data
(e.g. a getitem's index), never from splitting display text.
"""
from __future__ import annotations

import random

import pytest

import sample_models
from optimus.run import optimize
from optimus.trace import NodeRecord
from sample_models.random_models import random_spec
from sample_models.random_models import build as build_random
from viz.graph import node_label, render_svg, render_view, snapshot_view, step_picture, step_view, trace_layout
from viz.report import html_report

try:  # the realistic samples need transformers
    import transformers  # noqa: F401

    HAS_TRANSFORMERS = True
except ImportError:
    HAS_TRANSFORMERS = False

#: each view option a user can pick, besides the defaults
VIEW_OPTIONS = [dict(), dict(fold_params=False), dict(clusters=False), dict(full=True), dict(hops=1, max_nodes=20),
                dict(fold=True), dict(fold=False)]


def _samples():
    out = []
    for n in sample_models.names():
        skip = sample_models.REGISTRY[n].kind == "realistic" and not HAS_TRANSFORMERS
        out.append(pytest.param(n, marks=[pytest.mark.skip(reason="transformers not installed")] if skip else [],
                                id=n))
    return out


def _draw_every_step(trace) -> int:
    drawn = 0
    if not trace.steps:
        assert "<svg" in render_svg(snapshot_view(trace, 0))
    shared = trace_layout(trace)
    for i in range(1, len(trace.steps) + 1):
        for side in ("before", "after"):
            for opts in VIEW_OPTIONS:
                view = step_view(trace, i, side, **opts)
                assert view.shown > 0
                if not opts:
                    assert "<svg" in render_svg(view)
                drawn += 1
        for opts in VIEW_OPTIONS[:1] + VIEW_OPTIONS[5:]:  # before, after and diff on one layout
            pic = step_picture(trace, i, layout=shared, **opts)
            svgs = [render_view(v).svg for v in pic.views().values()]
            assert all("<svg" in s for s in svgs) and "cannot label" not in "".join(svgs)
            drawn += 3
    html = html_report(trace, include_plotlyjs=False)
    assert html.count("<svg") >= 2 * len(trace.steps)
    assert 'class="err"' not in html and "class='err'>Graphviz" not in html
    return drawn


@pytest.mark.parametrize("name", _samples())
def test_every_view_of_every_step_of_the_sample_renders(name):
    trace = optimize(f"sample:{name}", verify="off").trace
    _draw_every_step(trace)


def test_every_view_of_every_step_of_random_models_renders():
    rng = random.Random(7)
    for _ in range(4):
        model, inputs = build_random(random_spec(rng))
        _draw_every_step(optimize(model, inputs, verify="off").trace)


def test_getitem_label_takes_its_index_from_the_argument_not_from_cut_text():
    long_arg = {"node": "position_ids_with_a_very_long_name_that_is_cut"}
    rec = NodeRecord("getitem_3", "call_function", "_operator.getitem", args=[long_arg, {"slice": [None, 7, None]}],
                     inputs=[long_arg["node"]], shape=[1, 7], dtype="int64")
    assert "getitem [:7:]" in node_label(rec)
    rec = NodeRecord("getitem_4", "call_function", "_operator.getitem", args=[{"node": "split"}, 2],
                     inputs=["split"], shape=[4, 8], dtype="float32")
    assert "getitem [2]" in node_label(rec)
