"""optimus_lens.transform: a module users train, whose parameters are the model's own.

Every check runs the transformed module beside an untouched copy of the model in eager
PyTorch (the oracle), on identical inputs, and compares what a training loop sees:
losses, parameters, gradients, optimizer state, state_dict.
"""

import copy
import io
import warnings

import pytest
import torch
from torch import nn

import optimus_lens
from optimus_lens.perf.trainable import TransformedModule, parameter_refusals
from optimus_lens.sample_models.demo import RecsysTowers

TOL = {"rtol": 1e-5, "atol": 1e-6}


def _towers():
    torch.manual_seed(0)
    return RecsysTowers(5, 4, 8), (torch.randn(6, 20),)


@pytest.fixture()
def pair():
    """(eager copy, transformed module, example inputs): the same weights."""
    model, inputs = _towers()
    eager = copy.deepcopy(model).train()
    return eager, optimus_lens.transform(model, inputs, verify="off"), inputs


def _loss(m, x):
    return (m(x).float() ** 2).mean()


def _close(a: nn.Module, b: nn.Module, grads: bool = True):
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert na == nb
        torch.testing.assert_close(pb, pa, **TOL)
        if grads:
            assert (pa.grad is None) == (pb.grad is None), na
            if pa.grad is not None:
                torch.testing.assert_close(pb.grad, pa.grad, **TOL)


def _x(step: int, inputs):
    return torch.randn(inputs[0].shape, generator=torch.Generator().manual_seed(100 + step))


def test_parameters_state_dict_and_modules_are_the_models_own(pair):
    eager, t, _ = pair
    model = t._original
    assert isinstance(t, TransformedModule)
    assert [id(p) for p in t.parameters()] == [id(p) for p in model.parameters()]
    assert list(t.state_dict()) == list(eager.state_dict())
    for k, v in t.state_dict().items():
        torch.testing.assert_close(v, eager.state_dict()[k], rtol=0, atol=0)
    assert t.towers is model.towers and t.d_in == model.d_in
    assert [n for n, _ in t.named_modules()][1:] == [n for n, _ in model.named_modules()][1:]


def test_packed_parameters_are_views_of_one_leaf_the_graph_reads(pair):
    _, t, _ = pair
    assert len(t.groups) == 6  # fc1/fc2 weights and biases, the layer norms' weights and biases
    g = next(g for g in t.groups if g.spec.params[0] == "towers.0.fc1.weight")
    assert g.spec.params == [f"towers.{i}.fc1.weight" for i in range(5)]
    base = g.leaf.untyped_storage().data_ptr()
    assert all(p.untyped_storage().data_ptr() == base for p in g.params)
    assert g.leaf.shape == (5, 4, 8) and g.params[0].shape == (8, 4)
    code = t._programs["packed"].gm.code
    assert "torch.stack" not in code and "packed_towers_fc1_weight" in code


@pytest.mark.parametrize(
    "make",
    [
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-2, nesterov=True),
        lambda ps: torch.optim.Adam(ps, lr=1e-2),
        lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
        lambda ps: torch.optim.Adam(ps, lr=1e-2, foreach=False, amsgrad=True),
    ],
    ids=["sgd-momentum-wd", "adam", "adamw", "adam-for-loop-amsgrad"],
)
def test_training_side_by_side_matches_eager_at_every_step(pair, make):
    eager, t, inputs = pair
    oa, ob = make(eager.parameters()), make(t.parameters())
    for step in range(6):
        x = _x(step, inputs)
        losses = []
        for m, o in ((eager, oa), (t, ob)):
            o.zero_grad(set_to_none=True)
            loss = _loss(m, x)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
            o.step()
            losses.append(loss.item())
        assert losses[1] == pytest.approx(losses[0], rel=1e-5)
        _close(eager, t)
        for pa, pb in zip(eager.parameters(), t.parameters()):
            for k, v in oa.state[pa].items():
                torch.testing.assert_close(ob.state[pb][k], v, **TOL)
    assert t.events == []


