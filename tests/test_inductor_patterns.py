"""Pattern files in Inductor's own language (optimus_lens.frontend.inductor_patterns): loading,
preview with near misses named as paths, the recorded run, rollback, and parity with
``PatternMatcherPass.apply`` inside a real ``torch.compile``."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from torch.fx import GraphModule, Node
from torch.fx.node import map_arg

from optimus_lens.cli import main
from optimus_lens.core.engine import Engine, RunOptions, copy_graph_module
from optimus_lens.core.pipeline import Pipeline
from optimus_lens.frontend.capture import capture
from optimus_lens.frontend.patternfile import PatternFileError, load_pattern_file, pipeline_with, preview
from optimus_lens.frontend.postgrad import aten_graphs_of

REPLACEMENT_FILE = """
import torch
from torch._inductor.pattern_matcher import PatternMatcherPass, fwd_only, register_replacement

addcmul_pass = PatternMatcherPass(pass_name="addcmul_fusion")


def mul_add(x, y, z):
    return x * y + z


def addcmul(x, y, z):
    return torch.addcmul(z, x, y)


register_replacement(mul_add, addcmul, [torch.empty(4, 4) for _ in range(3)], fwd_only, addcmul_pass)
"""

GRAPH_FILE = """
import torch
from torch._inductor.pattern_matcher import CallFunction, KeywordArg, PatternMatcherPass, register_graph_pattern

aten = torch.ops.aten
relu_pass = PatternMatcherPass()  # no pass_name: named by its variable


def wide(match):
    return match.kwargs["x"].meta["val"].shape[-1] >= 4


@register_graph_pattern(
    CallFunction(aten.relu.default, CallFunction(aten.relu.default, KeywordArg("x"))),
    extra_check=wide,
    pass_dict=relu_pass,
)
def relu_relu(match, x):
    match.replace_by_example(lambda x: torch.relu(x), [x])
"""

RAISING_FILE = """
import torch
from torch._inductor.pattern_matcher import CallFunction, KeywordArg, PatternMatcherPass, register_graph_pattern

aten = torch.ops.aten
broken = PatternMatcherPass(pass_name="broken")


@register_graph_pattern(CallFunction(aten.relu.default, KeywordArg("x")), pass_dict=broken)
def half_done(match, x):
    match.graph.call_function(aten.neg.default, (x,))
    raise RuntimeError("handler gave up")
"""


MODELS = """
import torch


class MulAdd(torch.nn.Module):
    def forward(self, a, b, c):
        u = a * b + c  # matches
        v = a / b + c  # near miss: a div where the pattern has mul
        return torch.relu(u) + v


class ReluRelu(torch.nn.Module):
    def forward(self, a, b):
        u = torch.relu(torch.relu(a))  # matches
        v = torch.relu(torch.sigmoid(a))  # near miss: sigmoid where the pattern has relu
        w = torch.relu(torch.relu(b))  # refused by extra_check: b is 2 wide
        return u + v, w


def mul_add_model():
    return MulAdd(), (torch.randn(4, 4), torch.randn(4, 4), torch.randn(4, 4))


def relu_relu_model():
    return ReluRelu(), (torch.randn(4, 4), torch.randn(4, 2))
"""
_MODELS: dict = {}
exec(MODELS, _MODELS)  # the same factories in-process and as a model file for the CLI
mul_add_model, relu_relu_model = _MODELS["mul_add_model"], _MODELS["relu_relu_model"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("inductor_patterns")
    out = {}
    for name, text in [("replacement", REPLACEMENT_FILE), ("graph", GRAPH_FILE), ("raising", RAISING_FILE)]:
        (d / f"{name}.py").write_text(text)
        out[name] = str(d / f"{name}.py")
    (d / "models.py").write_text(MODELS)
    out["models"] = str(d / "models.py")
    return out


def forward_graph(factory) -> GraphModule:
    model, inputs = factory()
    c = capture(model, inputs)
    return aten_graphs_of(c.gm, c.example_inputs, "post-grad", "inference").graphs[0].gm


def structure(gm: GraphModule) -> list[str]:
    """The graph's computations, independent of node names and order: each node's key hashes
    its op, target and its inputs' keys (placeholders by position); sorted."""
    key: dict[Node, str] = {}
    placeholders = 0
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            k = f"in{placeholders}"
            placeholders += 1
        else:
            args = map_arg((n.args, dict(n.kwargs)), lambda a: f"#{key[a]}")
            k = hashlib.sha1(f"{n.op}|{n.target}|{args!r}".encode()).hexdigest()[:16]
        key[n] = k
    return sorted(key.values())


def real_inputs(gm: GraphModule) -> tuple:
    torch.manual_seed(0)
    return tuple(torch.randn(n.meta["val"].shape) for n in gm.graph.nodes if n.op == "placeholder")


def inductor_apply(factory, matcher_pass) -> tuple[GraphModule, GraphModule, int]:
    """(the forward graph Inductor handed its post-grad custom pass, that graph after
    ``matcher_pass.apply`` ran on it inside torch.compile, the count apply returned)."""
    seen: dict = {}

    def hook(graph: torch.fx.Graph) -> None:
        seen["before"] = copy_graph_module(graph.owning_module)
        seen["count"] = matcher_pass.apply(graph)
        seen["after"] = copy_graph_module(graph.owning_module)

    model, inputs = factory()
    torch._dynamo.reset()
    with torch._inductor.config.patch(post_grad_custom_pre_pass=hook, fx_graph_cache=False), torch.no_grad():
        torch.compile(model, backend="inductor")(*inputs)
    torch._dynamo.reset()
    return seen["before"], seen["after"], seen["count"]


