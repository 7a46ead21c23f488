"""A step's picture is chosen to fit its pane (viz/fit.py): the zoom at which the step's
nodes fill a pane is computed from the layout's node boxes and the pane's size in px; a
step too wide for a side-by-side pane is drawn compactly, folded or stacked until every
site and created node fits with labels of at least 9 px; the user's explicit choices
(whole graph, folding off) are kept; and the report, the app and the lesson use the
decision. (In chromium: tests/test_browser_fit.py.)"""

from __future__ import annotations

import json
import re

import pytest
import torch
from fitcheck import drawn_names
from torch import nn

from optimus_lens.frontend.run import optimize
from optimus_lens.viz import PaneSizes, ViewOptions, fit_step, trace_layout
from optimus_lens.viz.fit import LEGIBLE, fit_scale, focus_box
from optimus_lens.viz.layout import Layout
from optimus_lens.viz.report import REPORT_PANES, html_report

TOWERS = 12


class Towers(nn.Module):
    """12 towers (Linear-ReLU) on the 12 pieces of a split, concatenated: one 12-way batch_linear."""

    def __init__(self):
        super().__init__()
        self.fc = nn.ModuleList(nn.Linear(16, 16) for _ in range(TOWERS))

    def forward(self, x):
        return torch.cat([torch.relu(f(p)) for f, p in zip(self.fc, x.split(16, dim=1))], dim=1)


@pytest.fixture(scope="module")
def towers():
    return optimize(Towers().eval(), (torch.randn(4, 16 * TOWERS),), verify="off").trace


def _batch_step(trace):
    return next(s for s in trace.steps if s.pattern == "batch_linear" and len(s.sites) == TOWERS)


def _positions(dot: str) -> dict[str, str]:
    return dict(re.findall(r'^\t"?([\w:.]+)"? \[.*? pos="([^"]+)"', dot, flags=re.M))


def test_fit_scale_is_the_zoom_at_which_the_named_boxes_with_their_padding_fill_the_pane():
    lay = Layout(nodes={"a": (0.0, 0.0, 1.0, 0.5), "b": (100.0, 0.0, 1.0, 0.5), "far": (900.0, 0.0, 1.0, 0.5)})
    assert focus_box(lay, ["a", "b", "missing"]) == (-36.0, -18.0, 136.0, 18.0)
    # 172 x 36 pt of boxes + 12 pt of room on each side = 196 x 60 pt in a 392 x 600 px pane: 2 px per pt
    assert fit_scale(lay, ["a", "b"], (392.0, 600.0)) == pytest.approx(2.0)
    assert fit_scale(lay, ["a", "far"], (392.0, 600.0)) < fit_scale(lay, ["a", "b"], (392.0, 600.0))


def test_pane_sizes_name_the_three_arrangements_and_refuse_any_other():
    sizes = PaneSizes(pair=(1.0, 2.0), stacked=(3.0, 4.0), single=(5.0, 6.0))
    assert [sizes.pane(a) for a in ("pair", "stacked", "single")] == [(1.0, 2.0), (3.0, 4.0), (5.0, 6.0)]
    with pytest.raises(ValueError, match="arrangement"):
        sizes.pane("grid")


def test_a_twelve_way_batch_step_too_wide_for_its_pane_is_redrawn_to_fit_with_every_site_and_new_node(towers):
    step = _batch_step(towers)
    pic, fit = fit_step(towers, step.index, REPORT_PANES, layout=trace_layout(towers))
    asked = [s for how, a, s in fit.tried if how == "as asked" and a == "pair"]
    assert asked and asked[0] < LEGIBLE  # twelve towers side by side: labels under 9 px as first drawn
    assert fit.fits and fit.scale >= LEGIBLE and fit.how != "as asked"
    # the decision's zoom is what the layout and the pane give, measured again here
    assert fit.scale == pytest.approx(fit_scale(pic.layout, fit.focus, REPORT_PANES.pane(fit.arrangement)))
    names = drawn_names(pic, step)  # every site and created node is drawn, itself or in a "×k" node
    assert set(names) <= set(fit.focus)
    # one geometry: a node drawn in both panes sits at the same place in both
    before, after = _positions(pic.before.source), _positions(pic.after.source)
    shared = (set(before) & set(after)) - {"__bb0__", "__bb1__"}
    assert shared and all(before[n] == after[n] for n in shared)
    assert "drawn to fit the step" in fit.note()


def test_the_users_own_choices_are_kept_whole_graph_draws_only_as_asked_and_folding_off_never_folds(towers):
    step = _batch_step(towers)
    _, whole = fit_step(towers, step.index, REPORT_PANES, ViewOptions(full=True))
    assert {how for how, _, _ in whole.tried} == {"as asked"}
    _, unfolded = fit_step(towers, step.index, REPORT_PANES, ViewOptions(fold=False))
    assert not any("folded" in how for how, _, _ in unfolded.tried)


def test_a_step_too_big_for_any_pane_keeps_its_largest_picture_and_says_the_rest_is_off_screen(towers):
    step = _batch_step(towers)
    tiny = PaneSizes(pair=(40.0, 40.0), stacked=(80.0, 20.0), single=(80.0, 40.0))
    pic, fit = fit_step(towers, step.index, tiny)
    assert not fit.fits and fit.scale < LEGIBLE
    assert fit.scale == pytest.approx(max(s for _, _, s in fit.tried))
    assert "off-screen" in fit.note()
    assert pic.before.shown and pic.after.shown


def test_a_larger_text_scale_asks_first_for_labels_that_large(towers):
    step = _batch_step(towers)
    _, normal = fit_step(towers, step.index, REPORT_PANES)
    _, large = fit_step(towers, step.index, REPORT_PANES, ViewOptions(text_scale=1.7))
    reached = [s for _, _, s in large.tried if s >= 1.7]
    assert large.scale >= (1.7 if reached else LEGIBLE)
    assert large.scale >= normal.scale or not reached


def test_the_report_draws_each_step_as_fitted_and_records_the_fit_on_its_viewer(towers):
    step = _batch_step(towers)
    shared = trace_layout(towers)
    _, fit = fit_step(towers, step.index, REPORT_PANES, layout=shared)
    html = html_report(towers, steps=[step.index])
    sec = html[html.index(f"id='step-{step.index}'") :]
    focus = json.loads(re.search(r"data-focus='([^']*)'", sec).group(1).replace("&quot;", '"'))
    assert focus == fit.focus
    data = json.loads(re.search(r"data-fit='([^']*)'", sec).group(1).replace("&quot;", '"'))
    assert data["arrangement"] == fit.arrangement and data["fits"] is True and data["how"] == fit.how
    assert ('class="panes stacked"' in sec.split("class='viewer diff'")[0]) == fit.stacked
