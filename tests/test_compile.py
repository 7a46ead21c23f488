"""PT2 integration: the pipeline as Inductor's pre_grad_custom_pass, and optimus_lens.inductor.compile."""

import copy
import shlex

import pytest
import torch

import optimus_lens
from optimus_lens import sample_models
from optimus_lens.inductor.compile import OptimusPreGradPass


@pytest.fixture(autouse=True)
def no_inductor_cache():
    # a cache hit skips pre-grad passes (correctly: the uuid is part of the key), so no trace would be recorded;
    # compiling bumps torch's global counters, which other tests read: put them back
    from torch._dynamo.utils import counters

    saved = {k: dict(v) for k, v in counters.items()}
    with torch._inductor.config.patch(force_disable_caches=True):
        yield
    torch._dynamo.reset()
    counters.clear()
    for k, v in saved.items():
        counters[k].update(v)


def test_compiled_outputs_equal_eager_and_our_passes_ran():
    model, inputs = sample_models.get("recsys_towers")
    compiled = optimus_lens.compile(model)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*inputs), model(*inputs))
    (trace,) = compiled.optimus_traces
    fused = {s.pattern for s in trace.steps}
    assert {"batch_linear", "batch_relu", "batch_layernorm"} <= fused
    assert trace.nodes_after < trace.nodes_before


def test_compiled_training_gradients_equal_eager():
    model, inputs = sample_models.get("teach_batch_linear")
    model.train()
    ref = copy.deepcopy(model)
    compiled = optimus_lens.compile(model, passes=["batch_linear"])
    compiled(*inputs).sum().backward()
    ref(*inputs).sum().backward()
    assert [s.pattern for s in compiled.optimus_traces[0].steps] == ["batch_linear"]
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


def test_uuid_is_stable_and_changes_with_the_enabled_passes():
    a, b = OptimusPreGradPass(), OptimusPreGradPass()
    assert a.uuid() == b.uuid() and isinstance(a.uuid(), str)
    assert OptimusPreGradPass(["batch_linear"]).uuid() != a.uuid()
    copy.deepcopy(a).traces.append("x")  # a config copy still fills the owner's traces
    assert a.traces == ["x"]


def test_compile_rejects_other_backends_and_a_second_custom_pass():
    m = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="backend 'eager'"):
        optimus_lens.compile(m, backend="eager")
    with pytest.raises(ValueError, match="pre_grad_custom_pass"):
        optimus_lens.compile(m, options={"pre_grad_custom_pass": None})
    with pytest.raises(KeyError, match="unknown pass"):
        optimus_lens.compile(m, passes=["no_such_pass"])


# ---------------------------------------------------------------- the cache key and the first-call check

BROKEN_PATTERN = '''"""A deliberately wrong rule: relu is not sigmoid."""
import torch


def pattern(x):
    return torch.relu(x)


def replacement(x):
    return torch.sigmoid(x)
'''


class ReluHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.fc(x)) * 2


def test_the_cache_key_changes_when_any_file_of_the_core_or_the_catalogue_changes(tmp_path):
    import shutil
    from importlib import resources
    from pathlib import Path

    from optimus_lens.inductor.compile import SOURCES, source_hash

    root = Path(str(resources.files("optimus_lens")))
    for name in SOURCES:  # a copy of the installed sources (the editable install links them)
        src, dst = root / name, tmp_path / name
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, dst)
    assert source_hash(tmp_path) == source_hash()
    files = sorted(p for p in tmp_path.rglob("*.py"))
    assert {"core/rewriter.py", "core/lang.py", "core/strides.py", "core/pipeline.py", "core/record.py"} <= {
        f.relative_to(tmp_path).as_posix() for f in files
    }
    assert any(f.parts[-2] == "split_cat" for f in files) and any(f.name == "profit.py" for f in files)
    base = source_hash(tmp_path)
    unchanged = []
    for f in files:
        original = f.read_bytes()
        f.write_bytes(original + b"\n# one more line\n")
        if source_hash(tmp_path) == base:
            unchanged.append(f.relative_to(tmp_path).as_posix())
        f.write_bytes(original)
    assert not unchanged, f"the key ignores {unchanged}"
    assert source_hash(tmp_path) == base


def test_the_cache_key_covers_the_pattern_files_given_to_compile(tmp_path):
    f = tmp_path / "relu_to_sigmoid.py"
    f.write_text(BROKEN_PATTERN)
    with_file = OptimusPreGradPass(pattern_files=[str(f)])
    assert with_file.uuid() != OptimusPreGradPass().uuid()
    assert "relu_to_sigmoid" in with_file.pipeline.names()
    before = with_file.uuid()
    f.write_text(BROKEN_PATTERN.replace("sigmoid(x)", "tanh(x)"))
    assert with_file.uuid() != before


def test_compile_rejects_an_unknown_check():
    with pytest.raises(ValueError, match="check must be one of"):
        optimus_lens.compile(torch.nn.Linear(2, 2), check="always")


def test_a_broken_pattern_file_is_caught_on_the_first_call_and_the_graph_compiles_without_our_passes(
    tmp_path, capsys, monkeypatch
):
    import tempfile

    from optimus_lens.cli import main
    from optimus_lens.inductor.check import OptimusCheckWarning

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the graph is saved for bisect

    f = tmp_path / "relu_to_sigmoid.py"
    f.write_text(BROKEN_PATTERN)
    torch.manual_seed(0)
    model, x = ReluHead(), torch.randn(3, 4)
    compiled = optimus_lens.compile(model, pattern_files=[str(f)])
    with pytest.warns(OptimusCheckWarning, match=r"ReluHead graph 0: .*differs from eager.*optimus bisect") as caught:
        with torch.no_grad():
            got = compiled(x)
    with torch.no_grad():
        want = model(x)
        torch.testing.assert_close(got, want)  # the fallback: Inductor without our passes
        torch.testing.assert_close(compiled(x * 2), model(x * 2))
    (trace,) = compiled.optimus_traces
    (warned,) = [str(w.message) for w in caught if issubclass(w.category, OptimusCheckWarning)]
    assert [s.pattern for s in trace.steps] == ["relu_to_sigmoid"]
    assert trace.final_verify.ok is False and trace.final_verify.checked == "first-call outputs"
    assert "output 0" in trace.final_verify.message and "output 0" in warned
    check = trace.capture["check"]
    assert check["fallback"] is True and check["bisect"] in warned
    command = shlex.split(check["bisect"])
    assert command[:2] == ["optimus", "bisect"] and command[-2:] == ["--pattern-file", str(f)]
    assert command[2].startswith(str(tmp_path)) and command[2].endswith(".py:build")
    # the command the warning names finds the step
    assert main(command[1:]) == 1
    assert "first failing step: 1 (relu_to_sigmoid / relu_to_sigmoid)" in capsys.readouterr().out


def test_check_off_compiles_with_our_passes_unchecked(tmp_path):
    f = tmp_path / "relu_to_sigmoid.py"
    f.write_text(BROKEN_PATTERN)
    torch.manual_seed(0)
    model, x = ReluHead(), torch.randn(3, 4)
    compiled = optimus_lens.compile(model, pattern_files=[str(f)], check="off")
    with torch.no_grad():
        got = compiled(x)
        assert torch.allclose(got, torch.sigmoid(model.fc(x)) * 2)  # the broken rule ran and nothing said so
    (trace,) = compiled.optimus_traces
    assert trace.final_verify is None and "check" not in trace.capture
