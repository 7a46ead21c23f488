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

    spec = {"Batch": "sample:teach_batch_sigmoid", "Inductor": "sample:teach_batch_layernorm"}  # layer norm's
    spec = next((v for k, v in spec.items() if k in kind), "sample:swish_mlp")  # ATen: add(mul(x, w), b)
    source = starter(kind)
    r = lab_runner.preview(spec, source, "starter", time_limit_s=120, stage=lab_runner.default_stage(source))
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


# --------------------------------------------------------------------------- what you see is what runs
DOUBLE_RELU = """import torch


def pattern(x):
    return torch.relu(x) * 2


def replacement(x):
    return torch.relu(x + x)
"""
RELUS = """import torch


class FiveRelus(torch.nn.Module):
    def forward(self, a, b, c, d, e):
        return torch.cat([torch.relu(t) * 2 for t in (a, b, c, d, e)], dim=1)


def build():
    torch.manual_seed(0)
    return FiveRelus(), tuple(torch.randn(4, 8) for _ in range(5))
"""


def _editor_text(at: AppTest) -> str:
    """What the code editor on screen shows (the Ace component's text)."""
    import json

    (ace,) = [e for e in at.get("component_instance") if "lab_ace_" in e.proto.id]
    return json.loads(ace.proto.json_args)["defaultValue"]


@pytest.fixture
def relus_model(tmp_path) -> str:
    (tmp_path / "relus.py").write_text(RELUS)
    return f"{tmp_path / 'relus.py'}:build"  # a file.py:factory spec, not a sample


def test_a_loaded_file_shows_in_the_editor_with_its_name_and_preview_runs_exactly_it_on_the_users_model(
    relus_model,
):
    from optimus_lens.app import lab

    at = _app(spec=relus_model)
    assert "x * torch.sigmoid(x)" in _editor_text(at) and at.text_input(key="lab_name").value == "swish"
    assert lab.load_file(at.session_state, "double_relu.py", DOUBLE_RELU.encode())
    at.run()
    assert _editor_text(at) == DOUBLE_RELU and at.text_input(key="lab_name").value == "double_relu"
    assert any("double_relu.py" in m.value and "loaded from double_relu.py" in m.value for m in at.markdown)
    _press(at, "lab_preview")
    assert not at.exception
    assert "**5 match(es)**" in _texts(at)  # the uploaded pattern, on the model in the box
    r = at.session_state["lab_result"]
    assert r.trace.model == relus_model and {m.pattern for m in r.preview.matches} == {"double_relu"}
    assert not lab.load_file(at.session_state, "latin1.py", "x = 'é'\n".encode("latin-1"))
    at.run()
    assert any("not UTF-8" in e.value for e in at.error) and _editor_text(at) == DOUBLE_RELU


def test_a_result_of_other_code_is_marked_stale_and_a_new_failing_apply_clears_the_timing(relus_model):

    at = _app(DOUBLE_RELU, spec=relus_model)
    at.session_state["lab_name"] = "double_relu"
    at.run()
    _press(at, "lab_apply")
    assert "**5 step(s)**" in _texts(at) and not at.button(key="lab_time").disabled
    timing = {
        "stages": [
            {
                "name": "baseline",
                "latency_ms_median": 1.0,
                "latency_ms_p10": 0.9,
                "latency_ms_p90": 1.1,
                "speedup_vs_baseline": 1.0,
                "peak_bytes": 0,
            }
        ]
    }
    at.session_state["lab_bench"] = (at.session_state["lab_ran"], lab_runner.LabResult(True, extra={"bench": timing}))
    at.run()
    assert any(
        "stage" in d.value.columns and "baseline" in list(d.value["stage"]) for d in at.dataframe
    )  # the "Time it" table
    at.session_state["lab_source"] = DOUBLE_RELU + "\n# edited\n"  # the code on screen changes
    at.run()
    assert any(w.value.startswith("**Stale**") for w in at.warning)
    assert at.button(key="lab_open").disabled and at.button(key="lab_time").disabled
    at.session_state["lab_source"] = (
        "def pattern(x):\n    raise RuntimeError('broken on purpose')\n\ndef replacement(x):\n    return x\n"
    )
    at.run()
    _press(at, "lab_apply")
    assert any("broken on purpose" in e.value for e in at.error)
    assert not any("stage" in d.value.columns for d in at.dataframe)  # no timing of other code left on screen
    assert not any(w.value.startswith("**Stale**") for w in at.warning)


def test_open_in_the_step_viewer_carries_the_model_and_the_pattern_and_why_not_includes_it(relus_model):
    from optimus_lens.app import state as S
    from optimus_lens.app.toggles import USE_PATTERN

    at = AppTest.from_file("../app/main.py", default_timeout=240).run()
    at.session_state["page_choice"] = "Pattern Lab"
    at.run()
    at.text_input(key="lab_spec").input(relus_model).run()
    for k, v in {"lab_source": DOUBLE_RELU, "lab_name": "double_relu", "lab_time_limit": 120.0}.items():
        at.session_state[k] = v
    at.run()
    _press(at, "lab_apply")
    _press(at, "lab_open")
    assert not at.exception, [e.value for e in at.exception]
    ss = at.session_state
    assert ss["page_choice"] == "Step viewer" and ss["spec"] == relus_model
    assert at.radio(key="source_kind").value == S.FACTORY and at.text_input(key="factory").value == relus_model
    assert at.checkbox(key=USE_PATTERN).value is True and "double_relu" in at.checkbox(key=USE_PATTERN).label
    assert not any(c.value for c in at.checkbox if c.key and c.key.startswith("pass:"))  # the trace's passes
    assert not any("passes changed" in w.value for w in at.warning)  # the sidebar is what made the trace
    ss["why_panel"], ss["why_node"] = True, "mul"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert any(s.value.startswith("**double_relu** applies here: rewrites at step") for s in at.success)
    assert any("your pattern double_relu included" in c.value for c in at.caption)
    next(b for b in at.button if b.label == "Run").click().run()  # Run runs it again, the pattern included
    t = ss["trace"]
    assert t.model == relus_model and [s.pattern for s in t.steps] == ["double_relu"] * 5
    assert "your pattern double_relu.py" in ss["source"]
