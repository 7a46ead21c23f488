"""Tests for the sample_models registry: every model builds, runs, is finite,
deterministic, and traces with torch.compile(fullgraph=True); teaching models
contain the ops they teach."""

from __future__ import annotations

import dataclasses
import inspect
import operator
import os
import subprocess
import sys
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from optimus_lens import sample_models
from optimus_lens.sample_models import REGISTRY, SampleModel, get, names, register

HAS_TRANSFORMERS = True
try:  # only decides whether the realistic models are expected to build
    import transformers  # noqa: F401
except ImportError:
    HAS_TRANSFORMERS = False

REALISTIC_NAMES = ("bert", "gpt2")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _available(name: str) -> bool:
    return HAS_TRANSFORMERS or REGISTRY[name].kind != "realistic"


def _params(kinds=None):
    out = []
    for n in names():
        if kinds is not None and REGISTRY[n].kind not in kinds:
            continue
        marks = () if _available(n) else (pytest.mark.skip(reason="transformers not installed"),)
        out.append(pytest.param(n, marks=marks, id=n))
    return out


def _flat_tensors(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flat_tensors(o)]
    raise TypeError(f"model output must be tensors, got {type(out)}")


# ------------------------------------------------------------------ op matching

OP_TARGETS = {
    # op -> (call_function targets, call_method names)
    "linear": ({torch._C._nn.linear, F.linear}, set()),
    "layer_norm": ({F.layer_norm, torch.layer_norm}, set()),
    "normalize": ({F.normalize}, set()),
    "softmax": ({torch.softmax, F.softmax}, {"softmax"}),
    "mul": ({torch.mul, operator.mul}, {"mul"}),
    "sum": ({torch.sum}, {"sum"}),
    "relu": ({torch.relu, F.relu}, {"relu"}),
    "tanh": ({torch.tanh, F.tanh}, {"tanh"}),
    "sigmoid": ({torch.sigmoid, F.sigmoid}, {"sigmoid"}),
    "detach": ({torch.detach}, {"detach"}),
    "nan_to_num": ({torch.nan_to_num}, {"nan_to_num"}),
    "clamp": ({torch.clamp, torch.clip}, {"clamp", "clip"}),
    "dropout": ({F.dropout, torch.dropout}, set()),
    "addmm": ({torch.addmm}, {"addmm"}),
    "split": ({torch.split, torch.functional.split}, {"split"}),
    "cat": ({torch.cat, torch.concat, torch.concatenate}, set()),
    "unbind": ({torch.unbind}, {"unbind"}),
    "stack": ({torch.stack}, set()),
    "getitem": ({operator.getitem}, set()),
    "reshape": ({torch.reshape}, {"reshape", "view"}),
    "einsum": ({torch.einsum}, set()),
    "matmul": ({torch.matmul, operator.matmul}, {"matmul"}),
}


def op_nodes(gm: torch.fx.GraphModule, op: str) -> list[torch.fx.Node]:
    funcs, methods = OP_TARGETS[op]
    return [
        n
        for n in gm.graph.nodes
        if (n.op == "call_function" and n.target in funcs) or (n.op == "call_method" and n.target in methods)
    ]


def count(gm: torch.fx.GraphModule, op: str) -> int:
    return len(op_nodes(gm, op))


# teaching model -> {op: minimum count in the captured graph}
TEACHING_EXPECTED = {
    "teach_batch_linear": {"linear": 6},
    "teach_batch_linear_lhs": {"linear": 5},
    "teach_batch_layernorm": {"layer_norm": 6},
    "teach_batch_relu": {"relu": 6},
    "teach_batch_tanh": {"tanh": 6},
    "teach_batch_sigmoid": {"sigmoid": 6},
    "teach_batch_detach": {"detach": 6},
    "teach_batch_nan_to_num": {"nan_to_num": 6},
    "teach_batch_clamp": {"clamp": 6},
    "teach_batch_dropout": {"dropout": 6},
    "teach_split_cat": {"split": 2, "cat": 2, "unbind": 1, "stack": 1, "getitem": 5},
    "teach_unbind_stack": {"unbind": 2, "stack": 1, "cat": 1, "getitem": 5},
    "teach_split_size_one": {"split": 2, "getitem": 3},
    "teach_merge_splits": {"split": 2, "cat": 1, "getitem": 5},
    "teach_simplify_split_cat": {"split": 1, "cat": 1, "getitem": 8},
    "teach_cat_of_pieces": {"split": 1, "cat": 1, "getitem": 5},
    "teach_split_cat_to_slices": {"split": 1, "cat": 1, "getitem": 16},
    "teach_split_stack": {"split": 1, "unbind": 1, "stack": 2, "getitem": 24},
    "teach_reshape_split_stack": {"split": 1, "stack": 1, "reshape": 12},
    "teach_einsum": {"einsum": 1},
    "teach_batch_conv1d": {"addmm": 5},
    "teach_batch_matmul": {"matmul": 5},
    "teach_batch_linear_lhs_conv1d": {"addmm": 5},
    "teach_batch_layernorm_variants": {"layer_norm": 20},
    "teach_batch_normalize": {"normalize": 5},
    "teach_batch_softmax": {"softmax": 5},
    "teach_batch_mul": {"mul": 5},
    "teach_batch_sum": {"sum": 5},
    "teach_mul_sum_to_matmul": {"mul": 1, "sum": 1},
    "teach_remove_unbind_stack": {"unbind": 1, "stack": 1, "getitem": 4},
    "teach_remove_stack_unbind": {"stack": 1, "unbind": 1, "getitem": 4},
    "teach_remove_split_cat": {"split": 1, "cat": 1, "getitem": 3},
    "teach_remove_cat_split": {"cat": 1, "split": 1, "getitem": 3},
    "teach_merge_split_squeeze": {"split": 1, "getitem": 4},
    "teach_merge_unbind_stack": {"unbind": 1, "stack": 1, "getitem": 4},
    "teach_normalize_split": {"split": 1, "getitem": 3},
    "teach_normalize_unbind": {"unbind": 1, "getitem": 3},
    "teach_normalize_cat": {"cat": 1},
    "teach_normalize_stack": {"stack": 1},
}

