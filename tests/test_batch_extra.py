"""Batch fusions beyond upstream's catalogue: batch_normalize groups independent F.normalize
calls (the L2-normalised tower outputs of a retrieval model), shifts a front-counted dim past
the stack dim, keeps values, gradients and strides, and never runs under upstream's pipeline."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from optimus_lens import sample_models
from optimus_lens.capture import capture
from optimus_lens.engine import Engine, Pass, Pipeline, RunOptions
from optimus_lens.passes import default_pipeline, upstream_pipeline
from optimus_lens.pattern import REGISTRY


def _run(model, inputs, pipe=None):
    c = capture(model, inputs)
    pipe = pipe or Pipeline([Pass("batch_normalize", [REGISTRY["batch_normalize"]])])
    return Engine(c.gm, c.example_inputs, pipe, RunOptions(verify="step", grads=True)).run(), c.gm


class Normalized(nn.Module):
    """Five F.normalize over dim ``dim`` of (4, 8, 5) inputs, two more with another p and eps."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, *xs):
        same = [F.normalize(x, dim=self.dim) for x in xs[:5]]
        other = [F.normalize(xs[5], p=1.0, dim=self.dim), F.normalize(xs[6], dim=self.dim, eps=1e-6)]
        return torch.cat(same + other, dim=-1).view(-1)  # view: outputs' strides matter


def test_twin_towers_normalises_its_six_towers_once():
    model, inputs = sample_models.get("twin_towers")
    trace, gm = _run(model, inputs, default_pipeline())
    (step,) = [s for s in trace.steps if s.pattern == "batch_normalize"]
    assert len(step.sites) == 6 and step.verify.ok
    assert trace.final_verify is None or trace.final_verify.ok
    assert len([n for n in gm.graph.nodes if n.target is F.normalize]) == 1


def test_front_counted_dims_shift_past_the_stack_and_only_equal_arguments_group():
    for dim in (0, 1, 2, -1, -3):
        inputs = tuple(torch.randn(4, 8, 5, requires_grad=True) for _ in range(7))
        trace, gm = _run(Normalized(dim), inputs)
        (step,) = trace.steps
        assert len(step.sites) == 5, dim  # p=1 and eps=1e-6 stay apart
        assert step.verify.ok and step.verify.checked == "outputs+grads", (dim, step.verify)
        (fused,) = [n for n in gm.graph.nodes if n.target is F.normalize and n.kwargs.get("p") == 2.0]
        assert fused.kwargs["dim"] == (dim + 1 if dim >= 0 else dim)


def test_upstream_pipeline_never_runs_it():
    model, inputs = sample_models.get("twin_towers")
    c = capture(model, inputs)
    names = [p.name for p in upstream_pipeline({"batch_relu": {}}).passes]
    assert "batch_normalize" not in names and "batch_normalize" in [p.name for p in default_pipeline().passes]
    assert REGISTRY["batch_normalize"].key(next(n for n in c.gm.graph.nodes if n.target is F.normalize))
