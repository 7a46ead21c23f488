"""Pre-packed weights (optimus_lens.perf.prepack): constants made once in inference, per-call stacks in training."""

import pytest
import torch

from optimus_lens.core.engine import copy_graph_module
from optimus_lens.frontend.run import load_model, optimize
from optimus_lens.perf.memory import peak_bytes
from optimus_lens.perf.prepack import StaleWeightsError, is_inference, prepack, refresh


@pytest.fixture(scope="module")
def towers():
    """recsys_towers32 after the default pipeline: (captured graph, fused graph, inputs, model)."""
    model, inputs, _ = load_model("sample:recsys_towers32")
    r = optimize(model, inputs, verify="off", keep_stages=True)
    return r.engine.stages[0][1], r.engine.gm, r.captured.example_inputs, r


def _fresh(towers):
    base, fused, ins, r = towers
    return base, copy_graph_module(fused), ins, r


def test_prepack_folds_stacked_parameters_into_constants_with_equal_outputs(towers):
    base, gm, ins, r = _fresh(towers)
    stacks_before = sum(1 for n in gm.graph.nodes if n.target is torch.stack)
    p = prepack(gm, ins, guard=None)
    # batch_linear x 2 (weight, bias) and batch_layernorm (gamma, beta) of 32 towers
    assert len(p.constants) == 6
    assert p.bytes_packed == 4 * (2 * 32 * (64 * 64 + 64) + 2 * 32 * 64)
    assert sum(1 for n in gm.graph.nodes if n.target is torch.stack) == stacks_before - 6
    assert sum(1 for n in gm.graph.nodes if n.op == "get_attr") == 6
    with torch.no_grad():
        torch.testing.assert_close(gm(*ins)[0], base(*ins)[0], rtol=0, atol=0)


def test_prepack_records_one_step_per_constant_with_bytes_packed(towers):
    base, gm, ins, r = _fresh(towers)
    from optimus_lens.core.trace import Trace

    trace = Trace.loads(r.trace.dumps())
    n = len(trace.steps)
    p = prepack(gm, ins, trace=trace, guard=None)
    new = trace.steps[n:]
    assert [s.pass_name for s in new] == ["prepack_weights"] * 6
    assert sum(s.info["bytes_packed"] for s in new) == p.bytes_packed
    again = Trace.loads(trace.dumps())
    assert again.steps[-1].info == new[-1].info
    assert set(again.graph_at(len(again.steps)).nodes) == {x.name for x in gm.graph.nodes}


def test_prepacked_estimated_peak_memory_is_at_most_the_captured_graphs(towers):
    base, gm, ins, r = _fresh(towers)
    fused_peak = peak_bytes(gm.graph)["peak_bytes"]
    prepack(gm, ins, guard=None)
    est = peak_bytes(gm.graph)
    assert est["constants_bytes"] == gm.optimus_prepacked.bytes_packed
    assert est["peak_bytes"] <= peak_bytes(base.graph)["peak_bytes"] < fused_peak


def test_training_mode_keeps_per_call_stacks_and_gradients_reach_the_parameters(towers):
    base, gm, ins, r = _fresh(towers)
    assert prepack(gm, ins, training=True).constants == []
    params = [x for x in ins if isinstance(x, torch.nn.Parameter)]
    grads = []
    for g in (base, gm):
        for p in params:
            p.grad = None
        g(*ins)[0].sum().backward()
        grads.append([p.grad.clone() for p in params])
    assert all(a is not None for a in grads[1])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_optimizer_step_repacks_stale_constants(towers):
    base, gm, ins, r = _fresh(towers)
    ins = tuple(torch.nn.Parameter(x.detach().clone()) if isinstance(x, torch.nn.Parameter) else x for x in ins)
    prepack(gm, ins)  # guard="optimizer"
    params = [x for x in ins if isinstance(x, torch.nn.Parameter)]
    opt = torch.optim.SGD(params, lr=0.1)
    base(*ins)[0].sum().backward()
    opt.step()
    with torch.no_grad():
        torch.testing.assert_close(gm(*ins)[0], base(*ins)[0])
        params[0].mul_(2)  # a write no optimizer saw: refresh() finds it
        assert refresh(gm) == 1 and refresh(gm) == 0
        torch.testing.assert_close(gm(*ins)[0], base(*ins)[0])


def test_call_guard_raises_or_repacks_when_a_weight_changed(towers):
    base, gm, ins, r = _fresh(towers)
    ins = tuple(torch.nn.Parameter(x.detach().clone()) if isinstance(x, torch.nn.Parameter) else x for x in ins)
    gm2 = copy_graph_module(gm)
    prepack(gm, ins, guard="call", on_stale="raise")
    prepack(gm2, ins, guard="call")
    with torch.no_grad():
        gm(*ins)
        ins[1].add_(1.0)
        with pytest.raises(StaleWeightsError, match="changed since"):
            gm(*ins)
        torch.testing.assert_close(gm2(*ins)[0], base(*ins)[0])


def test_inference_is_eval_mode_no_grad_or_the_explicit_mode():
    m = torch.nn.Linear(2, 2)
    assert not is_inference(m.train()) and is_inference(m.eval())
    with torch.no_grad():
        assert is_inference(m.train())
    assert is_inference(m.train(), mode="inference") and not is_inference(m.eval(), mode="training")
    with pytest.raises(ValueError, match="mode must be"):
        is_inference(m, mode="eval")


def test_matmul_operands_are_packed_contiguous_and_every_constant_meta_matches_its_strides(towers):
    base, gm, ins, r = _fresh(towers)
    prepack(gm, ins, guard=None)
    consts = [n for n in gm.graph.nodes if n.op == "get_attr"]
    for n in consts:
        buf = getattr(gm, n.target)
        assert n.meta["example_value"].stride() == buf.stride() and tuple(n.meta["example_value"].shape) == buf.shape
    weights = [
        getattr(gm, n.target) for n in consts if any(u.target is torch.baddbmm and u.args[2] is n for u in n.users)
    ]
    assert len(weights) == 2 and all(w.is_contiguous() and w.shape == (32, 64, 64) for w in weights)


@pytest.mark.parametrize(
    "spec,constants",
    [
        ("sample:teach_batch_linear_lhs", 2),
        ("sample:bert", 4),
        ("sample:teach_batch_layernorm_variants", 4),
        ("sample:teach_batch_conv1d", 2),
        ("sample:teach_batch_matmul", 1),
    ],
)
def test_prepack_covers_cat_stack_and_every_linear_form_with_equal_outputs(spec, constants):
    r = optimize(spec, verify="off")
    gm, ins = r.engine.gm, r.captured.example_inputs
    with torch.no_grad():
        before = gm(*ins)
        assert len(prepack(gm, ins, guard=None).constants) == constants
        after = gm(*ins)
    before, after = (torch.utils._pytree.tree_leaves(x) for x in (before, after))
    for a, b in zip(before, after):
        torch.testing.assert_close(b, a)