# pointwise teaching models: several spellings of the op must all be present
SPELLINGS = {
    "teach_batch_relu": {
        ("call_function", torch.relu),
        ("call_function", F.relu),
        ("call_method", "relu"),
    },
    "teach_batch_tanh": {("call_function", torch.tanh), ("call_method", "tanh")},
    "teach_batch_sigmoid": {
        ("call_function", torch.sigmoid),
        ("call_function", F.sigmoid),
        ("call_method", "sigmoid"),
    },
    "teach_batch_detach": {("call_function", torch.detach), ("call_method", "detach")},
    "teach_batch_nan_to_num": {
        ("call_function", torch.nan_to_num),
        ("call_method", "nan_to_num"),
    },
}


# --------------------------------------------------------------------- fixtures


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


_GRAPH_CACHE: dict[str, tuple] = {}


def capture(name: str):
    """Build ``name``, compile it with fullgraph=True and a recording backend.

    Returns ``(model, inputs, eager_out, compiled_out, graphs)``; cached per name.
    """
    if name not in _GRAPH_CACHE:
        torch._dynamo.reset()
        graphs: list[torch.fx.GraphModule] = []

        def recording_backend(gm, example_inputs):
            graphs.append(gm)
            return gm.forward

        model, inputs = get(name)
        with torch.no_grad():
            eager = model(*inputs)
            compiled = torch.compile(model, backend=recording_backend, fullgraph=True)(*inputs)
        torch._dynamo.reset()
        _GRAPH_CACHE[name] = (model, inputs, eager, compiled, graphs)
    return _GRAPH_CACHE[name]


# ------------------------------------------------------------------ registry API


def test_registry_contents_and_order():
    expected = [
        "recsys_towers",
        "transformer_block",
        "teach_batch_linear",
        "teach_batch_linear_lhs",
        "teach_batch_layernorm",
        "teach_batch_relu",
        "teach_batch_tanh",
        "teach_batch_sigmoid",
        "teach_batch_detach",
        "teach_batch_nan_to_num",
        "teach_batch_clamp",
        "teach_batch_dropout",
        "teach_split_cat",
        "teach_unbind_stack",
        "teach_split_size_one",
        "teach_merge_splits",
        "teach_simplify_split_cat",
        "teach_cat_of_pieces",
        "teach_split_cat_to_slices",
        "teach_split_stack",
        "teach_reshape_split_stack",
        "teach_einsum",
        "teach_batch_conv1d",
        "teach_batch_matmul",
        "teach_batch_linear_lhs_conv1d",
        "teach_batch_layernorm_variants",
        "teach_batch_normalize",
        "teach_batch_softmax",
        "teach_batch_mul",
        "teach_batch_sum",
        "teach_mul_sum_to_matmul",
        "teach_remove_unbind_stack",
        "teach_remove_stack_unbind",
        "teach_remove_split_cat",
        "teach_remove_cat_split",
        "teach_merge_split_squeeze",
        "teach_merge_unbind_stack",
        "teach_normalize_split",
        "teach_normalize_unbind",
        "teach_normalize_cat",
        "teach_normalize_stack",
        "bert",
        "gpt2",
        "recsys_towers32",
        "mmoe",
        "twin_towers",
        "deepfm",
        "industrial_recsys",
        "swish_mlp",
        "post_grad_sub_alpha",
        "post_grad_uneven_split",
        "post_grad_mixed_dtype_mm",
    ]
    assert names() == expected
    assert list(REGISTRY) == names()
    assert names()[0] == "recsys_towers" == sample_models.DEFAULT
    assert set(TEACHING_EXPECTED) == {n for n in names() if REGISTRY[n].kind == "teaching"}


