"""The step viewer on a run's ATen graphs (AppTest): Stage and Mode in the sidebar are kept
across a page switch and passed to ``optimize``; after a ``--stage all`` training run the
Graph picker offers pre-grad / forward / backward with their step counts, each graph's steps
are reachable and shown as that graph's, the panels that only work on the pre-grad graph say
so; an uploaded trace file with ATen graphs gets the same picker. One chromium screenshot at
1280x800 (``OPTIMUS_LENS_SHOTS=DIR`` keeps it)."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest
from test_app import APP, TIMEOUT, run
from test_browser import app_url  # noqa: F401 - the app in a subprocess, as a fixture
from test_state_browser import _browser, _settle, _shot

from optimus_lens.app import state as S

MODEL = "recsys_towers"  # 4 towers: pre-grad and forward steps in seconds


def _exceptions(at: AppTest) -> list[str]:
    return [e.value for e in at.exception]


def _heading(at: AppTest) -> str:
    return next(m.value for m in at.markdown if m.value.startswith("#### Step "))


def _set_stage(at: AppTest, stage: str, mode: str) -> AppTest:
    at.radio(key="run_stage").set_value(stage).run()
    at.radio(key="run_mode").set_value(mode).run()
    return at


@pytest.fixture(scope="module")
def trained() -> AppTest:
    """recsys_towers run with stage all, training mode, from the sidebar."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.selectbox(key="sample").set_value(MODEL).run()
    _set_stage(at, "all", "training")
    return run(at)


def test_stage_and_mode_are_kept_across_a_page_switch_and_named_under_run():
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert at.radio(key="run_stage").value == "pre-grad" and at.radio(key="run_mode").value == "inference"
    assert not any(e.key == "pass:batch_aten_add" for e in at.checkbox)  # post-grad passes only when they run
    _set_stage(at, "post-grad", "training")
    at.session_state[S.PAGE] = S.TEACH  # away and back
    at.run()
    at.session_state[S.PAGE] = S.VIEWER
    at.run()
    assert not _exceptions(at)
    assert at.radio(key="run_stage").value == "post-grad" and at.radio(key="run_mode").value == "training"
    assert at.checkbox(key="pass:batch_aten_add").value is True
    assert at.checkbox(key="pass:decompose_mm_pass").value is False  # off in the post-grad pipeline too
    plan = next(c.value for c in at.sidebar.caption if c.value.startswith("Runs `"))
    assert "post-grad passes" in plan and "forward and backward ATen graphs" in plan and "training" in plan


def test_a_stage_all_training_run_records_three_graphs_and_offers_the_graph_picker(trained):
    at = trained
    trace = at.session_state.trace
    assert trace.capture["stage"] == "all" and trace.capture["mode"] == "training"
    assert trace.graph_names() == ["pre-grad", "forward", "backward"]
    pick = at.radio(key="view_graph")
    assert pick.options == [S.graph_label(trace, n) for n in trace.graph_names()]
    assert pick.value == "pre-grad" and f"{len(trace.steps)} steps" in pick.options[0]
    assert f"{len(trace.graph_named('forward').steps)} step" in pick.options[1]
    assert _heading(at).startswith(f"#### Step 1: `{trace.steps[0].pattern}`")
    assert all(s.verify is None or s.verify.ok for s in trace.all_steps())  # every recorded check passed


def test_every_graphs_steps_are_reachable_and_shown_as_that_graphs(trained):
    at = trained
    trace = at.session_state.trace
    at.button(key="next").click().run()
    assert at.session_state.cur_step == 2
    for name in ("forward", "backward", "pre-grad"):
        at.radio(key="view_graph").set_value(name).run()
        assert not _exceptions(at), (name, _exceptions(at))
        g = trace.graph_named(name)
        if not g.steps:
            assert any(f"on the {name} graph" in i.value for i in at.info)
            continue
        want = 2 if name == "pre-grad" else 1  # each graph keeps the step it was left on
        assert at.session_state.cur_step == want
        assert _heading(at).startswith(f"#### Step {want}: `{g.step(want).pattern}` — pass `{g.step(want).pass_name}`")
        for _ in range(len(g.steps) - want):  # every step of the graph, Next to its end
            at.button(key="next").click().run()
            assert not _exceptions(at), (name, _exceptions(at))
        assert at.session_state.cur_step == len(g.steps) and at.button(key="next").disabled
        assert [m.value for m in at.metric if m.label == "Steps"] == [str(len(g.steps))]
        if name != "pre-grad":  # panels that re-run the pre-grad graph from the spec say so
            assert any("optimus bench" in c.value and "--stage all --mode training" in c.value for c in at.caption)
            assert not any(b.key == "compare_btn" for b in at.button)
    assert not _exceptions(at)


def test_an_uploaded_trace_with_aten_graphs_gets_the_picker(trained):
    trace = trained.session_state.trace
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    S.accept_upload(at.session_state, "t.json", trace.dumps().encode(), [])  # what the uploader's handler does
    at.session_state["view_graph"] = "forward"
    at.run()
    assert not _exceptions(at)
    assert at.session_state.spec is None  # a file's model: no re-run, no timing
    assert at.radio(key="run_stage").value == "all" and at.radio(key="run_mode").value == "training"
    assert len(at.radio(key="view_graph").options) == 3
    at.radio(key="view_graph").set_value("backward").run()
    at.radio(key="view_graph").set_value("forward").run()
    fwd = trace.graph_named("forward")
    if fwd.steps:
        assert _heading(at).startswith(f"#### Step 1: `{fwd.steps[0].pattern}`")
    assert not _exceptions(at)


@pytest.mark.browser
def test_the_graph_picker_in_chromium_at_1280x800(trained, app_url, tmp_path):  # noqa: F811
    from playwright.sync_api import sync_playwright

    path = tmp_path / "run.trace.json"
    trained.session_state.trace.save(str(path))
    with sync_playwright() as p:
        browser = _browser(p)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(app_url)
        _settle(page)
        page.locator('[data-testid="stSidebar"]').get_by_text("Trace file", exact=True).click()
        _settle(page)
        page.locator('[data-testid="stSidebar"] input[type="file"]').set_input_files(str(path))
        _settle(page)
        page.locator('[data-testid="stMain"]').get_by_text("forward (ATen", exact=False).first.click()
        _settle(page)
        _shot(page, tmp_path, "post_grad_forward")
        main = page.locator('[data-testid="stMain"]').inner_text()
        browser.close()
    assert "forward (ATen" in main and "backward (ATen" in main
    fwd = trained.session_state.trace.graph_named("forward")
    assert (f"Step 1: {fwd.steps[0].pattern}" in main) if fwd.steps else ("on the forward graph" in main)
