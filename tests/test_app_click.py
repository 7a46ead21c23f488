"""A click on a node in a view (app/graphclick.py): what the component's returned value does
to the session (select in the inspector, open a folded module), and the app around it
driven headless with AppTest — streamlit.testing cannot click inside a component, so the
handler is called with the value the component sends, then the app reruns as after a
click. The click itself in chromium: tests/test_browser.py."""

from __future__ import annotations

import json

import pytest
from test_app_debug import click_run, fresh

from optimus_lens.app import graphclick, inspector


def viewers(at) -> list[dict]:
    return [json.loads(el.proto.json) for el in at.get("bidi_component")]


@pytest.fixture(scope="module")
def towers():
    from optimus_lens.frontend.run import optimize

    return optimize("sample:recsys_towers", verify="off").trace


def test_a_click_on_an_after_pane_node_selects_it_on_the_after_side_and_opens_the_inspector(towers):
    state = {}
    fuse = next(s for s in towers.steps if s.pattern == "batch_layernorm")
    new = fuse.created[0]
    got = graphclick.on_pick(state, {"name": new, "pane": 1}, towers, fuse.index, [fuse.index - 1, fuse.index])
    assert got == "selected"
    assert state["inspect_node"] == state[inspector.PICK] == new
    assert state[inspector.SIDE] == "after" and state[inspector.PANEL] is True


def test_a_click_in_the_diff_picks_the_side_that_has_the_node(towers):
    fuse = next(s for s in towers.steps if s.pattern == "batch_layernorm")
    state = {}
    assert graphclick.on_pick(state, {"name": fuse.erased[0], "pane": 0}, towers, fuse.index, [None]) == "selected"
    assert state[inspector.SIDE] == "before"  # erased by the step: only the before graph has it
    assert graphclick.on_pick(state, {"name": fuse.created[0], "pane": 0}, towers, fuse.index, [None]) == "selected"
    assert state[inspector.SIDE] == "after"


def test_a_click_on_a_folded_module_unfolds_it_instead_of_selecting(towers):
    state = {"inspect_node": "relu"}
    assert graphclick.on_pick(state, {"name": "mod:towers.3", "pane": 0}, towers, 1, [0, 1]) == "unfolded"
    assert state["unfolded_modules"] == {"towers.3"} and state["inspect_node"] == "relu"
    graphclick.on_pick(state, {"name": "mod:towers.4.norm", "pane": 1}, towers, 1, [0, 1])
    assert state["unfolded_modules"] == {"towers.3", "towers.4.norm"}


def test_a_click_on_no_node_of_the_graph_changes_nothing(towers):
    state = {}
    for value in (None, {}, {"pane": 0}, {"name": "_anchor_top", "pane": 0}, {"name": "relu", "pane": 7}):
        assert graphclick.on_pick(state, value, towers, 1, [0, 1]) == "ignored"
    fuse = next(s for s in towers.steps if s.pattern == "batch_layernorm")
    # a node the step erased, clicked in the after pane, is not there: ignored
    assert (
        graphclick.on_pick(state, {"name": fuse.erased[0], "pane": 1}, towers, fuse.index, [fuse.index - 1, fuse.index])
        == "ignored"
    )
    assert state == {}


def test_after_a_click_the_inspector_shows_the_node_and_every_view_outlines_it_across_steps():
    at = click_run(fresh())
    t = at.session_state["trace"]
    fuse = next(s for s in t.steps if s.pattern == "batch_layernorm")
    at.session_state["cur_step"] = fuse.index
    at.run()
    (view,) = viewers(at)
    assert view["selected"] is None and view["picked"] == ""
    # relu_7 feeds layer_norm_3: in both panes; clicked in the before pane
    graphclick.on_pick(
        at.session_state, {"name": "relu_7", "pane": 0}, t, fuse.index, [fuse.index - 1, fuse.index]
    )  # what the component's callback does
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key=inspector.PICK).value == "relu_7"
    assert at.radio(key=inspector.SIDE).value == "before"
    text = "\n".join(m.value for m in at.markdown)
    assert (
        "**`relu_7`** = `call_function` `torch.nn.functional.relu`" in text
        and f"graph before step {fuse.index}" in text
    )
    (view,) = viewers(at)
    assert view["selected"] == "relu_7" and view["picked"].startswith("Selected: relu_7 = relu(")
    at.radio(key="picture").set_value("Diff").run()  # the diff view outlines it too
    (view,) = viewers(at)
    assert view["selected"] == "relu_7" and "Diff of step" in view["html"]
    at.session_state["cur_step"] = fuse.index - 1  # still there one step earlier: kept
    at.run()
    assert at.selectbox(key=inspector.PICK).value == "relu_7"
    assert viewers(at)[0]["selected"] == "relu_7"
    assert not at.exception


