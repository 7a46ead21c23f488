"""The Streamlit app (app/main.py) driven headless with streamlit.testing's AppTest, and its
session logic (app/state.py) directly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from streamlit.testing.v1 import AppTest

from optimus_lens.app import state as S
from optimus_lens.core.engine import PatternError
from optimus_lens.core.trace import Trace

APP = str(Path(__file__).resolve().parent.parent / "app" / "main.py")
TIMEOUT = 180


class _BreakModel(torch.nn.Module):
    """Two same-shaped linear groups separated by a Dynamo graph break."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(5))
        self.b = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = torch.cat([m(x) for m in self.a], dim=1)
        torch._dynamo.graph_break()
        return self.b(h[:, :8])


def graph_break_model():
    """Factory for the ``package.module:factory`` spec ``test_app:graph_break_model``."""
    torch.manual_seed(0)
    return _BreakModel().eval(), (torch.randn(4, 8),)


class _FiveRelus(torch.nn.Module):
    def forward(self, a, b, c, d, e):
        return torch.cat([torch.relu(t) for t in (a, b, c, d, e)], dim=1)


def five_relus():
    """Factory: five independent same-shape relus (one batch_relu group)."""
    return _FiveRelus(), tuple(torch.randn(4, 8) for _ in range(5))


def one_linear():
    """Factory: nothing for any pattern to match."""
    return torch.nn.Linear(8, 8).eval(), (torch.randn(4, 8),)


def use_factory(at: AppTest, spec: str) -> AppTest:
    at.radio(key="source_kind").set_value("Python factory").run()
    at.text_input(key="factory").input(spec).run()
    return at


def fresh() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def run(at: AppTest) -> AppTest:
    [b for b in at.button if b.label == "Run"][0].click().run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def shown_step_heading(at: AppTest) -> str:
    return next(m.value for m in at.markdown if m.value.startswith("#### Step "))


@pytest.fixture
def ran() -> AppTest:
    return run(fresh())


# --------------------------------------------------------------------------- the app


def test_app_loads_with_the_default_model_and_no_trace():
    at = fresh()
    assert at.selectbox(key="sample").value == "recsys_towers"
    assert any("DLRM-style" in c.value for c in at.sidebar.caption)
    assert at.session_state.trace is None and not at.error


def test_run_records_steps_and_shows_the_first(ran):
    trace = ran.session_state.trace
    assert trace is not None and len(trace.steps) >= 5
    assert ran.session_state.cur_step == 1
    assert shown_step_heading(ran).startswith(f"#### Step 1: `{trace.steps[0].pattern}`")
    assert ran.select_slider(key="step_slider").value == 1
    assert [m.label for m in ran.metric][:3] == ["Nodes before", "Nodes after", "Steps"]
    assert ran.metric[2].value == str(len(trace.steps))


def test_next_previous_and_the_slider_move_the_step_together(ran):
    ran.button(key="next").click().run()
    assert ran.session_state.cur_step == 2 and ran.select_slider(key="step_slider").value == 2
    assert shown_step_heading(ran).startswith("#### Step 2:")
    ran.button(key="prev").click().run()
    assert ran.session_state.cur_step == 1 and ran.select_slider(key="step_slider").value == 1
    assert ran.button(key="prev").disabled
    ran.select_slider(key="step_slider").set_value(4).run()
    assert ran.session_state.cur_step == 4 and shown_step_heading(ran).startswith("#### Step 4:")
    ran.button(key="next").click().run()
    assert ran.select_slider(key="step_slider").value == 5


def _viewers(at: AppTest) -> list[dict]:
    """The data of the clickable pan/zoom viewers on the page (app.graphclick's component):
    html, focus, scale (the text size), height, selected, partial."""
    return [json.loads(el.proto.json) for el in at.get("bidi_component")]


def _viewer_pages(at: AppTest) -> list[str]:
    """The HTML of the pan/zoom viewers on the page."""
    return [v["html"] for v in _viewers(at)]


