"""PT2 integration: the pipeline as Inductor's pre_grad_custom_pass, and optimus_lens.inductor.compile."""

import copy

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