def why_rows(at) -> dict[str, tuple[str, str]]:
    table = next(d.value for d in at.table if "answer" in d.value.columns)  # a static table: answers wrap
    return {r.pattern: (r.applies, r.answer) for r in table.itertuples()}


def test_why_not_panel_answers_for_a_node_after_a_fusion_step_and_for_a_node_an_earlier_step_created():
    at = click_run(fresh())
    t = at.session_state["trace"]
    first_cleanup = next(s for s in t.steps if s.pass_name == "split_cat_cleanup")
    at.session_state["cur_step"] = first_cleanup.index  # after every batch fusion
    at.session_state["inspect_node"] = "h"  # the towers' cat, selected in the view
    at.session_state["why_panel"] = True
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    rows = why_rows(at)
    assert rows["remove_split_cat"][0] == "no" and "not split" in rows["remove_split_cat"][1]
    assert any(f"read at the graph before step {first_cleanup.index}" in c.value for c in at.caption)
    # the batch fusions ran before this step: their answers are read on this graph
    assert rows["batch_relu"][1].startswith("its pass batch_relu ran before step")
    # a near miss is drawn in the view: the partial match outlined
    near = at.selectbox(key="why_near")
    near.set_value("remove_split_cat").run()
    next(b for b in at.button if b.key == "why_draw_btn").click().run()
    partial = viewers(at)[0]["partial"]  # the cat, then the getitems it reads (matched before "not split")
    assert partial[0] == "h" and all(n.startswith("getitem") for n in partial[1:]), partial

    # a node created by an earlier step (a fusion's stack), asked before the step that removes it
    step = next(s for s in t.steps if s.pattern == "remove_unbind_stack")
    created_by = next(s for s in t.steps if step.sites[0] in s.created)
    assert created_by.index < step.index
    at.session_state["cur_step"] = step.index
    at.text_input(key="why_node").input(step.sites[0]).run()
    assert not at.exception, [e.value for e in at.exception]
    rows = why_rows(at)
    applies, answer = rows["remove_unbind_stack"]
    assert applies == "yes" and answer.startswith(f"rewrites at step {step.index} with getitem")
    assert any(f"**remove_unbind_stack** applies here: rewrites at step {step.index}" in s.value for s in at.success)


def test_the_walk_clicking_the_view_that_upstreams_batch_layernorm_breaks_says_why(tmp_path):
    """The issue's walk without the browser: upstream's batch_layernorm on the held-in input,
    flagged; a click on the `view` in the after pane; the inspector names the error, the
    rewired input and its real strides; the repro download is offered."""
    from test_app_debug import held_in_app

    from optimus_lens.app import toggles

    at = held_in_app(tmp_path)
    at.radio(key="pass_source").set_value(toggles.INDUCTOR).run()
    at.multiselect(key="upstream_passes").set_value(["batch_layernorm"]).run()
    click_run(at)
    t = at.session_state["trace"]
    assert any(e.value.startswith("**Upstream defect** — step 1") for e in at.error)
    graphclick.on_pick(at.session_state, {"name": "view", "pane": 1}, t, 1, [0, 1])
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key=inspector.PICK).value == "view"
    assert any(
        e.value.startswith("`view` raises when the graph after step 1 runs")
        and "view size is not compatible" in e.value
        for e in at.error
    )
    (w,) = [w.value for w in at.warning if "reads its input's strides" in w.value]
    assert "`layer_norm` [4, 16] stride `[16, 1]`" in w and "it has stride `[80, 1]`" in w
    assert any("Download repro of step 1" in str(b.proto.label) for b in at.get("download_button"))
