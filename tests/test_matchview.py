"""A pattern file's preview drawn (viz.matchview): marked nodes far apart in a big graph are
drawn in their neighbourhood so they open legible in the Lab's pane, as the step viewer fits a
step; the legends say "matched" / "expected here" without the step viewer's "pattern site:"
prefix, so two rows hold them in the pattern's narrow pane."""

from __future__ import annotations

import pytest
import torch

from optimus_lens.frontend.run import optimize
from optimus_lens.viz import matchview
from optimus_lens.viz.fit import LEGIBLE, fit_scale
from optimus_lens.viz.layout import dot_layout

PANE = (470.0, 430.0)  # the Lab's model pane at 1280x800 (app/lab_results.py MODEL_PANE)


class Gate(torch.nn.Module):
    def forward(self, x, g, b):
        return torch.relu(b + x * g)


@pytest.fixture(scope="module")
def towers():
    return optimize("sample:recsys_towers", passes=[]).trace.initial_graph


def _scale(view) -> float:
    return fit_scale(dot_layout(view.source, view.shown), view.focus, PANE)


def test_far_apart_matches_are_drawn_in_their_neighbourhood_so_they_open_legible(towers):
    calls = [n for n, r in towers.nodes.items() if r.op == "call_function"]
    found = [("first", [calls[1]]), ("last", [calls[-2]])]  # the towers' split and the top MLP's end
    asked = matchview.model_view(towers, matches=found)
    assert _scale(asked) < LEGIBLE  # the whole graph: the two marks too far apart to read at once
    fitted = matchview.model_view(towers, matches=found, pane=PANE)
    assert _scale(fitted) >= LEGIBLE and {calls[1], calls[-2]} <= set(fitted.focus)
    assert fitted.shown < asked.shown and "drawn to fit the marked nodes: 1-hop neighbourhood" in fitted.notes


def test_a_graph_that_fits_is_drawn_as_asked(towers):
    calls = [n for n, r in towers.nodes.items() if r.op == "call_function"]
    found = [("one", calls[1:3])]
    fitted = matchview.model_view(towers, matches=found, pane=(4000.0, 4000.0))
    assert fitted.shown == matchview.model_view(towers, matches=found).shown
    assert not any(n.startswith("drawn to fit") for n in fitted.notes)


def test_the_legends_name_the_marks_without_the_step_viewers_prefix():
    snap = optimize(Gate(), tuple(torch.randn(8, 16) for _ in range(3)), passes=[]).trace.initial_graph
    add, mul = (next(n for n, r in snap.nodes.items() if r.op == "call_function" and k in n) for k in ("add", "mul"))
    bias = snap.nodes[add].inputs[0]  # where matching stopped: the bias input, not a mul
    miss = matchview.Miss("mul_add", add, "add.self: expected mul", [add], bias, [add], mul)
    assert [e.text for e in matchview.pattern_view(snap, miss).legend] == ["matched", f"expected here: {mul}"]
    model = matchview.model_view(snap, miss, pane=PANE)
    assert [e.text for e in model.legend] == [
        f"best partial match: mul_add from {add}",
        f"matching stopped here: {bias}",
    ]


@pytest.mark.browser
def test_in_chromium_the_fitted_view_opens_with_every_marked_node_legible_in_the_labs_pane(towers, tmp_path):
    """Read from the page's geometry (tests/fitcheck.py), the viewer at the Lab's viewer size:
    the fitted drawing shows both far-apart matches with labels >= 9 px; the drawing as asked
    does not."""
    from fitcheck import FIT_JS, MIN_PX, failures
    from test_browser import CHROMIUM

    from optimus_lens.viz.render import render_view
    from optimus_lens.viz.viewer import panes_html

    assert CHROMIUM, "chromium is not installed: run scripts/setup.sh --browser"
    from playwright.sync_api import sync_playwright

    calls = [n for n, r in towers.nodes.items() if r.op == "call_function"]
    marked = [calls[1], calls[-2]]
    found = [("first", [marked[0]]), ("last", [marked[1]])]
    out = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 484, "height": 520})  # MODEL_PANE's viewer, app/lab_results.py
        for name, pane in (("asked", None), ("fitted", PANE)):
            view = matchview.model_view(towers, matches=found, pane=pane)
            path = tmp_path / f"{name}.html"
            path.write_text(panes_html([("", render_view(view).svg)], view.focus, view.legend, view.notes))
            page.goto(path.as_uri())
            page.wait_for_selector(".lens .pane svg", timeout=20_000)
            out[name] = failures(page.locator(".lens").evaluate(FIT_JS, [marked, MIN_PX]))
        browser.close()
    assert out["fitted"] == [] and out["asked"] != [], out
