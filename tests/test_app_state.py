"""One session state for the whole app (app/state.py): what the user sets survives every page
switch and rerun, and Run runs what the sidebar shows. Checked on the source of every page
(each setting's widget keeps its value for the session and takes its first value from
``state.init``) and by walking the app with AppTest: default model -> own factory -> Teach ->
back -> Run runs the user's model."""

from __future__ import annotations

import ast
from pathlib import Path

import torch
from streamlit.testing.v1 import AppTest

from optimus_lens.app import state as S
from optimus_lens.passes import default_pipeline

REPO = Path(__file__).resolve().parent.parent
APP = str(REPO / "app" / "main.py")
TIMEOUT = 240
HERE = Path(__file__).resolve()

#: input widgets whose value is a setting of the user's
WIDGETS = {
    "radio",
    "selectbox",
    "multiselect",
    "checkbox",
    "toggle",
    "text_input",
    "text_area",
    "number_input",
    "slider",
    "select_slider",
}
#: widget keys whose value the code sets before every draw, or whose options are the result on
#: screen (a step, a node, a near miss): not settings to keep
TRANSIENT = {
    "step_slider",
    "presentation_switch",
    "presentation_nav",
    "unfold_pick",
    "graph_pick",
    "inspect_pick",
    "why_near",
    "lab_why_node",
    "lab_graph_pick",
    "lab_sample_pick",
    "sweep_run",
}
#: kept settings whose first value the code gives where the options are known (pipeline passes,
#: upstream's options, a carried pattern's toggle), or computed in state.init
COMPUTED = {"sample", "hops", "teach_pattern", "bench_one_thread", "sweep_dir", "upstream_passes", "use_pattern"}


class _FiveRelus(torch.nn.Module):
    def forward(self, a, b, c, d, e):
        return torch.cat([torch.relu(t) for t in (a, b, c, d, e)], dim=1)


def five_relus():
    """Factory: five independent same-shape relus (one batch_relu group)."""
    return _FiveRelus(), tuple(torch.randn(4, 8) for _ in range(5))


FACTORY = f"{HERE}:five_relus"


