"""Every sample model with a batch fusion, trained side by side: eager model vs optimus_lens.transform.

For each sample the model is built twice (seeded: the same weights) and made float64, one
copy transformed for training (packed parameters), and both are trained on the same
random batches:
SGD with momentum, Nesterov and weight decay, then AdamW, then Adam, each step
``zero_grad(set_to_none=True)``, forward, backward, ``clip_grad_norm_``, step. Losses,
parameters, gradients and optimizer state are compared at every step. Float64, because
the fused kernels (one ``baddbmm`` for many ``linear``s) round differently from eager, and
Adam's first steps move a parameter by about ``lr * sign(grad)``: in float32 a gradient
of 1e-9 against -1e-9 already moves a weight by 2e-3. Packing itself changes no bit
(``test_packing_changes_no_bit_of_training``). At the end the
transformed module's checkpoint loads into a fresh eager model, and the eager model's
into the transformed module. Parameter-free samples compare outputs and input gradients.
Small step counts keep the suite fast; ``benchmarks/train_packed.py`` is the long run.
"""

import copy
import io

import pytest
import torch

import optimus_lens
from optimus_lens.frontend.run import load_model, sample_list

#: paper scale (5,134 FX nodes, 128 towers): its pipeline alone takes tens of seconds here;
#: benchmarks/train_packed.py --samples industrial_recsys trains it side by side
SLOW = {"industrial_recsys"}
TOL = {"rtol": 1e-4, "atol": 1e-5}
OPTIMIZERS = [
    ("sgd", lambda ps: torch.optim.SGD(ps, lr=0.02, momentum=0.9, nesterov=True, weight_decay=1e-2), 3),
    ("adamw", lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.05), 2),
    ("adam", lambda ps: torch.optim.Adam(ps, lr=1e-3), 2),
]


def _double(model, inputs):
    model = model.double()
    return model, tuple(x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs)