@pytest.mark.parametrize("name", names())
def test_entry_metadata(name):
    sm = REGISTRY[name]
    assert isinstance(sm, SampleModel)
    assert sm.name == name
    assert sm.kind in ("demo", "teaching", "realistic")
    assert sm.description and "\n" not in sm.description
    assert isinstance(sm.teaches, tuple) and all(isinstance(t, str) for t in sm.teaches)
    if sm.kind == "teaching":
        assert sm.teaches
    assert callable(sm.build)
    assert inspect.getdoc(sm.build), f"{name}: build function needs a docstring"
    with pytest.raises(dataclasses.FrozenInstanceError):
        sm.name = "other"  # type: ignore[misc]


def test_get_unknown_name_lists_valid_names():
    with pytest.raises(KeyError) as info:
        get("no_such_model")
    msg = str(info.value)
    assert "no_such_model" in msg
    for n in names():
        assert n in msg


def test_register_function_and_decorator():
    def build():
        """tiny: input (2, 3) -> output (2, 3)"""
        return torch.nn.Identity().eval(), (torch.zeros(2, 3),)

    try:
        register(SampleModel("_tmp_a", "a", (), build, "demo"))
        register(name="_tmp_b", description="b", kind="teaching", teaches=("x",))(build)

        @register(kind="demo")
        def build__tmp_c():
            """c model: input (2, 3) -> output (2, 3)"""
            return build()

        assert names()[-3:] == ["_tmp_a", "_tmp_b", "_tmp_c"]
        assert REGISTRY["_tmp_c"].description.startswith("c model")
        assert REGISTRY["_tmp_b"].teaches == ("x",)
        with pytest.raises(ValueError):
            register(SampleModel("_tmp_a", "dup", (), build, "demo"))
        with pytest.raises(ValueError):
            SampleModel("_tmp_d", "bad kind", (), build, "nope")
        m, inp = get("_tmp_b")
        assert m(*inp).shape == (2, 3)
    finally:
        for k in ("_tmp_a", "_tmp_b", "_tmp_c"):
            REGISTRY.pop(k, None)


# ------------------------------------------------------------ every model builds


@pytest.mark.parametrize("name", _params())
def test_builds_runs_finite_and_traces(name):
    model, inputs, eager, compiled, graphs = capture(name)
    assert isinstance(model, torch.nn.Module)
    assert not any(m.training for m in model.modules()), "model must be in eval mode"
    for p in list(model.parameters()) + list(model.buffers()):
        assert p.device.type == "cpu"
        if p.is_floating_point():
            assert p.dtype == torch.float32
    assert isinstance(inputs, tuple) and inputs
    assert all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in inputs)
    assert all(t.dtype in (torch.float32, torch.int64) for t in inputs)
    if REGISTRY[name].kind != "realistic":
        assert type(model).__doc__, f"{name}: model class needs a docstring"
    outs = _flat_tensors(eager)
    assert outs
    for t in outs:
        assert t.dtype == torch.float32
        assert torch.isfinite(t).all(), f"{name}: non-finite output"
    # fullgraph=True raises on any graph break, so exactly one graph is captured
    assert len(graphs) == 1
    for a, b in zip(outs, _flat_tensors(compiled)):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", _params(kinds=("demo", "teaching")))
def test_deterministic_and_fresh(name):
    m1, in1 = get(name)
    m2, in2 = get(name)
    assert m1 is not m2
    for a, b in zip(in1, in2):
        torch.testing.assert_close(a, b, equal_nan=True)
    with torch.no_grad():
        for a, b in zip(_flat_tensors(m1(*in1)), _flat_tensors(m2(*in2))):
            assert torch.equal(a, b)


def test_build_does_not_touch_global_rng():
    torch.manual_seed(1234)
    expected = torch.rand(3)
    torch.manual_seed(1234)
    get("recsys_towers")
    assert torch.equal(torch.rand(3), expected)


# ------------------------------------------------------------ graph contents


@pytest.mark.parametrize("name", list(TEACHING_EXPECTED))
def test_teaching_graph_has_taught_ops(name):
    _, _, _, _, (gm,) = capture(name)
    for op, minimum in TEACHING_EXPECTED[name].items():
        assert count(gm, op) >= minimum, f"{name}: {op} x{count(gm, op)} < {minimum}\n{gm.graph}"
    if name.startswith("teach_batch_"):
        op = next(iter(TEACHING_EXPECTED[name]))
        assert count(gm, op) >= 5


