"""A click on a node in a view (app/graphclick.py): what the component's returned value does
to the session (select in the inspector, open a folded module), and the app around it
driven headless with AppTest — streamlit.testing cannot click inside a component, so the
handler is called with the value the component sends, then the app reruns as after a
click. The click itself in chromium: tests/test_browser.py."""
from __future__ import annotations

import json

import pytest

from app import graphclick, inspector
from test_app_debug import click_run, fresh


def viewers(at) -> list[dict]:
    return [json.loads(el.proto.json) for el in at.get("bidi_component")]


@pytest.fixture(scope="module")
def towers():
    from optimus.run import optimize

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
    assert state[inspector.SIDE] == "before"                    # erased by the step: only the before graph has it
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
    assert graphclick.on_pick(state, {"name": fuse.erased[0], "pane": 1}, towers, fuse.index,
                              [fuse.index - 1, fuse.index]) == "ignored"
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
    graphclick.on_pick(at.session_state, {"name": "relu_7", "pane": 0}, t, fuse.index,
                       [fuse.index - 1, fuse.index])           # what the component's callback does
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key=inspector.PICK).value == "relu_7"
    assert at.radio(key=inspector.SIDE).value == "before"
    text = "\n".join(m.value for m in at.markdown)
    assert "**`relu_7`** = `call_function` `torch.nn.functional.relu`" in text and f"graph before step {fuse.index}" in text
    (view,) = viewers(at)
    assert view["selected"] == "relu_7" and view["picked"].startswith("Selected: relu_7 = relu(")
    at.radio(key="picture").set_value("Diff").run()              # the diff view outlines it too
    (view,) = viewers(at)
    assert view["selected"] == "relu_7" and "Diff of step" in view["html"]
    at.session_state["cur_step"] = fuse.index - 1                # still there one step earlier: kept
    at.run()
    assert at.selectbox(key=inspector.PICK).value == "relu_7"
    assert viewers(at)[0]["selected"] == "relu_7"
    assert not at.exception