def _batch(inputs, step: int):
    g = torch.Generator().manual_seed(1000 + step)
    return tuple(
        torch.randn(x.shape, generator=g, dtype=x.dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
        for x in inputs
    )


def _loss(out) -> torch.Tensor:
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return sum((o.float() ** 2).mean() for o in outs if isinstance(o, torch.Tensor) and o.is_floating_point())


def _roundtrip(sd):
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return torch.load(buf)


@pytest.mark.parametrize("name", [n for n, _, _ in sample_list() if n not in SLOW])
def test_sample_trains_the_same_transformed_as_eager(name):
    model, inputs = _double(*load_model(f"sample:{name}")[:2])
    eager = copy.deepcopy(model).train()
    t = optimus_lens.transform(model, inputs, verify="off")
    batch = [s.pattern for s in t.trace.steps if s.pass_name.startswith("batch_")]
    params = list(eager.parameters())
    if not batch and params:  # nothing packed: one step of loss and gradients against eager
        assert not t.groups, t.groups
        xs = _batch(inputs, 0)
        torch.manual_seed(0)
        la = _loss(eager(*xs))
        torch.manual_seed(0)
        lb = _loss(t(*xs))
        torch.testing.assert_close(lb, la, **TOL)
        if la.requires_grad:
            la.backward()
            lb.backward()
            for (n, pa), pb in zip(eager.named_parameters(), t.parameters()):
                assert (pa.grad is None) == (pb.grad is None), n
                if pa.grad is not None:
                    torch.testing.assert_close(pb.grad, pa.grad, **TOL, msg=n)
        return
    if not params:
        for step in range(2):
            xs = _batch(inputs, step)
            xa = tuple(
                x.clone().requires_grad_(x.is_floating_point()) if isinstance(x, torch.Tensor) else x for x in xs
            )
            xb = tuple(
                x.clone().requires_grad_(x.is_floating_point()) if isinstance(x, torch.Tensor) else x for x in xs
            )
            torch.manual_seed(step)
            la = _loss(eager(*xa))
            torch.manual_seed(step)
            lb = _loss(t(*xb))
            torch.testing.assert_close(lb, la, **TOL)
            if not la.requires_grad:  # the sample detaches its outputs
                continue
            wa = [x for x in xa if isinstance(x, torch.Tensor) and x.requires_grad]
            wb = [x for x in xb if isinstance(x, torch.Tensor) and x.requires_grad]
            for ga, gb in zip(torch.autograd.grad(la, wa), torch.autograd.grad(lb, wb)):
                torch.testing.assert_close(gb, ga, **TOL)
        return
    step = 0
    for label, make, steps in OPTIMIZERS:
        oa, ob = make(eager.parameters()), make(t.parameters())
        for _ in range(steps):
            xs = _batch(inputs, step)
            losses = []
            for m, o in ((eager, oa), (t, ob)):
                o.zero_grad(set_to_none=True)
                torch.manual_seed(step)
                loss = _loss(m(*xs))
                loss.backward()
                torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
                o.step()
                losses.append(loss.detach())
            torch.testing.assert_close(losses[1], losses[0], **TOL, msg=f"{label} step {step}: loss")
            for (n, pa), pb in zip(eager.named_parameters(), t.parameters()):
                torch.testing.assert_close(pb, pa, **TOL, msg=f"{label} step {step}: {n}")
                assert (pa.grad is None) == (pb.grad is None), f"{label} step {step}: {n}.grad"
                if pa.grad is not None:
                    torch.testing.assert_close(pb.grad, pa.grad, **TOL, msg=f"{label} step {step}: {n}.grad")
                for k, v in oa.state[pa].items():
                    torch.testing.assert_close(ob.state[pb][k], v, **TOL, msg=f"{label} step {step}: {n} {k}")
            step += 1
    assert not [e for e in t.events if "unpacked" in e or "own forward" in e], t.events
    # checkpoints cross over: the transformed module's into a fresh eager model, and back
    fresh = load_model(f"sample:{name}")[0].double()
    fresh.load_state_dict(_roundtrip(t.state_dict()))
    for (n, pa), pb in zip(fresh.named_parameters(), t.parameters()):
        torch.testing.assert_close(pa, pb, rtol=0, atol=0, msg=n)
    with torch.no_grad():
        for p in eager.parameters():
            p.mul_(0.5)
    t.load_state_dict(_roundtrip(eager.state_dict()))
    xs = _batch(inputs, 99)
    torch.manual_seed(0)
    ya = _loss(eager(*xs))
    torch.manual_seed(0)
    torch.testing.assert_close(_loss(t(*xs)), ya, **TOL)


@pytest.mark.parametrize("name", ["recsys_towers", "mmoe", "bert"])
def test_packing_changes_no_bit_of_training(name):
    """Float32, Adam: the packed module and the unpacked one (the same fused graph, stacking
    per call) give identical losses, parameters and gradients, bit for bit."""
    model, inputs, _ = load_model(f"sample:{name}")
    unpacked = optimus_lens.transform(copy.deepcopy(model), inputs, pack=False, verify="off")
    packed = optimus_lens.transform(model, inputs, verify="off")
    assert packed.groups
    oa, ob = torch.optim.Adam(unpacked.parameters(), lr=1e-3), torch.optim.Adam(packed.parameters(), lr=1e-3)
    for step in range(4):
        xs = _batch(inputs, step)
        losses = []
        for m, o in ((unpacked, oa), (packed, ob)):
            o.zero_grad(set_to_none=True)
            torch.manual_seed(step)
            loss = _loss(m(*xs))
            loss.backward()
            o.step()
            losses.append(loss.detach())
        assert torch.equal(losses[0], losses[1])
        for (n, pa), pb in zip(unpacked.named_parameters(), packed.parameters()):
            assert torch.equal(pa, pb), n
            assert torch.equal(pa.grad, pb.grad), n
