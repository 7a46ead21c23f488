"""Which graph outputs overlap the inputs or each other (optimus_lens.core.outputs), where
example values do not show it: a node that returns its input itself, and a view whose input
an earlier or the current step replaced. Each case: eager against the rewritten program
(tests/oracle.py) and the refusal's reason."""

from __future__ import annotations

import oracle
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from optimus_lens import RunOptions, run_pipeline
from optimus_lens.frontend.capture import capture
from optimus_lens.frontend.run import optimize


def rewrite(gm, example_inputs) -> int:
    return len(run_pipeline(gm, example_inputs, None, RunOptions(verify="off")).steps)


class EvalDropouts(torch.nn.Module):
    """cat of eval-mode dropouts of the pieces of x: eager returns a fresh tensor; after
    batch_dropout and simplify_split_cat, unbind_cat_to_view would return a view of x
    (an eval-mode dropout returns its input itself)."""

    def forward(self, x):
        return torch.cat([F.dropout(p, 0.5, False) for p in torch.split(x, [2, 2, 2, 2, 2, 2], dim=1)], dim=1)


class ScaledNorms(torch.nn.Module):
    """Two outputs: every branch reshaped after the cat, and branch 0 reshaped on its own.
    Eager's two outputs share no memory; after batch_mul both would be views of one stacked
    tensor if unbind_cat_to_view turned the cat into a view (with a batch of 1 the moved and
    flattened stack is a view, not a copy)."""

    def __init__(self):
        super().__init__()
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(4) for _ in range(3))
        self.register_buffer("scale", torch.tensor(1.5))

    def forward(self, x):
        ys = [n(p) * self.scale for n, p in zip(self.norms, x.split([4, 4, 4], dim=1))]
        return torch.cat(ys, dim=1).reshape(-1), ys[0].reshape(-1)


def factory(cls, width):
    def make():
        torch.manual_seed(0)
        return cls().eval(), (torch.randn(1, width),)

    return make


def steps_of(cls, width):
    model, inputs = factory(cls, width)()
    return optimize(model, inputs, verify="step").trace.steps


def test_a_cat_of_eval_mode_dropouts_stays_a_fresh_tensor_not_a_view_of_the_input():
    assert oracle.differs(factory(EvalDropouts, 12), rewrite)[0] is None
    steps = steps_of(EvalDropouts, 12)
    assert [s.pattern for s in steps] == ["batch_dropout", "simplify_split_cat"]
    assert all(s.error is None and s.verify.ok for s in steps)


def test_two_outputs_do_not_become_views_of_one_stacked_tensor():
    assert oracle.differs(factory(ScaledNorms, 12), rewrite)[0] is None
    steps = steps_of(ScaledNorms, 12)
    assert "unbind_cat_to_view" not in [s.pattern for s in steps]
    assert all(s.error is None and s.verify.ok for s in steps)


def test_the_refusal_names_the_outputs_that_would_overlap():
    from optimus_lens.core.pattern import REGISTRY, why_not

    model, inputs = factory(ScaledNorms, 12)()
    gm = capture(model, inputs).gm
    run_pipeline(gm, inputs, None, RunOptions(verify="off"))
    cat = next(n for n in gm.graph.nodes if n.target is torch.cat)
    miss = why_not(REGISTRY["unbind_cat_to_view"], cat)
    assert "graph output 0 would overlap output 1 where it overlapped nothing" in str(miss)


def test_a_view_whose_input_a_step_replaced_gets_a_value_in_the_new_storage():
    model, inputs = factory(ScaledNorms, 12)()
    gm = capture(model, inputs).gm
    run_pipeline(gm, inputs, None, RunOptions(verify="off"))
    out = next(n for n in gm.graph.nodes if n.op == "output")
    view = out.args[0][1]  # ys[0].reshape(-1): its input is now a piece of the batched mul
    piece = view.args[0]
    assert piece.target is not torch.mul and piece.target.__name__ == "getitem"
    got, src = view.meta["example_value"], piece.meta["example_value"]
    assert got.untyped_storage()._cdata == src.untyped_storage()._cdata


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.none(),
            st.tuples(st.sampled_from("ab"), st.integers(0, 20), st.sampled_from([0, 1, 2, 5, 30])).map(
                lambda t: (t[0], t[1], t[1] + t[2]) if t[2] else (t[0], 0, 0)  # storage_span's empty span
            ),
        ),
        max_size=14,
    )
)
def test_the_overlap_sweep_finds_what_comparing_every_pair_finds(spans):
    from optimus_lens.core.outputs import _by_storage, _overlap, _overlapping

    found: dict = {}
    for group in _by_storage(spans).values():
        _overlapping(group, found)
    for i, s in enumerate(spans):
        want = tuple(j for j, t in enumerate(spans) if s is not None and j != i and _overlap(s, t))
        assert tuple(sorted(found.get(i, ()))) == want
