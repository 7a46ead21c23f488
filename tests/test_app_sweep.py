"""The app's Sweep page (app/sweep_view.py) on a sweep directory, driven with AppTest."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from optimus_lens.sweep.configs import DEFAULT_CONFIG, SweepConfig
from optimus_lens.sweep.driver import sweep
from optimus_lens.sweep.task import SweepOptions

APP = str(Path(__file__).resolve().parent.parent / "app" / "main.py")


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("app_sweep")
    (out / "bad.py").write_text("def broken():\n    raise ValueError('no model here')\n")
    models = ["sample:teach_batch_relu", f"{out / 'bad.py'}:broken"]
    configs = [DEFAULT_CONFIG, SweepConfig("relu-only", passes=("normalization_pass", "batch_relu"))]
    sweep(models, configs, SweepOptions(reports=False), out / "s", workers=2, progress=False)
    return out / "s"


def _page(monkeypatch, sweep_dir) -> AppTest:
    monkeypatch.setenv("OPTIMUS_LENS_SWEEP", str(sweep_dir))  # what `optimus app --sweep DIR` sets
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    assert not at.exception
    return at


def test_the_sweep_page_opens_the_directory_given_and_tables_every_run(monkeypatch, sweep_dir):
    at = _page(monkeypatch, sweep_dir)
    assert at.session_state["page_choice"] == "Sweep"
    table = at.dataframe[0].value
    assert len(table) == 4 and set(table["status"]) == {"ok", "error"}
    assert {
        "model",
        "config",
        "nodes before",
        "nodes after",
        "steps per pattern",
        "first failing step",
        "error",
    } <= set(table.columns)
    assert [m.value for m in at.metric][:3] == ["4", "2", "0"]
    at.multiselect(key="sweep_status").set_value(["error"]).run()
    assert len(at.dataframe[0].value) == 2
    assert "no model here" in at.code[0].value


def test_a_run_opens_in_the_step_viewer(monkeypatch, sweep_dir):
    at = _page(monkeypatch, sweep_dir)
    at.selectbox(key="sweep_run").set_value("sample:teach_batch_relu @ relu-only").run()
    at.button(key="sweep_open").click().run()
    assert not at.exception
    assert at.session_state["page_choice"] == "Step viewer"
    t = at.session_state["trace"]
    assert t.model == "teach_batch_relu" and {s.pass_name for s in t.steps} <= {"normalization_pass", "batch_relu"}
    assert at.session_state["spec"] == "sample:teach_batch_relu"
    assert any("relu-only" in m.value for m in at.markdown)


def test_a_directory_without_results_says_so(monkeypatch, tmp_path):
    at = _page(monkeypatch, tmp_path)
    assert any("not a sweep directory" in e.value for e in at.error)


def test_optimus_app_sweep_opens_the_directory_and_refuses_another(monkeypatch, sweep_dir, tmp_path, capsys):
    from optimus_lens import cli
    from optimus_lens.cli import app as app_command

    seen = {}
    monkeypatch.setattr(app_command.subprocess, "call", lambda cmd, env: seen.update(env=env) or 0)
    assert cli.main(["app", "--sweep", str(sweep_dir), "--headless"]) == 0
    assert seen["env"]["OPTIMUS_LENS_SWEEP"] == str(sweep_dir)
    assert cli.main(["app", "--sweep", str(tmp_path)]) == 2
    assert "not a sweep directory" in capsys.readouterr().err
