"""The step viewer's module folding and presentation mode in the app (AppTest)."""
from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from app import modules as app_modules
from test_app import APP, TIMEOUT, _viewer_pages, run


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
