"""The per-step estimate (kernels saved, bytes copied) and the option that skips unprofitable fusions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from optimus_lens.core.engine import Engine, RunOptions
from optimus_lens.core.pattern import SearchOptions
from optimus_lens.core.pipeline import Pass, Pipeline
from optimus_lens.frontend.capture import capture
from optimus_lens.passes import REGISTRY
from optimus_lens.passes.profit import (
    BYTES_PER_US,
    KERNEL_US,
    cancelled_stack,
    group_estimate,
    pass_estimates,
    step_estimate,
)


class FiveRelus(nn.Module):
    def forward(self, a, b, c, d, e):
        return [F.relu(x) + 1 for x in (a, b, c, d, e)]


def _run(shape, profitable_only: bool):
    inputs = tuple(torch.randn(shape) for _ in range(5))
    c = capture(FiveRelus(), inputs)
    opts = SearchOptions(profitable_only=profitable_only)
    pipe = Pipeline([Pass("batch_relu", [REGISTRY["batch_relu"]], options=opts, estimate=group_estimate)])
    return Engine(c.gm, c.example_inputs, pipe, RunOptions(verify="end")).run()


def test_a_batch_relu_step_saves_n_minus_2_kernels_and_copies_one_stack():
    trace = _run((2, 4), profitable_only=False)
    (step,) = trace.steps
    e = step_estimate(trace, 1)
    assert e.kernels_saved == 5 - 2  # five relus -> stack + relu (unbind and getitems are views)
    assert e.bytes_copied == 5 * 2 * 4 * 4  # the stack's output, fp32
    assert e.us == 3 * KERNEL_US - 160 / BYTES_PER_US and e.profitable
    assert pass_estimates(trace)["batch_relu"].kernels_saved == 3


def test_profitable_only_fuses_small_members_and_skips_members_whose_stack_costs_more():
    assert len(_run((2, 4), profitable_only=True).steps) == 1
    big = _run((512, 512), profitable_only=True)  # a 5 MiB stack per call for 3 launches saved
    assert big.steps == [] and big.final_verify.ok
    assert len(_run((512, 512), profitable_only=False).steps) == 1


def test_a_pass_that_fuses_only_profitable_groups_without_an_estimate_is_refused():
    """The engine judges profitability with the pass's own estimate (the catalogue gives
    its passes ``group_estimate``); without one it says so before running."""
    c = capture(FiveRelus(), tuple(torch.randn(2, 4) for _ in range(5)))
    opts = SearchOptions(profitable_only=True)
    pipe = Pipeline([Pass("batch_relu", [REGISTRY["batch_relu"]], options=opts)])
    with pytest.raises(ValueError, match="no estimate"):
        Engine(c.gm, c.example_inputs, pipe, RunOptions(verify="off"))
    upstream = Pipeline([Pass("batch_relu", [REGISTRY["batch_relu"]], options=opts.replace(search="upstream"))])
    Engine(c.gm, c.example_inputs, upstream, RunOptions(verify="off"))  # upstream's search never asks


class _Restack(nn.Module):
    def forward(self, x):
        u = torch.unbind(x, 1)  # each stack read, not returned: a returned x would alias the input
        stacks = torch.stack(u, 1), torch.stack(u[:2], 1), torch.stack(u, 0), torch.stack([u[1], u[0], u[2]], 1)
        return tuple(torch.relu(s) for s in stacks)


def test_a_stack_of_every_unbind_piece_in_order_on_its_dim_costs_nothing():
    """group_estimate does not charge the stack that remove_unbind_stack cancels (a fusion
    consuming the previous fusion's pieces stacks them back); any other stack is a copy."""
    c = capture(_Restack(), (torch.randn(4, 3, 5),))
    stacks = [n for n in c.gm.graph.nodes if n.target is torch.stack]
    assert [cancelled_stack(n) for n in stacks] == [True, False, False, False]