@pytest.mark.parametrize("name", list(SPELLINGS))
def test_teaching_graph_has_every_spelling(name):
    _, _, _, _, (gm,) = capture(name)
    seen = {(n.op, n.target) for n in gm.graph.nodes}
    missing = SPELLINGS[name] - seen
    assert not missing, f"{name}: spellings missing from graph: {missing}"


def test_clamp_positional_and_keyword():
    _, _, _, _, (gm,) = capture("teach_batch_clamp")
    nodes = op_nodes(gm, "clamp")
    assert any(len(n.args) == 3 and not n.kwargs for n in nodes)
    assert any(len(n.args) == 1 and set(n.kwargs) == {"min", "max"} for n in nodes)


def test_nan_to_num_positional_and_keyword():
    _, _, _, _, (gm,) = capture("teach_batch_nan_to_num")
    nodes = op_nodes(gm, "nan_to_num")
    assert any(len(n.args) >= 2 for n in nodes)
    assert any("nan" in n.kwargs for n in nodes)
    _, inputs = get("teach_batch_nan_to_num")
    assert not torch.isfinite(inputs[0]).all()  # the example input exercises the op


def test_split_cat_semantics():
    model, (x, w, y), (a, b, c), _, (gm,) = capture("teach_split_cat")
    assert torch.equal(a, 2 * x)  # in-order cat of a split: identity (read by the product)
    assert not torch.equal(b, w)  # reversed uneven split: not an identity
    assert torch.equal(b, torch.cat([w[:, 8:], w[:, 4:8], w[:, :4]], dim=1))
    assert torch.equal(c, 2 * y)  # stack(unbind): identity
    dims = sorted(n.kwargs.get("dim", n.args[2] if len(n.args) > 2 else 0) for n in op_nodes(gm, "split"))
    assert dims == [-1, 1]  # one negative dim that needs normalising


def test_unbind_stack_semantics():
    _, (y, z), (s, c), _, _ = capture("teach_unbind_stack")
    assert torch.equal(s, 2 * y)
    assert torch.equal(c, 2 * z.reshape(z.shape[0], -1))


def test_recsys_towers_graph():
    model, (x,), out, _, (gm,) = capture("recsys_towers")
    assert x.shape == (32, 128) and out.shape == (32, 1)
    assert count(gm, "linear") == 8 * 2 + 2
    assert count(gm, "relu") == 8 * 2 + 1
    assert count(gm, "layer_norm") == 8
    assert count(gm, "split") == 1 and count(gm, "cat") == 1
    # nn.ReLU used consistently: no torch.relu / Tensor.relu spellings
    assert all(n.target is F.relu for n in op_nodes(gm, "relu"))


def _same_input_groups(gm, op="linear"):
    return Counter(n.args[0] for n in op_nodes(gm, op))


def test_transformer_block_graph():
    _, (x,), out, _, (gm,) = capture("transformer_block")
    assert x.shape == (4, 16, 64) and out.shape == (4, 16, 64)
    assert count(gm, "linear") == 6
    assert max(_same_input_groups(gm).values()) == 3  # q, k, v share one input


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers not installed")
def test_bert_graph():
    _, (ids, mask), out, _, (gm,) = capture("bert")
    assert ids.shape == (2, 16) and ids.dtype == torch.int64
    assert mask.shape == (2, 16) and bool((mask == 1).all())
    assert out.shape == (2, 16, 64)
    assert count(gm, "linear") == 2 * 6
    groups = [c for c in _same_input_groups(gm).values() if c >= 3]
    assert len(groups) == 2  # q/k/v per layer


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers not installed")
def test_gpt2_graph():
    _, _, out, _, (gm,) = capture("gpt2")
    assert out.shape == (2, 16, 64)
    assert count(gm, "linear") == 0  # Conv1D -> addmm, no Linear nodes
    assert count(gm, "addmm") == 2 * 4


# ------------------------------------------------------------ optional dependency


def test_package_imports_without_transformers_and_bert_explains():
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "from optimus_lens import sample_models\n"
        "assert 'bert' in sample_models.names()\n"
        "for n in ('bert', 'gpt2'):\n"
        "    try:\n"
        "        sample_models.get(n)\n"
        "    except ImportError as e:\n"
        "        assert 'pip install -e .[models]' in str(e), e\n"
        "    else:\n"
        "        raise SystemExit(n + ' built without transformers')\n"
        "m, i = sample_models.get('recsys_towers'); m(*i)\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_recsys_towers32_hand_fused_reference_computes_the_same_function():
    model, (x,) = get("recsys_towers32")
    assert x.shape == (16, 2048)
    with torch.no_grad():
        torch.testing.assert_close(model.optimus_reference()(x), model(x), rtol=1e-4, atol=1e-5)