def test_a_step_is_one_viewer_with_before_and_after_on_one_layout(ran):
    pages = _viewer_pages(ran)
    assert len(pages) == 1
    page = pages[0]
    assert page.count('<div class="pane">') == 2 and "Before step 1" in page and "After step 1" in page
    assert "the panes move together" in page
    assert any("Layout: dot" in c.value and "one layout for all steps" in c.value for c in ran.caption)


def test_the_diff_picture_shows_the_normalize_split_change_in_place(ran):
    ran.radio(key="picture").set_value("Diff").run()
    page = _viewer_pages(ran)[0]
    assert page.count('<div class="pane">') == 1 and "Diff of step 1" in page
    assert 'text-decoration="line-through"' in page and "[16, 16, 16" in page  # split: 16 -> [16, 16, ...]
    assert "replaced by (dashed arrow" in page


def test_text_size_is_kept_across_steps_and_presentation_enlarges_it(ran):
    ran.select_slider(key="text_size").set_value("large").run()
    assert _viewers(ran)[0]["scale"] == 1.3  # lensMount(root, focus, text scale)
    ran.button(key="next").click().run()
    assert ran.select_slider(key="text_size").value == "large" and _viewers(ran)[0]["scale"] == 1.3
    ran.toggle(key="presentation_switch").set_value(True).run()
    assert _viewers(ran)[0]["scale"] == 1.7 and not ran.exception


def test_pass_filter_limits_the_navigator_to_that_pass(ran):
    ran.selectbox(key="pass_filter").set_value("batch_relu").run()
    relu_steps = [s.index for s in ran.session_state.trace.steps_of_pass("batch_relu")]
    assert ran.session_state.cur_step == relu_steps[0]
    assert len(ran.select_slider(key="step_slider").options) == len(relu_steps)
    ran.button(key="next").click().run()
    assert ran.session_state.cur_step == relu_steps[1]
    ran.radio(key="view_mode").set_value("Whole pass").run()
    assert not ran.exception and not ran.warning  # both overview graphs laid out


def test_a_single_step_trace_has_no_slider_and_both_buttons_disabled():
    at = use_factory(fresh(), "test_app:five_relus")
    for box in at.checkbox:
        if box.key and box.key.startswith("pass:") and box.key != "pass:batch_relu":
            box.uncheck()
    run(at)
    assert [s.pattern for s in at.session_state.trace.steps] == ["batch_relu"]
    assert not [w for w in at.select_slider if w.key == "step_slider"]
    assert at.button(key="prev").disabled and at.button(key="next").disabled
    assert shown_step_heading(at).startswith("#### Step 1: `batch_relu`")


def test_a_trace_without_steps_shows_the_captured_graph():
    at = run(use_factory(fresh(), "test_app:one_linear"))
    assert at.session_state.trace.steps == []
    assert any("No pattern matched" in i.value for i in at.info)
    assert any("drawn of" in c.value for c in at.caption)


def test_switching_a_pass_off_changes_the_result(ran):
    assert any(s.pass_name == "batch_linear" for s in ran.session_state.trace.steps)
    ran.checkbox(key="pass:batch_linear").uncheck()
    run(ran)
    trace = ran.session_state.trace
    assert not any(s.pass_name == "batch_linear" for s in trace.steps)
    assert [p["name"] for p in trace.passes if not p["enabled"]] == ["batch_linear"]


def test_a_bad_trace_upload_shows_an_error_and_keeps_the_trace(ran):
    before = ran.session_state.trace
    ran.radio(key="source_kind").set_value("Trace file").run()
    ran.file_uploader(key="upload").set_value(("broken.json", b"{not json", "application/json")).run()
    assert any("Could not open broken.json" in e.value for e in ran.error)
    assert ran.session_state.trace is before
    assert shown_step_heading(ran).startswith("#### Step 1:")


