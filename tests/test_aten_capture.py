"""The ATen graphs of the post-grad stage (optimus_lens.frontend.aten_capture) are the graphs a
real ``torch.compile(backend="inductor")`` hands ``post_grad_passes``, node for node, and
each comes with the real tensors it was called with, so it runs and verifies on its own."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

from optimus_lens.core.record import snapshot_graph
from optimus_lens.frontend.aten_capture import AtenCaptureError, capture_aten
from optimus_lens.frontend.capture import capture


class Towers(nn.Module):
    """Three linears + tanh on one input, concatenated and summed (forward and backward
    graphs with addmm, tanh, mm, the backward's recomputed tanh)."""

    def __init__(self):
        super().__init__()
        self.lins = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))

    def forward(self, x):
        return torch.cat([torch.tanh(lin(x)) for lin in self.lins], 1).sum(1)


class _Stop(Exception):
    pass


def real_post_grad_inputs(model: nn.Module, inputs: tuple, training: bool) -> list[tuple[bool, torch.fx.GraphModule]]:
    """(is_inference, graph) of every call of Inductor's ``post_grad_passes`` under a real
    ``torch.compile(backend="inductor")``: the graph is copied at entry, then the compile of
    that graph is cut short (``post_grad_passes`` raises, ``_compile_fx_inner`` returns the
    graph run eagerly), so no C++ is generated and AOTAutograd goes on to the backward."""
    import torch._functorch.config as functorch_config
    import torch._inductor.compile_fx as cfx
    import torch._inductor.config as inductor_config
    from torch._functorch.aot_autograd import make_boxed_func

    seen: list[tuple[bool, torch.fx.GraphModule]] = []
    orig_passes, orig_inner = cfx.post_grad_passes, cfx._compile_fx_inner

    def record(gm, is_inference):
        seen.append((is_inference, copy.deepcopy(gm)))
        raise _Stop

    def inner(gm, example_inputs, **kw):
        try:
            return orig_inner(gm, example_inputs, **kw)
        except Exception as e:  # noqa: BLE001 - only our own stop is caught
            c: BaseException | None = e
            while c is not None and not isinstance(c, _Stop):
                c = c.__cause__ or c.__context__
            if c is None:
                raise
            return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    cfx.post_grad_passes, cfx._compile_fx_inner = record, inner
    try:
        with (
            inductor_config.patch(fx_graph_cache=False, force_disable_caches=True),
            functorch_config.patch(enable_autograd_cache=False),
            torch.enable_grad() if training else torch.no_grad(),
        ):
            out = torch.compile(model, backend="inductor")(*inputs)
            if training:
                leaves = [o for o in torch.utils._pytree.tree_leaves(out) if o.requires_grad]
                torch.autograd.backward(leaves, [torch.ones_like(o) for o in leaves])
    finally:
        cfx.post_grad_passes, cfx._compile_fx_inner = orig_passes, orig_inner
        torch._dynamo.reset()
    return seen


def node_list(gm: torch.fx.GraphModule) -> list[tuple]:
    """Every node as (name, op, target, args, kwargs, shape, dtype, strides)."""
    snap = snapshot_graph(gm.graph)
    return [(r.name, r.op, r.target, r.args, r.kwargs, r.shape, r.dtype, r.stride) for r in snap.nodes.values()]


@pytest.fixture(scope="module")
def towers():
    torch.manual_seed(0)
    model, x = Towers(), torch.randn(4, 8)
    c = capture(model, (x,), copy_inputs=False)  # the graph's inputs are the model's own parameters
    return model, x, c


@pytest.fixture(scope="module")
def training(towers):
    _, _, c = towers
    return capture_aten(c.gm, c.example_inputs, "training")


