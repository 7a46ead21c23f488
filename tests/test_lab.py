"""The Pattern Lab page (AppTest): a valid pattern previews its matches, a syntax error is
shown with its line and blocks the buttons, a raising or looping pattern is reported
while the editor keeps its code, a near miss is explained, and apply records verified
steps that open in the step viewer."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from optimus_lens.app import lab_runner


def _lab_script():
    from optimus_lens.app import lab

    lab.page()


def _app(source: str | None = None, time_limit: float = 120.0, spec: str = "sample:swish_mlp") -> AppTest:
    at = AppTest.from_function(_lab_script, default_timeout=240)
    at.run()
    if source is not None:
        at.session_state["lab_source"] = source
    at.session_state["lab_time_limit"] = time_limit
    at.session_state["lab_spec"] = spec
    at.run()
    return at


def _press(at: AppTest, key: str) -> AppTest:
    at.button(key=key).click().run()
    return at


def _texts(at: AppTest) -> str:
    return "\n".join(m.value for m in [*at.markdown, *at.error, *at.warning, *at.info])


def test_preview_of_the_starter_shows_every_match_and_leaves_the_graph_unchanged():
    at = _press(_app(), "lab_preview")
    assert not at.exception
    text = _texts(at)
    assert "**3 match(es)**, 1 near miss(es)" in text and "the graph is unchanged" in text


def test_a_near_miss_names_the_failed_condition():
    at = _press(_app(), "lab_preview")
    at.selectbox(key="lab_why_node").select("mul_3 (swish)").run()
    assert "does not match at `mul_3`: mul_3.b: h_6 is call_function linear, not sigmoid" in _texts(at)


def test_a_syntax_error_is_shown_with_its_line_and_disables_preview():
    at = _app("import torch\n\ndef pattern(x)\n    return x\n")
    assert any("Syntax error, line 3" in e.value for e in at.error)
    assert at.button(key="lab_preview").disabled and at.button(key="lab_apply").disabled


def test_a_raising_pattern_is_reported_and_the_editor_keeps_its_code():
    src = "def pattern(x):\n    raise RuntimeError('broken on purpose')\n\ndef replacement(x):\n    return x\n"
    at = _press(_app(src), "lab_preview")
    assert not at.exception
    assert any("broken on purpose" in e.value for e in at.error)
    assert at.session_state["lab_source"] == src


def test_a_looping_pattern_is_stopped_at_the_time_limit():
    src = "while True:\n    pass\n"
    at = _press(_app(src, time_limit=3.0), "lab_preview")
    assert any("stopped after 3 s" in e.value for e in at.error)
    assert at.session_state["lab_source"] == src


def test_apply_records_verified_steps_and_opens_them_in_the_step_viewer():
    at = _press(_app(), "lab_apply")
    assert "**3 step(s)**, 23 → 20 nodes" in _texts(at)
    r = at.session_state["lab_result"]
    assert r.ok and all(s.verify.ok for s in r.trace.steps)
    _press(at, "lab_time")
    rows = at.dataframe[-1].value
    assert list(rows["stage"])[:2] == ["baseline", "swish"]
    _press(at, "lab_open")
    assert at.session_state["trace"] is r.trace and at.session_state["page_choice"] == "Step viewer"


@pytest.mark.parametrize("kind", list(__import__("optimus_lens.app.lab", fromlist=["STARTERS"]).STARTERS))
def test_every_starter_loads_and_matches_on_its_sample(kind):
    from optimus_lens.app.lab import starter

    spec = "sample:teach_batch_sigmoid" if "Batch" in kind else "sample:swish_mlp"
    r = lab_runner.preview(spec, starter(kind), "starter", time_limit_s=120)
    assert r.ok, r.error
    assert len(r.preview.matches) >= 1


def test_the_app_switches_to_the_lab_and_back_to_the_viewer_with_the_applied_trace():
    at = AppTest.from_file("../app/main.py", default_timeout=240)
    at.run()
    at.session_state["page_choice"] = "Pattern Lab"
    at.run()
    assert not at.exception
    assert any("Pattern Lab" in h.value for h in at.subheader)
    at.session_state["lab_time_limit"] = 120.0
    _press(at, "lab_apply")
    _press(at, "lab_open")
    assert not at.exception
    assert at.session_state["page_choice"] == "Step viewer"
    assert "swish_mlp" in "\n".join(m.value for m in at.markdown)