def test_a_good_trace_upload_replaces_the_trace(ran):
    data = ran.session_state.trace.dumps().encode()
    ran.checkbox(key="pass:batch_linear").uncheck()
    run(ran)  # a different trace on screen
    ran.radio(key="source_kind").set_value("Trace file").run()
    ran.file_uploader(key="upload").set_value(("saved.json", data, "application/json")).run()
    assert not ran.error
    assert ran.session_state.trace.dumps().encode() == data
    assert ran.session_state.source == "trace file saved.json"
    assert ran.session_state.spec == "sample:recsys_towers"  # a sample: it can be re-run and timed


def test_a_bad_model_spec_shows_an_error_and_keeps_the_trace(ran):
    before = ran.session_state.trace
    run(use_factory(ran, "no_such_package_xyz.models:build"))
    assert any("Model spec error" in e.value and "no_such_package_xyz" in e.value for e in ran.error)
    assert ran.session_state.trace is before
    ran.button(key="next").click().run()  # the message is shown once; the old trace is still navigable
    assert not ran.error and ran.session_state.cur_step == 2


def test_graph_breaks_are_reported_with_a_graph_selector():
    at = run(use_factory(fresh(), "test_app:graph_break_model"))
    cap = at.session_state.trace.capture
    assert cap["graphs"] == 2
    assert any("splits into **2 graphs**" in w.value for w in at.warning)
    assert at.selectbox(key="graph_pick").options == [
        "graph 1 (" + str(cap["graph_nodes"][0]) + " nodes)",
        "graph 2 (" + str(cap["graph_nodes"][1]) + " nodes)",
    ]
    other = 1 - cap["graph_index"]
    at.selectbox(key="graph_pick").set_value(other)
    [b for b in at.button if b.label == "Re-run on this graph"][0].click().run()
    assert at.session_state.trace.capture["graph_index"] == other


def test_per_pass_timing_shows_method_figures_and_table(ran):
    ran.number_input(key="repeats").set_value(3).run()
    ran.button(key="bench_btn").click().run()
    assert not ran.exception
    b = ran.session_state.bench
    assert b is not None and b.stages[0].stage == "baseline"
    # on CPU the default is the tight-spread mode: one thread, timed by the thread's CPU time
    assert b.method == ("cuda-events" if torch.cuda.is_available() else "thread-cpu-time")
    assert any("thread's CPU time" in i.value or "CUDA events" in i.value for i in ran.info)
    assert len(ran.get("plotly_chart")) == 3  # node count, speedup, memory


# --------------------------------------------------------------------------- session logic


def test_accept_upload_keeps_state_on_a_bad_file_and_loads_a_good_one():
    trace = Trace.loads('{"format_version": 1, "model": "m", "initial_graph": {"nodes": []}, "steps": []}')
    state: dict = {}
    S.init(state)
    S.set_trace(state, trace, "sample:m", "run")
    for bad in (b"\xff\xfe", b"[]", b'{"format_version": 99}', b'{"format_version": 1}'):
        assert not S.accept_upload(state, "x.json", bad)
        assert state["trace"] is trace and state["error"][0] == "Could not open x.json"
    assert S.accept_upload(state, "ok.json", trace.dumps().encode(), known_samples=["m"])
    assert state["trace"] is not trace and state["spec"] == "sample:m" and state["error"] is None


def test_move_step_stops_at_either_end_of_the_options():
    state = {"cur_step": 3}
    S.move_step(state, [3, 5, 9], 1)
    assert state["cur_step"] == 5
    S.move_step(state, [3, 5, 9], 5)
    assert state["cur_step"] == 9
    S.move_step(state, [3, 5, 9], -7)
    assert state["cur_step"] == 3
    state["cur_step"] = 4  # not an option: clamps to the first
    assert S.clamp_step(state, [3, 5, 9]) == 3


def test_error_message_names_the_failing_pattern_and_site():
    e = PatternError("batch_linear", "batch_linear", ["linear_1", "linear_3"], ValueError("bad shape"))
    title, msg = S.error_message(e)
    assert title == "Pattern batch_linear (pass batch_linear) raised"
    assert msg == "at linear_1, linear_3: ValueError: bad shape"
    assert S.error_message(RuntimeError("boom")) == ("Unexpected RuntimeError", "boom")
