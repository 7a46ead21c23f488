"""Inductor-language pattern files in the Pattern Lab and on the CLI's post-grad stage: the
Lab previews a register_replacement file on the forward ATen graph (stage "auto" follows the
file), explains its near miss and draws the best partial match with the pattern's own graph;
a search function that cannot be re-traced with the matched shapes, or not traced at all, is
a specific message in the Lab and on the CLI; a register_graph_pattern file matching the
backward graph of a training run previews and applies there, verified."""

from __future__ import annotations

import json

import pytest
from streamlit.testing.v1 import AppTest

from optimus_lens.app import lab_runner
from optimus_lens.cli import main

MODELS = """
import torch


class Gate(torch.nn.Module):
    def forward(self, x, g, b):
        return torch.relu(b + x * g)


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.fc(x)).sum(dim=1)


def gate():
    return Gate(), (torch.randn(8, 16), torch.randn(8, 16), torch.randn(8, 16))


def mlp():
    torch.manual_seed(0)
    return Mlp(), (torch.randn(4, 8),)
"""

RETRACE = """
import torch
from torch._inductor.pattern_matcher import PatternMatcherPass, fwd_only, register_replacement

addcmul_pass = PatternMatcherPass(pass_name="addcmul_fusion")


def add_mul(x, y, z):
    if x.shape[0] != 4:
        raise RuntimeError(f"add_mul only traces for 4 rows, not {x.shape[0]}")
    return z + x * y


def addcmul(x, y, z):
    return torch.addcmul(z, x, y)


register_replacement(add_mul, addcmul, [torch.empty(4, 4) for _ in range(3)], fwd_only, addcmul_pass)
"""

UNTRACEABLE = """
import torch
from torch._inductor.pattern_matcher import PatternMatcherPass, fwd_only, register_replacement

p = PatternMatcherPass()


def broken(x, y):
    return torch.ops.aten.mm.default(x, y, y)


register_replacement(broken, lambda x, y: x, [torch.empty(4, 4), torch.empty(4, 4)], fwd_only, p)
"""