def our_run(gm: GraphModule, pf, pass_name: str):
    gm = copy_graph_module(gm)
    pipe = pipeline_with(pf, [pass_name], base=Pipeline([]))
    trace = Engine(gm, real_inputs(gm), pipe, RunOptions(verify="step")).run()
    return gm, trace


def test_a_pass_is_named_by_pass_name_else_by_its_variable(files):
    rr, gp = load_pattern_file(files["replacement"]), load_pattern_file(files["graph"])
    assert [n for n, _ in rr.groups] == ["addcmul_fusion"] and [p.name for p in rr.patterns] == ["mul_add"]
    assert [n for n, _ in gp.groups] == ["relu_pass"] and [p.name for p in gp.patterns] == ["relu_relu"]
    line = REPLACEMENT_FILE.splitlines().index(
        next(x for x in REPLACEMENT_FILE.splitlines() if x.startswith("register_"))
    )
    assert rr.patterns[0].source.endswith(f"replacement.py:{line + 1}")  # the register_replacement call
    assert "aten.mul.Tensor" in rr.patterns[0].pattern_text  # what the search function traced to


def test_a_file_with_an_empty_pass_is_refused(tmp_path):
    f = tmp_path / "empty.py"
    f.write_text("from torch._inductor.pattern_matcher import PatternMatcherPass\np = PatternMatcherPass()\n")
    with pytest.raises(PatternFileError, match="hold no patterns"):
        load_pattern_file(f)


def test_preview_names_inductors_failed_match_as_a_path(files):
    gm = forward_graph(mul_add_model)
    found = preview(gm, load_pattern_file(files["replacement"]).patterns)
    (m,) = found.matches
    assert m.bindings == {"x": "arg0_1", "y": "arg1_1", "z": "arg2_1"} and sorted(m.sites) == ["add", "mul"]
    div_miss = next(x for x in found.near_misses if "div" in x.reason)
    assert div_miss.reason.startswith("add.self: expected aten.mul.Tensor, found aten.div.Tensor")
    assert "[Inductor: function_mismatch" in div_miss.reason  # Inductor's own FailedMatch text


def test_preview_reports_extra_check_refusals(files):
    gm = forward_graph(relu_relu_model)
    found = preview(gm, load_pattern_file(files["graph"]).patterns)
    assert len(found.matches) == 1
    reasons = [x.reason for x in found.near_misses]
    assert any(r == "extra_check wide refused the match" for r in reasons), reasons
    assert any(r.startswith("relu.self: expected aten.relu.default, found aten.sigmoid.default") for r in reasons)


@pytest.mark.parametrize(
    ("factory", "file", "pass_name"),
    [(mul_add_model, "replacement", "addcmul_fusion"), (relu_relu_model, "graph", "relu_pass")],
    ids=["register_replacement", "register_graph_pattern"],
)
def test_recorded_run_equals_pattern_matcher_pass_apply_in_torch_compile(files, factory, file, pass_name):
    pf = load_pattern_file(files[file])
    before, after, count = inductor_apply(factory, pf.patterns[0].matcher_pass)
    assert count == 1  # the near misses stay near misses in Inductor too
    ours, trace = our_run(before, pf, pass_name)
    assert len(trace.steps) == count
    assert structure(ours) == structure(after) != structure(before)
    (step,) = trace.steps
    assert step.error is None and step.verify.ok and step.created and step.erased


def test_cli_run_records_one_step_per_replacement(files, tmp_path, capsys):
    out = tmp_path / "run.json"
    spec = f"{files['models']}:mul_add_model"
    args = ["run", spec, "--pattern-file", files["replacement"], "--passes", "addcmul_fusion"]
    assert main([*args, "--stage", "post-grad", "--verify", "step", "--json", str(out)]) == 0
    (fwd,) = json.loads(out.read_text())["graphs"]
    (step,) = fwd["steps"]
    assert (
        step["pattern"] == "mul_add" and step["verify"]["ok"] and any(c.startswith("addcmul") for c in step["created"])
    )


def test_cli_match_prints_bindings_and_near_misses(files, capsys):
    spec = f"{files['models']}:mul_add_model"
    assert main(["match", spec, "--pattern-file", files["replacement"], "--stage", "post-grad"]) == 0
    text = capsys.readouterr().out
    assert "bound: x=arg0_1, y=arg1_1, z=arg2_1" in text
    assert "no match at add_1: add.self: expected aten.mul.Tensor, found aten.div.Tensor" in text


def test_cli_why_gives_the_path_for_one_node(files, capsys):
    spec = f"{files['models']}:mul_add_model"
    args = ["why", spec, "add_1", "--pattern-file", files["replacement"], "--passes", "addcmul_fusion"]
    assert main([*args, "--stage", "post-grad"]) == 0
    assert "add.self: expected aten.mul.Tensor, found aten.div.Tensor" in capsys.readouterr().out


def test_a_handler_that_raises_is_rolled_back(files):
    gm = forward_graph(relu_relu_model)
    before = structure(gm)
    trace = Engine(gm, real_inputs(gm), pipeline_with(load_pattern_file(files["raising"]), base=Pipeline([]))).run()
    assert trace.steps and all(s.error and "handler gave up" in s.error["message"] for s in trace.steps)
    assert structure(gm) == before  # the neg node it made is gone