def test_gradients_accumulate_over_micro_batches_and_zero_grad_without_none(pair):
    eager, t, inputs = pair
    for m in (eager, t):
        for step in range(3):  # three micro-batches, no zero_grad in between
            _loss(m, _x(step, inputs)).backward()
    _close(eager, t)
    g = t.groups[0]
    assert all(p.grad.data_ptr() != 0 for p in g.params)
    assert g.params[1].grad.untyped_storage().data_ptr() == g.leaf.grad.untyped_storage().data_ptr()
    for m in (eager, t):
        torch.optim.SGD(m.parameters(), lr=0.1).zero_grad(set_to_none=False)
        _loss(m, _x(9, inputs)).backward()
    _close(eager, t)


def test_a_gradient_a_user_assigned_is_accumulated_into(pair):
    eager, t, inputs = pair
    for m in (eager, t):
        m.towers[2].fc1.weight.grad = torch.full_like(m.towers[2].fc1.weight, 0.25)
        _loss(m, _x(0, inputs)).backward()
    _close(eager, t)


def _roundtrip(obj):
    """``obj`` through ``torch.save`` / ``torch.load``, as a checkpoint file is."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf)


def test_a_checkpoint_saved_from_either_loads_into_the_other(pair):
    eager, t, inputs = pair
    oa, ob = (torch.optim.Adam(m.parameters(), lr=1e-2) for m in (eager, t))
    for step in range(2):
        for m, o in ((eager, oa), (t, ob)):
            o.zero_grad()
            _loss(m, _x(step, inputs)).backward()
            o.step()
    ckpt = _roundtrip({"model": t.state_dict(), "optim": ob.state_dict()})
    fresh = RecsysTowers(5, 4, 8).train()
    fresh.load_state_dict(ckpt["model"])
    of = torch.optim.Adam(fresh.parameters(), lr=1e-2)
    of.load_state_dict(ckpt["optim"])
    # and the eager checkpoint into a newly transformed module
    ckpt = _roundtrip({"model": eager.state_dict(), "optim": oa.state_dict()})
    t2 = optimus_lens.transform(RecsysTowers(5, 4, 8), inputs, verify="off")
    t2.load_state_dict(ckpt["model"])
    o2 = torch.optim.Adam(t2.parameters(), lr=1e-2)
    o2.load_state_dict(ckpt["optim"])
    for step in range(2, 5):
        for m, o in ((eager, oa), (t, ob), (fresh, of), (t2, o2)):
            o.zero_grad()
            _loss(m, _x(step, inputs)).backward()
            o.step()
        for m in (t, fresh, t2):
            _close(eager, m)


def test_load_state_dict_and_in_place_writes_reach_the_packed_graph(pair):
    eager, t, inputs = pair
    other = RecsysTowers(5, 4, 8).train()
    eager.load_state_dict(other.state_dict())
    t.load_state_dict(other.state_dict())
    with torch.no_grad():
        for m in (eager, t):
            m.towers[1].fc2.weight.mul_(3.0)
            m.towers[4].norm.bias.add_(1.0)
    x = _x(0, inputs)
    torch.testing.assert_close(t(x), eager(x), **TOL)
    assert t.events == []


def test_a_replaced_data_or_dtype_change_re_links_the_pack(pair):
    eager, t, inputs = pair
    with torch.no_grad():
        new = torch.randn_like(eager.towers[3].fc1.weight)
    eager.towers[3].fc1.weight.data = new.clone()
    t.towers[3].fc1.weight.data = new.clone()
    x = _x(0, inputs)
    torch.testing.assert_close(t(x), eager(x), **TOL)
    assert any("re-linked packed_towers_fc1_weight" in e for e in t.events)
    eager.double()
    t.double()
    x = x.double()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the inputs' dtype differs from the example's: eager fallback is fine too
        torch.testing.assert_close(t(x), eager(x), **TOL)
    assert all(p.dtype == torch.float64 for p in t.parameters())


def test_freezing_a_whole_group_follows_and_freezing_part_of_one_runs_unpacked(pair):
    eager, t, inputs = pair
    for m in (eager, t):
        for tower in m.towers:
            tower.norm.weight.requires_grad_(False)
        _loss(m, _x(0, inputs)).backward()
    _close(eager, t)
    assert t.towers[0].norm.weight.grad is None
    for m in (eager, t):
        m.towers[0].fc1.bias.requires_grad_(False)
        for p in m.parameters():
            p.grad = None
    with pytest.warns(UserWarning, match="unpacked graph"):
        _loss(t, _x(1, inputs)).backward()
    _loss(eager, _x(1, inputs)).backward()
    _close(eager, t)


def test_eval_mode_and_other_shapes_run_the_models_own_forward(pair):
    eager, t, inputs = pair
    eager.eval()
    t.eval()
    x = _x(0, inputs)
    with pytest.warns(UserWarning, match="eval mode"):
        torch.testing.assert_close(t(x), eager(x), **TOL)
    t.train()
    eager.train()
    x = torch.randn(3, 20)
    with pytest.warns(UserWarning, match="shape"):
        torch.testing.assert_close(t(x), eager(x), **TOL)


def test_a_parameter_re_registered_on_the_model_is_picked_up(pair):
    eager, t, inputs = pair
    new = nn.Parameter(torch.randn(1, 64))
    eager.top[2].weight = nn.Parameter(new.detach().clone())
    t.top[2].weight = nn.Parameter(new.detach().clone())
    new_member = nn.Parameter(torch.randn(8, 8))
    eager.towers[1].fc2.weight = nn.Parameter(new_member.detach().clone())
    t.towers[1].fc2.weight = nn.Parameter(new_member.detach().clone())
    x = _x(0, inputs)
    torch.testing.assert_close(t(x), eager(x), **TOL)
    _loss(t, x).backward()
    _loss(eager, x).backward()
    _close(eager, t)
    assert t.towers[1].fc2.weight.grad is not None


def test_a_replaced_submodule_makes_the_module_run_the_models_forward(pair):
    eager, t, inputs = pair
    t.towers[0] = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.LayerNorm(8))
    eager.towers[0] = copy.deepcopy(t.towers[0])
    with pytest.warns(UserWarning, match="submodule was replaced"):
        torch.testing.assert_close(t(_x(0, inputs)), eager(_x(0, inputs)), **TOL)


class _Tied(nn.Module):
    """Five linears, the first and last sharing one weight object."""

    def __init__(self):
        super().__init__()
        self.fcs = nn.ModuleList(nn.Linear(6, 6) for _ in range(5))
        self.fcs[4].weight = self.fcs[0].weight

    def forward(self, x):
        return torch.stack([f(x) for f in self.fcs]).relu().sum(0)


def test_tied_weights_are_not_packed_and_the_step_says_why():
    torch.manual_seed(0)
    model = _Tied()
    eager = copy.deepcopy(model).train()
    t = optimus_lens.transform(model, (torch.randn(3, 6),), verify="off")
    refusals = [s.info for s in t.trace.steps if s.pattern == "pack_parameters" and not s.info["packed"]]
    assert refusals and all("tied" in r["reason"] or "more than once" in r["reason"] for r in refusals)
    opt_a, opt_b = torch.optim.SGD(eager.parameters(), lr=0.1), torch.optim.SGD(t.parameters(), lr=0.1)
    for step in range(3):
        x = torch.randn(3, 6, generator=torch.Generator().manual_seed(step))
        for m, o in ((eager, opt_a), (t, opt_b)):
            o.zero_grad()
            (m(x) ** 2).mean().backward()
            o.step()
        _close(eager, t)


def test_parameters_with_hooks_or_shared_storage_are_refused():
    model, _ = _towers()
    model.towers[0].fc1.weight.register_hook(lambda g: g)
    flat = torch.zeros(8 * 8 + 8)
    model.towers[1].fc2.weight.data = flat[:64].view(8, 8)
    reasons = parameter_refusals(model)
    assert "gradient hooks" in reasons[id(model.towers[0].fc1.weight)]
    assert "shares its storage" in reasons[id(model.towers[1].fc2.weight)]
    assert id(model.towers[2].fc1.weight) not in reasons


def test_autograd_grad_with_respect_to_a_packed_parameter_finds_it_unused(pair):
    """The documented limit: the graph reads the pack, so a packed parameter is not in it."""
    _, t, inputs = pair
    loss = _loss(t, _x(0, inputs))
    w = t.towers[0].fc1.weight
    (g,) = torch.autograd.grad(loss, [w], allow_unused=True)
    assert g is None


def test_pack_false_runs_the_fused_graph_with_stacks_and_trains_the_same(pair):
    eager, _, inputs = pair
    model, _ = _towers()
    t = optimus_lens.transform(model, inputs, pack=False, verify="off")
    assert not t.groups and "torch.stack" in t._programs["unpacked"].gm.code
    oa, ob = torch.optim.SGD(eager.parameters(), lr=0.1), torch.optim.SGD(t.parameters(), lr=0.1)
    for step in range(2):
        for m, o in ((eager, oa), (t, ob)):
            o.zero_grad()
            _loss(m, _x(step, inputs)).backward()
            o.step()
    _close(eager, t)


def test_inference_transform_pre_packs_and_follows_optimizer_steps_and_loads():
    model, inputs = _towers()
    eager = copy.deepcopy(model).eval()
    t = optimus_lens.transform(model, inputs, mode="inference", verify="off")
    assert t.prepacked is not None and len(t.prepacked.constants) == 6
    assert any(s.pattern == "prepack_weights" for s in t.trace.steps)
    x = _x(0, inputs)
    out = t(x)
    assert not out.requires_grad
    torch.testing.assert_close(out, eager(x), **TOL)
    other = RecsysTowers(5, 4, 8)
    t.load_state_dict(other.state_dict())
    eager.load_state_dict(other.state_dict())
    torch.testing.assert_close(t(x), eager(x), **TOL)


def test_transform_refuses_bad_arguments_with_clear_errors():
    model, inputs = _towers()
    with pytest.raises(ValueError, match="mode must be one of"):
        optimus_lens.transform(model, inputs, mode="train")
    with pytest.raises(ValueError, match="layout must be one of"):
        optimus_lens.transform(model, inputs, layout="rows")
    with pytest.raises(TypeError, match="nn.Module"):
        optimus_lens.transform(lambda x: x, inputs)
    with pytest.raises(ValueError, match="needs example_inputs"):
        optimus_lens.compile(model, pack=True)


def test_compile_with_pack_trains_like_eager_under_a_torch_compile_backend(pair):
    eager, _, inputs = pair
    model, _ = _towers()
    t = optimus_lens.compile(model, pack=True, example_inputs=inputs, backend="aot_eager")
    assert t.optimus_traces == [t.trace] and t.groups
    oa, ob = torch.optim.SGD(eager.parameters(), lr=0.1), torch.optim.SGD(t.parameters(), lr=0.1)
    for step in range(2):
        for m, o in ((eager, oa), (t, ob)):
            o.zero_grad()
            _loss(m, _x(step, inputs)).backward()
            o.step()
        _close(eager, t)


def test_a_ddp_wrapped_model_is_refused_with_the_way_to_do_it():
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29531", rank=0, world_size=1)
    try:
        model, inputs = _towers()
        wrapped = DistributedDataParallel(model)
        assert "DistributedDataParallel" in parameter_refusals(wrapped)[id(model.towers[0].fc1.weight)]
        with pytest.raises(optimus_lens.perf.trainable.TransformError, match="transform the module it wraps"):
            optimus_lens.transform(wrapped, inputs, verify="off")
    finally:
        dist.destroy_process_group()


def test_with_several_ranks_the_packed_module_runs_unpacked_so_ddp_hooks_see_every_gradient(pair, monkeypatch):
    eager, t, inputs = pair
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    seen = []
    hook = t.towers[0].fc1.weight.register_post_accumulate_grad_hook(lambda p: seen.append(p))
    with pytest.warns(UserWarning, match="2 ranks"):
        _loss(t, _x(0, inputs)).backward()
    hook.remove()
    _loss(eager, _x(0, inputs)).backward()
    assert seen == [t.towers[0].fc1.weight]  # its own AccumulateGrad ran: DDP's reducer would be told
    _close(eager, t)


class _Normed(nn.Module):
    """Five linears on one input, then a BatchNorm: a buffer the graph updates in place."""

    def __init__(self):
        super().__init__()
        self.fcs = nn.ModuleList(nn.Linear(6, 6) for _ in range(5))
        self.bn = nn.BatchNorm1d(30)

    def forward(self, x):
        return self.bn(torch.cat([f(x) for f in self.fcs], 1))


def test_buffers_are_updated_in_place_and_a_buffer_model_to_replaced_is_followed():
    torch.manual_seed(0)
    model = _Normed()
    eager = copy.deepcopy(model).train()
    t = optimus_lens.transform(model, (torch.randn(8, 6),), verify="off")
    assert t.groups  # batch_linear_lhs packs the five weights and biases
    for step in range(2):
        x = torch.randn(8, 6, generator=torch.Generator().manual_seed(step))
        torch.testing.assert_close(t(x), eager(x), **TOL)
    torch.testing.assert_close(t.bn.running_mean, eager.bn.running_mean, **TOL)
    assert t.bn.num_batches_tracked.item() == 2
    # a buffer object replaced behind the module's back, as Module._apply (model.to) does
    for m in (model, eager):
        m.bn._buffers["running_mean"] = torch.full((30,), 0.5)
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(t(x), eager(x), **TOL)
    assert t.bn.running_mean is model.bn._buffers["running_mean"]
    torch.testing.assert_close(t.bn.running_mean, eager.bn.running_mean, **TOL)
    assert not torch.equal(t.bn.running_mean, torch.full((30,), 0.5))  # the graph updated the new buffer


def test_a_deep_copy_trains_on_its_own_packs(pair):
    eager, t, inputs = pair
    t2 = copy.deepcopy(t)  # Parameter.__deepcopy__ clones: the copy packs its clones into leaves of its own
    g, g2 = t.groups[0], t2.groups[0]
    assert g2.leaf.untyped_storage().data_ptr() != g.leaf.untyped_storage().data_ptr()
    assert all(p.untyped_storage().data_ptr() == g2.leaf.untyped_storage().data_ptr() for p in g2.params)
    assert g2.params[0] is t2.towers[0].fc1.weight
    for m in (eager, t2):
        _loss(m, _x(0, inputs)).backward()
    _close(eager, t2)
    assert [n for n, p in t.named_parameters() if p.grad is not None] == []
    t2.towers[0] = nn.Linear(4, 8)
    with pytest.warns(UserWarning, match="submodule was replaced"):
        t2(_x(1, inputs))


@pytest.mark.parametrize(
    "make",
    [
        lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    ],
    ids=["adamw", "sgd-momentum"],
)
def test_an_optimizer_over_the_packs_makes_the_same_updates_in_one_kernel_per_pack(pair, make):
    eager, t, inputs = pair
    packs = list(t.packed_parameters())
    assert len(packs) == 6 + 4  # six packs, the top MLP's four parameters
    assert any(p is t.groups[0].leaf for p in packs)
    oa, ob = make(eager.parameters()), make(packs)
    for step in range(4):
        for m, o in ((eager, oa), (t, ob)):
            o.zero_grad(set_to_none=True)
            _loss(m, _x(step, inputs)).backward()
            o.step()
        _close(eager, t)
    with pytest.raises(RuntimeError, match="packed_parameters"):
        t(torch.randn(3, 20))  # another batch size runs the model's forward: the packs would miss it


def test_a_watched_module_collected_while_dynamo_compiles_another_model_breaks_nothing():
    """The transform's module-registration hooks are global, and a forward that Dynamo
    traces can register modules (``self.layers[:-1]`` builds a ModuleList): the traced hook
    must not guard the compiled frame on the transform's weak table of watched modules,
    whose keys change whenever a watched module is collected."""
    import gc

    from optimus_lens.perf import trainable
    from optimus_lens.sample_models.lab import SwishMLP

    class Holder:  # stands for a TransformedModule, held weakly
        pass

    holder, watched = Holder(), [nn.Linear(2, 2)]
    trainable._watch(holder, watched[0])

    def backend(gm, example_inputs):
        watched.clear()
        gc.collect()  # the watched module goes while Dynamo still builds the frame's guards
        return gm.forward

    torch._dynamo.reset()
    model, x = SwishMLP(), torch.randn(8, 32)
    assert torch.allclose(torch.compile(model, backend=backend)(x), model(x))
    torch._dynamo.reset()