def _widget_calls():
    """(file, widget kind, key text, call) for every keyed input widget of the app."""
    for path in sorted((REPO / "app").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr not in WIDGETS:
                continue
            kw = {k.arg: k.value for k in node.keywords}
            if "key" not in kw:
                continue
            for text in _keys(path, kw["key"]):
                yield path.name, node.func.attr, text, node, kw


#: keys passed in as a function's parameter: the keys the callers pass
PARAM_KEYS = {
    ("teach.py", "key"): ["teach_frame", "teach_dep_frame"],
    ("presentation.py", "widget_key"): ["presentation_switch", "presentation_nav"],
}


def _keys(path: Path, key: ast.expr) -> list[str]:
    """The widget key(s) an expression names: a literal, an f-string ("pass:{}"), a module
    constant of the page (read from the module), or a parameter (:data:`PARAM_KEYS`)."""
    import importlib

    if isinstance(key, ast.Constant):
        return [key.value]
    if isinstance(key, ast.JoinedStr):
        return ["".join(v.value if isinstance(v, ast.Constant) else "{}" for v in key.values)]
    if isinstance(key, ast.Name):
        if (path.name, key.id) in PARAM_KEYS:
            return PARAM_KEYS[(path.name, key.id)]
        module = importlib.import_module(f"optimus_lens.app.{path.stem}")
        return [getattr(module, key.id)]
    raise AssertionError(f"{path.name}: cannot read the widget key {ast.unparse(key)}")


def test_every_setting_widget_keeps_its_value_for_the_session_and_has_its_first_value_in_state_init():
    seen, bad = set(), []
    for file, kind, key, call, kw in _widget_calls():
        if key in TRANSIENT or key.startswith("lab_textarea_"):
            continue
        seen.add(key)
        persist = kw.get("persist_state")
        if persist is None or ast.unparse(persist) not in ("S.KEEP", "KEEP"):
            bad.append(f"{file}: {kind} {key!r} does not pass persist_state=KEEP")
        own = [k for k in ("value", "index", "default") if k in kw]
        if own or (kind in ("number_input", "slider") and len(call.args) > 3):
            bad.append(f"{file}: {kind} {key!r} gives its own first value ({', '.join(own) or 'positional'})")
        known = key in S.SETTINGS or key in COMPUTED or key.startswith("pass:")
        if not known:
            bad.append(f"{file}: {kind} {key!r} has no first value in state.SETTINGS")
    assert not bad, "\n".join(bad)
    # the walk below covers the step viewer's sidebar, view options and timing, the Teach page
    assert {"source_kind", "factory", "verify", "picture", "text_size", "bench_one_thread", "teach_pattern"} <= seen


def _fresh() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _go(at: AppTest, page: str) -> AppTest:
    at.session_state[S.PAGE] = page
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _run(at: AppTest) -> AppTest:
    next(b for b in at.button if b.label == "Run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_first_values_are_what_the_widgets_show_on_a_fresh_session(caplog):
    at = _fresh()
    assert at.radio(key="source_kind").value == S.SAMPLE and at.selectbox(key="sample").value == "recsys_towers"
    assert at.radio(key="verify").value == "end" and at.selectbox(key="capture_method").value == "dynamo"
    assert all(c.value for c in at.checkbox if c.key and c.key.startswith("pass:"))
    assert not [r for r in caplog.records if "also had its value set" in r.getMessage()]  # no value set twice
    n = len(default_pipeline().passes)
    assert any(c.value == f"{n} of {n} Optimus Lens passes on" for c in at.caption)
    at.radio(key="pass_source").set_value("PyTorch Inductor passes").run()
    from optimus_lens.inductor.observe import default_options, known_pre_grad_passes

    up = f"{len(default_options())} of {len(known_pre_grad_passes())} upstream pre_grad_fusion_options on"
    assert any(c.value == up for c in at.caption)  # whose count it is, never ours against upstream's


def test_a_new_users_walk_default_model_own_factory_teach_and_back_runs_the_users_model():
    at = _fresh()
    assert any("Runs `sample:recsys_towers`" in c.value for c in at.caption)  # Run says what it runs
    at.radio(key="source_kind").set_value(S.FACTORY).run()
    at.text_input(key="factory").input(FACTORY).run()
    at.checkbox(key="pass:batch_linear").uncheck().run()
    at.radio(key="verify").set_value("step").run()
    _go(at, S.TEACH)
    assert at.session_state["teach_pattern"] == "batch_linear" and len(at.get("iframe")) == 1
    at.selectbox(key="teach_pattern").set_value("batch_relu").run()
    _go(at, S.VIEWER)
    assert at.radio(key="source_kind").value == S.FACTORY
    assert at.text_input(key="factory").value == FACTORY
    assert at.checkbox(key="pass:batch_linear").value is False and at.radio(key="verify").value == "step"
    on = len(default_pipeline().passes) - 1
    assert any(f"Runs `{FACTORY}` — {on} passes, verify after each rewrite" in c.value for c in at.caption)
    _run(at)
    t = at.session_state["trace"]
    assert t.model == FACTORY and [s.pattern for s in t.steps][0] == "batch_relu"  # the user's model ran
    assert "batch_linear" not in {p["name"] for p in t.passes if p.get("enabled", True)}
    assert all(s.verify is not None and s.verify.ok for s in t.steps)  # verified after each rewrite
    _go(at, S.TEACH)  # and the Teach page kept its own choice
    assert at.selectbox(key="teach_pattern").value == "batch_relu"


def test_view_options_step_and_selection_survive_a_trip_to_the_lab():
    at = _fresh()
    at.radio(key="source_kind").set_value(S.FACTORY).run()
    at.text_input(key="factory").input(FACTORY).run()
    _run(at)
    n = len(at.session_state["trace"].steps)
    at.radio(key="picture").set_value("Stacked").run()
    at.select_slider(key="text_size").set_value("large").run()
    at.number_input(key="hops").set_value(4).run()
    cpu = not torch.cuda.is_available()
    assert at.checkbox(key="bench_one_thread").value is cpu  # on CPU the tight-spread mode, and it says so
    assert not cpu or any("one thread, timed by the thread's CPU time — the default" in c.value for c in at.caption)
    at.checkbox(key="bench_one_thread").uncheck().run()
    at.session_state["cur_step"] = n
    at.session_state["inspect_node"] = "relu"
    at.run()
    _go(at, S.LAB)
    _go(at, S.VIEWER)
    assert at.radio(key="picture").value == "Stacked" and at.select_slider(key="text_size").value == "large"
    assert at.number_input(key="hops").value == 4 and at.checkbox(key="bench_one_thread").value is False
    assert at.session_state["cur_step"] == n and at.session_state["inspect_node"] == "relu"
    assert at.session_state["trace"].model == FACTORY


def test_the_step_viewers_sidebar_names_the_model_optimus_app_was_started_on(monkeypatch):
    monkeypatch.setenv(S.MODEL_ENV, FACTORY)  # `optimus app --model FILE.py:factory`
    at = _fresh()
    assert at.radio(key="source_kind").value == S.FACTORY and at.text_input(key="factory").value == FACTORY
    assert S.sidebar_model("sample:mmoe") == {"source_kind": S.SAMPLE, "sample": "mmoe"}
    assert S.sidebar_model("hf:bert") == {"source_kind": S.FACTORY, "factory": "hf:bert"}
