"""The step viewer's module folding and presentation mode in the app (AppTest)."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest
from test_app import APP, TIMEOUT, _viewer_pages, _viewers, run

from optimus_lens.app import modules as app_modules


@pytest.fixture(scope="module")
def towers32() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.selectbox(key="sample").set_value("recsys_towers32").run()
    return run(at)


def test_modules_fold_by_default_on_a_big_model_and_open_from_the_control_and_by_click(towers32):
    at = towers32
    page = _viewer_pages(at)[0]
    assert "<title>mod:towers.0</title>" in page and "lens&#45;module" in page  # 32 towers: one "×32" module node
    pick = at.multiselect(key="unfold_pick")
    assert len(pick.options) == 32 and pick.value == []
    pick.set_value(["towers.0"]).run()
    assert at.session_state["unfolded_modules"] == {"towers.0"}
    page = _viewer_pages(at)[0]
    assert "<title>mod:towers.0</title>" not in page and "<title>mod:towers.1</title>" in page
    at.button(key="next").click().run()  # kept across steps
    assert at.session_state["unfolded_modules"] == {"towers.0"}
    at.button(key="prev").click().run()
    assert app_modules.unfold_clicked(at.session_state, "mod:towers.1")  # what a click on the node does
    assert not app_modules.unfold_clicked(at.session_state, "linear_3")
    at.run()
    assert at.multiselect(key="unfold_pick").value == ["towers.0", "towers.1"]
    assert "<title>mod:towers.1</title>" not in _viewer_pages(at)[0]
    at.button(key="unfold_all").click().run()
    assert "lens&#45;module" not in _viewer_pages(at)[0] and at.selectbox(key="fold_modules").value == "off"
    at.button(key="fold_again").click().run()
    assert "<title>mod:towers.0</title>" in _viewer_pages(at)[0] and at.session_state["unfolded_modules"] == set()
    assert not at.exception


def test_presentation_is_one_switch_kept_in_session_state_with_the_colour_blind_safe_palette():
    from optimus_lens.viz.palette import PRESENTATION, STANDARD

    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert at.session_state["presentation"] is False
    at = run(at)
    assert STANDARD.groups[0] in _viewer_pages(at)[0]
    at.toggle(key="presentation_switch").set_value(True).run()
    assert at.session_state["presentation"] is True
    page = _viewer_pages(at)[0]
    assert PRESENTATION.groups[0] in page and PRESENTATION.created_border in page and STANDARD.groups[0] not in page
    assert _viewers(at)[0]["scale"] == 1.7  # large text: the viewer's text scale
    assert not any(s.key == "pass_filter" for s in at.selectbox)  # controls out of the way
    at.button(key="next").click().run()
    assert at.session_state["presentation"] is True and at.session_state["cur_step"] == 2
    at.toggle(key="presentation_nav").set_value(False).run()  # the switch beside Previous/Next turns it off
    assert at.session_state["presentation"] is False and STANDARD.groups[0] in _viewer_pages(at)[0]
    assert not at.exception