@pytest.mark.parametrize("mode", ["training", "inference"])
def test_graphs_are_the_ones_inductor_hands_post_grad_passes_node_for_node(towers, training, mode):
    model, x, c = towers
    ours = training if mode == "training" else capture_aten(c.gm, c.example_inputs, "inference")
    real = real_post_grad_inputs(model, (x,), mode == "training")
    assert [g.name for g in ours.graphs] == (["forward", "backward"] if mode == "training" else ["forward"])
    assert [g.is_inference for g in ours.graphs] == [inf for inf, _ in real]
    for g, (_, gm) in zip(ours.graphs, real):
        assert node_list(g.gm) == node_list(gm)


def test_the_partitioner_sees_the_parameters_as_static_inputs_as_under_torch_compile():
    """mmoe's training graphs: what the forward saves and the backward recomputes depends on
    which inputs the min-cut partitioner knows to be parameters (Dynamo's metadata, which
    copies of the captured graph keep); node for node what torch.compile hands its passes."""
    from optimus_lens.core.engine import copy_graph_module
    from optimus_lens.frontend.run import load_model

    model, inputs, _ = load_model("sample:mmoe")
    model.train()
    c = capture(model, inputs)
    ours = capture_aten(copy_graph_module(c.gm), c.example_inputs, "training")
    real = real_post_grad_inputs(model, inputs, True)
    assert [len(g.gm.graph.nodes) for g in ours.graphs] == [len(gm.graph.nodes) for _, gm in real]
    for g, (_, gm) in zip(ours.graphs, real):
        assert node_list(g.gm) == node_list(gm)


def test_the_forward_runs_on_its_primals_and_returns_what_the_model_does(towers, training):
    model, x, _ = towers
    fw = training.graph("forward")
    with torch.no_grad():
        outs = fw.gm(*fw.example_inputs)
        expected = model(x)
    torch.testing.assert_close(outs[0], expected)
    assert len(outs) > 1  # the activations saved for backward are outputs too


def test_the_backward_runs_on_saved_tensors_and_tangents_and_gives_the_gradients(towers, training):
    """The backward's outputs are the gradients of the forward's inputs (placeholder order:
    the input, then the lifted parameters) for the recorded tangents, as eager autograd
    computes them."""
    model, x, c = towers
    bw = training.graph("backward")
    with torch.no_grad():
        grads = bw.gm(*bw.example_inputs)
    tangent = bw.example_inputs[-1]
    params = [p for p in c.example_inputs if isinstance(p, nn.Parameter)]
    expected = torch.autograd.grad(model(x), params, tangent)
    got = [g for g, inp in zip(grads, c.example_inputs) if isinstance(inp, nn.Parameter)]
    assert len(got) == len(expected) == 6
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)
    assert all(p.grad is None for p in params)  # the capture's own backward leaves no gradients behind


def test_nodes_keep_aot_provenance_seq_nr_from_node_and_module(training):
    fw = snapshot_graph(training.graph("forward").gm.graph)
    bw = snapshot_graph(training.graph("backward").gm.graph)
    addmm = next(r for r in fw.nodes.values() if r.target.endswith("addmm.default"))
    assert addmm.from_node == ["linear"] and addmm.module == "lins.0" and addmm.seq_nr is not None
    # the backward's ops of that linear's gradient share its seq_nr (AOTAutograd's link between graphs)
    assert any(r.seq_nr == addmm.seq_nr and r.target.endswith("mm.default") for r in bw.nodes.values())
    assert addmm.source and "torch.tanh(lin(x))" in addmm.source


def test_a_program_aot_cannot_run_is_a_clear_error():
    class Bad(nn.Module):
        def forward(self, x):
            return x @ x  # (4, 8) @ (4, 8): the shapes do not multiply

    c = capture(nn.Linear(8, 8), (torch.randn(4, 8),))
    with pytest.raises(ValueError, match="mode must be"):
        capture_aten(c.gm, c.example_inputs, "train")
    g = torch.fx.symbolic_trace(Bad())
    with pytest.raises(AtenCaptureError, match="AOTAutograd could not trace|raised"):
        capture_aten(g, (torch.randn(4, 8),), "inference")