BIAS_GRAD = """
import torch
from torch._inductor.pattern_matcher import CallFunction, KeywordArg, PatternMatcherPass, register_graph_pattern

aten = torch.ops.aten
bias_grad_pass = PatternMatcherPass(pass_name="bias_grad")


def to_one_row(match):
    return list(match.kwargs["shape"]) == [match.kwargs["g"].meta["val"].shape[1]]


@register_graph_pattern(
    CallFunction(
        aten.reshape.default, CallFunction(aten.sum.dim_IntList, KeywordArg("g"), [0], True), KeywordArg("shape")
    ),
    extra_check=to_one_row,
    pass_dict=bias_grad_pass,
)
def sum_keepdim_reshape(match, g, shape):
    match.replace_by_example(lambda g: torch.sum(g, [0]), [g])
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("lab_inductor")
    out = {}
    for name, text in [("models", MODELS), ("retrace", RETRACE), ("untraceable", UNTRACEABLE), ("bias", BIAS_GRAD)]:
        (d / f"{name}.py").write_text(text)
        out[name] = str(d / f"{name}.py")
    return out


def _lab_script():
    from optimus_lens.app import lab

    lab.page()


def _lab(source: str, spec: str) -> AppTest:
    at = AppTest.from_function(_lab_script, default_timeout=240)
    at.run()
    at.session_state["lab_source"], at.session_state["lab_spec"] = source, spec
    at.session_state["lab_time_limit"] = 120.0
    at.run()
    return at


def _texts(at: AppTest) -> str:
    return "\n".join(m.value for m in [*at.markdown, *at.error, *at.warning, *at.info, *at.caption])


def test_the_lab_previews_an_inductor_file_post_grad_and_draws_its_best_partial_match_with_the_pattern(files):
    from optimus_lens.app.lab import STARTERS, starter

    kind = next(k for k in STARTERS if "Inductor" in k)
    at = _lab(starter(kind), f"{files['models']}:gate")
    assert "auto: post-grad" in at.selectbox(key="lab_stage").format_func("auto")  # the file's stage by default
    at.button(key="lab_preview").click().run()
    assert not at.exception, [e.value for e in at.exception]
    r = at.session_state["lab_result"]
    assert r.ok and r.stage == "post-grad" and list(r.previews) == ["forward"]
    text = _texts(at)
    assert "**0 match(es)**, 1 near miss(es) in the forward graph (ATen)" in text
    assert "near miss that got furthest" in text  # nothing matches: the furthest attempt is drawn
    assert "does not match at `add`: add.self: expected aten.mul.Tensor, found the graph input arg2_1" in text
    (miss,) = r.preview.near_misses
    assert miss.stopped == "arg2_1" and miss.pattern_stopped == "mul"  # where it stopped, in both graphs
    (info,) = r.patterns
    assert info.form == "register_replacement" and {"x", "y", "z", "mul", "add"} <= set(info.graph.nodes)
    assert any("The pattern `mul_add`" in m.value for m in at.markdown)  # drawn beside the model graph


def test_choosing_pre_grad_runs_the_file_there_and_marks_the_post_grad_result_stale(files):
    from optimus_lens.app.lab import STARTERS, starter

    at = _lab(starter(next(k for k in STARTERS if "Inductor" in k)), f"{files['models']}:gate")
    at.button(key="lab_preview").click().run()
    at.selectbox(key="lab_stage").select("pre-grad").run()
    assert any(w.value.startswith("**Stale**") for w in at.warning)
    at.button(key="lab_preview").click().run()
    r = at.session_state["lab_result"]
    assert r.ok and r.stage == "pre-grad" and list(r.previews) == ["pre-grad"]
    assert not r.preview.matches  # fwd_only traced ATen ops: nothing to match on the Dynamo graph


def test_a_search_function_that_cannot_be_re_traced_is_named_in_the_lab_and_on_the_cli(files, capsys):
    spec = f"{files['models']}:gate"
    at = _lab(RETRACE, spec)
    at.button(key="lab_preview").click().run()
    assert not at.exception
    errors = [e.value for e in at.error]
    assert any(
        e.startswith("**The search function could not be re-traced** at 1 match(es) (add)")
        and "add_mul only traces for 4 rows, not 8" in e
        for e in errors
    ), errors
    assert at.session_state["lab_source"] == RETRACE  # the editor keeps the code
    assert main(["match", spec, "--pattern-file", files["retrace"], "--stage", "post-grad"]) == 0
    out = capsys.readouterr().out
    assert "no match at add: re-tracing add_mul with the matched shapes failed (RuntimeError: add_mul only" in out


def test_a_search_function_that_does_not_trace_at_all_is_a_load_error_naming_it(files, capsys):
    spec = f"{files['models']}:gate"
    assert main(["match", spec, "--pattern-file", files["untraceable"], "--stage", "post-grad"]) == 2
    err = capsys.readouterr().err
    assert "register_replacement could not trace the search function broken with its example inputs" in err
    at = _lab(UNTRACEABLE, spec)
    at.button(key="lab_preview").click().run()
    assert any(
        "could not be loaded" in e.value and "could not trace the search function broken" in e.value for e in at.error
    )
    assert at.session_state["lab_source"] == UNTRACEABLE


def test_a_graph_pattern_on_the_backward_graph_previews_and_applies_verified(files, tmp_path):
    spec = f"{files['models']}:mlp"
    r = lab_runner.preview(spec, BIAS_GRAD, "bias", time_limit_s=120, stage="post-grad", mode="training")
    assert r.ok, r.error
    assert list(r.previews) == ["forward", "backward"] and not r.previews["forward"].matches
    (m,) = r.previews["backward"].matches
    assert m.pattern == "sum_keepdim_reshape" and m.bindings == {"g": "where", "shape": "[8]"}
    a = lab_runner.apply(spec, BIAS_GRAD, "bias", time_limit_s=120, stage="post-grad", mode="training")
    assert a.ok, a.error
    (step,) = a.trace.all_steps()  # the file's stem stands for its passes (--passes bias)
    assert step.graph == "backward" and step.pass_name == "bias_grad" and step.verify.ok
    out = tmp_path / "m.json"
    args = ["match", spec, "--pattern-file", files["bias"], "--stage", "post-grad", "--mode", "training"]
    assert main([*args, "--json", str(out), "--draw", str(tmp_path / "m.html")]) == 0
    doc = json.loads(out.read_text())
    assert [len(g["matches"]) for g in doc["graphs"].values()] == [0, 1]
    assert doc["patterns"][0]["form"] == "register_graph_pattern" and doc["patterns"][0]["graph"]
    page = (tmp_path / "m.html").read_text()
    assert "backward graph" in page and page.count("<iframe") >= 2


ADD_MUL = """

def add_mul(x, y, z):  # z + x * y traces to add(z, mul(x, y))
    return z + x * y


