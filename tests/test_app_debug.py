"""App step tools (app/toggles.py, app/upstream.py, app/debug.py) driven headless with AppTest: pass
toggles that keep their panel and mark the view stale, the nearest step after a re-run, PyTorch
Inductor's passes as a source, the code diff and the repro download."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest
from test_observe import HELD_IN  # the held-in input, as a factory file

from optimus_lens.app import toggles
from optimus_lens.frontend.run import optimize

APP = str(Path(__file__).resolve().parent.parent / "app" / "main.py")
TIMEOUT = 180


def fresh() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def click_run(at: AppTest) -> AppTest:
    [b for b in at.button if b.label == "Run"][0].click().run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def heading(at: AppTest) -> str:
    return next(m.value for m in at.markdown if m.value.startswith("#### Step "))


def warnings(at: AppTest) -> list[str]:
    return [w.value for w in at.warning]


@pytest.fixture(scope="module")
def towers():
    return optimize("sample:recsys_towers", verify="off").trace


def test_nearest_step_prefers_the_same_pass_then_the_closest_index(towers):
    relu = [s.index for s in towers.steps if s.pass_name == "batch_relu"]
    assert toggles.nearest_step(towers, "batch_relu", relu[-1] + 3) == relu[-1]
    assert toggles.nearest_step(towers, "batch_relu", 1) == relu[0]
    assert toggles.nearest_step(towers, "no_such_pass", 99) == len(towers.steps)
    assert toggles.is_stale(towers, toggles.OURS, toggles.trace_passes(towers)) is False
    assert toggles.is_stale(towers, toggles.OURS, toggles.trace_passes(towers)[1:]) is True
    assert toggles.is_stale(towers, toggles.INDUCTOR, toggles.trace_passes(towers)) is True


def test_toggling_a_pass_keeps_the_panel_marks_the_view_stale_and_a_rerun_stays_on_the_same_pass():
    at = click_run(fresh())
    relu = [s.index for s in at.session_state["trace"].steps if s.pass_name == "batch_relu"]
    at.session_state["cur_step"] = relu[-1]
    at.run()
    labels = [e.label for e in at.expander]
    assert "Passes" in labels and not any(toggles.STALE in w for w in warnings(at))
    assert "pass `batch_relu`" in heading(at)
    at.checkbox(key="pass:batch_linear").uncheck().run()
    assert [e.label for e in at.expander] == labels  # same label: the panel stays open
    assert any(toggles.STALE in w for w in warnings(at))
    assert "pass `batch_relu`" in heading(at)  # still the old trace until Run
    click_run(at)
    assert not any(toggles.STALE in w for w in warnings(at))
    t = at.session_state["trace"]
    assert "batch_linear" not in {s.pass_name for s in t.steps}
    assert "pass `batch_relu`" in heading(at)  # the nearest step of the same pass
    assert t.step(at.session_state["cur_step"]).pass_name == "batch_relu"


def test_inductor_source_flags_the_upstream_defect_with_code_diff_and_repro(tmp_path):
    (tmp_path / "held_in.py").write_text(HELD_IN)
    at = fresh()
    at.radio(key="source_kind").set_value("Python factory").run()
    at.text_input(key="factory").input(f"{tmp_path / 'held_in.py'}:build").run()
    at.radio(key="pass_source").set_value(toggles.INDUCTOR).run()
    at.multiselect(key="upstream_passes").set_value(["batch_layernorm"]).run()
    click_run(at)
    t = at.session_state["trace"]
    assert t.capture["upstream"] and t.step(1).pattern == "BatchLayernormFusion"
    assert any("Upstream defect" in e.value and "BatchLayernormFusion" in e.value for e in at.error)
    assert "BatchLayernormFusion" in heading(at)
    assert not [c for c in at.code if c.language == "diff"]  # computed only once its expander is open
    at.session_state["code_diff_panel"] = True
    at.run()
    (diff,) = [c for c in at.code if c.language == "diff"]
    assert diff.value.startswith("--- before step 1") and "# <- created" in diff.value
    assert "# <- site" in diff.value
    repro = at.get("download_button")
    assert any("Download repro of step 1" in str(b.proto.label) for b in repro)
    at.radio(key="pass_source").set_value(toggles.OURS).run()
    assert any(toggles.STALE in w for w in warnings(at))


def held_in_app(tmp_path) -> AppTest:
    (tmp_path / "held_in.py").write_text(HELD_IN)
    at = fresh()
    at.radio(key="source_kind").set_value("Python factory").run()
    at.text_input(key="factory").input(f"{tmp_path / 'held_in.py'}:build").run()
    return at


def button(at: AppTest, key: str):
    return next(b for b in at.button if b.key == key)


@pytest.fixture
def broken_pipeline(monkeypatch):
    """The app's pipeline with a deliberately wrong pass (relu -> sigmoid) before the
    split/cat cleanup: our own passes keep every held-in input right, so a failing step
    has to be planted. Returns the wrong pass's first step in recsys_towers' run."""
    import streamlit as st
    from test_bisect import with_broken_pass

    import optimus_lens.passes

    monkeypatch.setattr(optimus_lens.passes, "default_pipeline", lambda **kw: with_broken_pass())
    st.cache_resource.clear()  # the app caches its pipeline
    t = optimize("sample:recsys_towers", verify="step", pipeline=with_broken_pass()).trace
    yield t.failed_steps()[0].index
    st.cache_resource.clear()


def test_bisect_button_finds_the_failing_step_of_an_unverified_run_and_jumps_to_it(broken_pipeline):
    at = click_run(fresh())  # verify once at the end: it fails
    t = at.session_state["trace"]
    assert t.final_verify.ok is False and not t.failed_steps()
    button(at, "bisect_btn").click().run()
    assert not at.exception, [e.value for e in at.exception]
    msg = next(e.value for e in at.error if e.value.startswith("Bisect:"))
    assert f"the first failing step is {broken_pipeline} (broken / relu_as_sigmoid_bisect)" in msg
    button(at, "jump_bisect").click().run()
    assert heading(at).startswith(f"#### Step {broken_pipeline}: `relu_as_sigmoid_bisect`")


def test_with_verify_on_the_first_failing_step_is_one_click_away(broken_pipeline):
    at = fresh()
    at.radio(key="verify").set_value("step").run()
    click_run(at)
    assert heading(at).startswith("#### Step 1:")
    button(at, "jump_failing").click().run()
    assert heading(at).startswith(f"#### Step {broken_pipeline}: `relu_as_sigmoid_bisect`")


def test_compare_view_shows_both_runs_and_flags_the_upstream_defect(tmp_path):
    at = click_run(held_in_app(tmp_path))
    button(at, "compare_btn").click().run()
    assert not at.exception, [e.value for e in at.exception]
    errors = [e.value for e in at.error]
    assert any(e.startswith("**Upstream defect** — upstream step") and "BatchLayernormFusion" in e for e in errors)
    assert not any(e.startswith("**Our defect**") for e in errors)  # ours keeps the views' strides
    table = next(d.value for d in at.dataframe if "same groups" in d.value.columns)
    row = table[table["pass"] == "batch_layernorm"].iloc[0]
    assert (row["ours"], row["upstream"], bool(row["same groups"])) == (1, 1, True)
    c = at.session_state["comparison"][1]
    assert [m.value for m in at.metric][-3:] == [str(n) for n in c.nodes] and c.nodes[0] == 29


def test_inspector_finds_a_node_follows_its_inputs_and_keeps_it_across_steps():
    at = click_run(fresh())
    t = at.session_state["trace"]
    fuse = next(s for s in t.steps if s.pattern == "batch_layernorm")
    at.session_state["cur_step"] = fuse.index
    at.run()
    at.radio(key="inspect_side").set_value("before").run()
    at.text_input(key="inspect_query").input("layer_norm_3").run()
    assert at.selectbox(key="inspect_pick").value == "layer_norm_3"
    text = "\n".join(m.value for m in at.markdown)
    assert "**`layer_norm_3`** = `call_function` `torch.nn.functional.layer_norm`" in text
    assert "towers.3.norm (LayerNorm)" in text and f"erased at step {fuse.index} (batch_layernorm" in text
    assert any("self.norm(" in c.value for c in at.code if c.language == "python")
    button(at, "inspect_in:relu_7").click().run()  # an input: select it
    assert at.selectbox(key="inspect_pick").value == "relu_7"
    at.session_state["cur_step"] = fuse.index - 1  # relu_7 still exists one step earlier
    at.run()
    assert at.selectbox(key="inspect_pick").value == "relu_7"
    assert not at.exception


def test_a_pt2_exported_program_runs_from_the_factory_field(tmp_path):
    import torch

    from optimus_lens.frontend.run import load_model

    at = held_in_app(tmp_path)

    model, inputs, _ = load_model(f"{tmp_path / 'held_in.py'}:build")
    torch.export.save(torch.export.export(model, inputs), tmp_path / "held_in.pt2")
    at.text_input(key="factory").input(str(tmp_path / "held_in.pt2")).run()
    click_run(at)
    t = at.session_state["trace"]
    assert t.model == "held_in.pt2" and "batch_layernorm" in {s.pass_name for s in t.steps}
