"""Capture: the Dynamo pre-grad graph with meta, graph breaks reported, untraceable models explained."""

import pytest
import torch
import torch.nn as nn

from optimus_lens.frontend.capture import CaptureError, capture
from optimus_lens.frontend.run import ModelSpecError, load_model, optimize


class Breaks(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        y = self.a(x)
        print("side effect")  # a graph break
        return self.b(y).relu()


def test_dynamo_capture_has_example_values_stack_traces_and_module_paths():
    m, ex, _ = load_model("sample:teach_batch_linear")
    c = capture(m, ex)
    linears = [n for n in c.gm.graph.nodes if n.target is torch._C._nn.linear]
    assert len(linears) == 6
    assert all(
        "example_value" in n.meta and n.meta.get("stack_trace") and n.meta.get("nn_module_stack") for n in linears
    )
    assert len(c.example_inputs) == len([n for n in c.gm.graph.nodes if n.op == "placeholder"])


def test_graph_breaks_are_counted_and_explained_not_dropped():
    c = capture(Breaks().eval(), (torch.randn(2, 4),))
    assert len(c.graphs) == 2
    assert c.breaks and any("print" in r or "builtin" in r.lower() for r in c.breaks), c.breaks
    assert "2 graph(s), 1 graph break(s)" in c.summary()
    other = capture(Breaks().eval(), (torch.randn(2, 4),), graph_index=1 - c.graph_index)
    assert other.gm is not c.gm
    with pytest.raises(ValueError):
        capture(Breaks().eval(), (torch.randn(2, 4),), graph_index=5)


class SlicedLinears(nn.Module):
    """5 Linear(8, 8) on column slices (symbolic tracing cannot iterate a split's result)."""

    def __init__(self):
        super().__init__()
        self.ls = nn.ModuleList(nn.Linear(8, 8) for _ in range(5))

    def forward(self, x):
        return torch.cat([lin(x[:, 8 * i : 8 * i + 8]) for i, lin in enumerate(self.ls)], dim=1)


def test_symbolic_capture_path_fuses_like_dynamo():
    m, x = SlicedLinears().eval(), torch.randn(3, 40)
    sym = optimize(m, (x,), capture_method="symbolic", passes=["batch_linear"], verify="step").trace
    dyn = optimize(m, (x,), capture_method="dynamo", passes=["batch_linear"], verify="step").trace
    assert [len(s.sites) for s in sym.steps] == [len(s.sites) for s in dyn.steps] == [5]
    assert sym.steps[0].verify.ok and dyn.steps[0].verify.ok


def test_model_that_fails_to_trace_raises_capture_error_with_the_reason():
    class Bad(nn.Module):
        def forward(self, x):
            raise ValueError("this model refuses")

    with pytest.raises(CaptureError, match="refuses"):
        capture(Bad(), (torch.randn(2),))


def test_bad_model_specs_are_explained():
    with pytest.raises(ModelSpecError, match="unknown sample"):
        load_model("sample:nope")
    with pytest.raises(ModelSpecError, match="cannot import"):
        load_model("no_such_pkg.mod:factory")
    with pytest.raises(ModelSpecError, match="no callable"):
        load_model("optimus_lens.frontend.run:nothing_here")
    with pytest.raises(ModelSpecError, match="must return"):
        load_model("optimus_lens.core.trace:GraphSnapshot")  # returns a snapshot, not (model, inputs)


def test_factory_spec_loads_a_user_model():
    m, ex, name = load_model("optimus_lens.sample_models.teaching:build_teach_batch_relu")
    assert isinstance(m, nn.Module) and name.endswith("build_teach_batch_relu")