register_replacement(add_mul, addcmul, [torch.empty(4, 4) for _ in range(3)], fwd_only, addcmul_pass)
"""


def test_why_not_runs_on_the_stage_it_is_given_with_the_files_stem_for_its_passes(files):
    from optimus_lens.app.lab import STARTERS, starter

    source = starter(next(k for k in STARTERS if "Inductor" in k)) + ADD_MUL
    spec = f"{files['models']}:gate"
    r = lab_runner.why(spec, source, "addcmul", "forward:add", passes=["addcmul"], stage="post-grad", time_limit_s=120)
    assert r.ok, r.error
    verdicts = {v.pattern: v for v in r.extra["why"].verdicts}
    assert set(verdicts) == {"mul_add", "add_mul"}  # --passes addcmul: the file's passes alone
    assert verdicts["add_mul"].applies and verdicts["add_mul"].pass_name == "addcmul_fusion"
    pre = lab_runner.why(spec, source, "addcmul", "add", passes=["addcmul"], time_limit_s=120)
    assert pre.ok and not any(v.applies for v in pre.extra["why"].verdicts)  # fwd_only: ATen ops, no match pre-grad


def test_a_post_grad_result_opens_in_the_step_viewer_on_its_aten_graph_with_the_files_passes(files):
    from optimus_lens.app.lab import STARTERS, starter
    from optimus_lens.app.toggles import USE_PATTERN
    from optimus_lens.passes.post_grad import post_grad_pipeline

    spec = f"{files['models']}:gate"
    at = AppTest.from_file("../app/main.py", default_timeout=240).run()
    at.session_state["page_choice"] = "Pattern Lab"
    at.run()
    kind = next(k for k in STARTERS if "Inductor" in k)
    at.selectbox(key="lab_starter_kind").select(kind).run()
    at.button(key="lab_load_starter").click().run()
    assert at.session_state["lab_name"] == "addcmul"  # a starter names the pattern (docs: addcmul.py)
    source = starter(kind) + ADD_MUL
    for k, v in {"lab_source": source, "lab_spec": spec, "lab_time_limit": 120.0}.items():
        at.session_state[k] = v
    at.run()
    at.button(key="lab_apply").click().run()
    assert "**1 step(s)** (forward: 1 step(s), 7 → 6 nodes)" in _texts(at)
    at.button(key="lab_time").click().run()  # timed on the stage it ran on: the ATen graph
    assert list(at.dataframe[-1].value["stage"]) == ["post:baseline", "post:addcmul_fusion"]
    at.button(key="lab_open").click().run()
    assert not at.exception, [e.value for e in at.exception]
    ss = at.session_state
    assert ss["page_choice"] == "Step viewer" and ss["spec"] == spec
    assert (ss["run_stage"], ss["run_mode"]) == ("post-grad", "inference")
    assert ss["view_graph"] == "forward" and ss["cur_step"] == 1  # opens on the graph with the step
    assert at.radio(key="view_graph").value == "forward"
    assert ss["pattern"]["passes"] == ["addcmul_fusion"]  # the file's PatternMatcherPass, not its stem
    assert at.checkbox(key=USE_PATTERN).value is True and "addcmul" in at.checkbox(key=USE_PATTERN).label
    assert "pass:addcmul_fusion" not in ss  # no stray toggle named after the pattern's pass
    post = {f"pass:{n}" for n in post_grad_pipeline().names()}
    ticks = {c.key: c.value for c in at.checkbox if c.key in post}
    assert set(ticks) == post and not any(ticks.values())  # the post-grad panel: the run's, none on
    assert not any("changed" in w.value for w in at.warning), [w.value for w in at.warning]  # nothing stale
    assert any("add_mul" in m.value and "addcmul_fusion" in m.value for m in at.markdown)  # the step on screen
    assert any("pre-grad 7 → 7 nodes in 0 steps; forward 7 → 6 nodes in 1 step " in m.value for m in at.markdown)
    assert any("1 post-grad passes (the last: your pattern addcmul" in c.value for c in at.caption)
    ss["why_panel"], ss["why_node"] = True, "add"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert any(s.value.startswith("**add_mul** applies here") for s in at.success), [s.value for s in at.success]
    next(b for b in at.button if b.label == "Run").click().run()  # Run: the same stage, the pattern included
    assert not at.exception, [e.value for e in at.exception]
    t = ss["trace"]
    assert t.capture["stage"] == "post-grad" and [s.pattern for s in t.all_steps()] == ["add_mul"]
    assert ss["view_graph"] == "forward" and not any("changed" in w.value for w in at.warning)
