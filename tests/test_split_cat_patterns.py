"""The split/cat family of pattern passes (optimus/passes/normalize.py, split_cat/, einsum.py)
and the pipelines built from upstream-style options.

Each pattern is run on a teaching model or a small module captured with Dynamo, in the
style of upstream's test/inductor/test_split_cat_fx_passes.py: the number of steps, the
graph after, numerics after every step (``verify="step"``) and a replay of the recorded
deltas. The negative cases are where upstream is wrong or where a rewrite would be:
uneven splits, negative dims, reordered or gapped pieces, in-place mutation, dims two
apart, repeated einsum letters.
"""

from __future__ import annotations

import operator

import pytest
import torch
from torch import nn

from optimus_lens import sample_models
from optimus_lens.core.engine import Engine, RunOptions
from optimus_lens.core.pattern import REGISTRY, SearchOptions, why_not
from optimus_lens.core.pipeline import Pipeline
from optimus_lens.core.record import snapshot_graph
from optimus_lens.frontend.capture import capture
from optimus_lens.passes import BATCH_PASSES, PATTERN_PASSES, default_pipeline, pattern_pass, upstream_pipeline

ALL_PATTERN_PASSES = {name: {"threshold_to_cat": 2} for name in PATTERN_PASSES}


class Fn(nn.Module):
    """Wraps a plain function of tensors as a module for capture."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def run(model, inputs, pipeline):
    """Capture, run ``pipeline`` (a Pipeline or an upstream options dict) with per-step
    verification; check every step verified and the replayed trace equals the graph.
    Returns (trace, graph module after)."""
    if isinstance(model, str):
        model, inputs = sample_models.get(model)
    c = capture(model, inputs)
    if not isinstance(pipeline, Pipeline):
        pipeline = upstream_pipeline(pipeline)
    trace = Engine(c.gm, c.example_inputs, pipeline, RunOptions(verify="step")).run()
    failed = [(s.index, s.pattern, s.error or s.verify.message) for s in trace.steps if s.failed]
    assert not failed, failed
    assert trace.final_verify.ok is not False
    assert trace.graph_at(len(trace.steps)).signature() == snapshot_graph(c.gm.graph).signature()
    return trace, c.gm


def nodes(gm, *targets):
    return [n for n in gm.graph.nodes if n.target in targets]


def patterns(trace):
    return [s.pattern for s in trace.steps]


def only(node_list):
    assert len(node_list) == 1, node_list
    return node_list[0]


SPLITS = (torch.split, torch.Tensor.split, "split")
CATS = (torch.cat, torch.concat, torch.concatenate)


# =========================================================================== normalization_pass


def test_normalize_split_method_form_negative_dim():
    trace, gm = run(Fn(lambda x: [p * 2 for p in x.split(2, -1)]), (torch.randn(4, 6),), {"normalization_pass": {}})
    assert patterns(trace) == ["normalize_split"]
    s = only(nodes(gm, *SPLITS))
    assert s.op == "call_function" and s.target is torch.split
    assert s.args[1] == [2, 2, 2] and dict(s.kwargs) == {"dim": 1}


def test_normalize_uneven_split_keeps_true_sizes():
    """split(x, 4, dim=1) on width 10 is [4, 4, 2] (upstream's aten normalisation gives [4, 4, 4])."""
    trace, gm = run(
        Fn(lambda x: [p + 1 for p in torch.split(x, 4, dim=1)]), (torch.randn(3, 10),), {"normalization_pass": {}}
    )
    assert patterns(trace) == ["normalize_split"]
    s = only(nodes(gm, *SPLITS))
    assert s.args[1] == [4, 4, 2] and dict(s.kwargs) == {"dim": 1}


def test_normalize_unbind_cat_concat_concatenate_stack():
    def f(x):
        u = x.unbind(-1)
        a = torch.concat(u, -1)
        b = torch.concatenate(list(u), axis=0)
        c = torch.stack(list(u), -1)
        return a, b, c

    trace, gm = run(Fn(f), (torch.randn(2, 3, 4),), {"normalization_pass": {}})
    assert sorted(patterns(trace)) == ["normalize_cat", "normalize_cat", "normalize_stack", "normalize_unbind"]
    u = only(nodes(gm, torch.unbind, "unbind"))
    assert u.target is torch.unbind and dict(u.kwargs) == {"dim": 2}
    cats = nodes(gm, *CATS)
    assert {c.target for c in cats} == {torch.cat}
    assert sorted(c.kwargs["dim"] for c in cats) == [0, 1] and all(len(c.args) == 1 for c in cats)
    assert dict(only(nodes(gm, torch.stack)).kwargs) == {"dim": 2}


def test_normalize_leaves_canonical_forms_alone():
    """Upstream rewrites (and counts) every unbind and stack even when already canonical."""

    def f(x):
        a, b = torch.split(x, [3, 3], dim=1)
        u = torch.unbind(x, dim=0)
        return torch.cat([b, a], dim=1), torch.stack(list(u), dim=0)

    trace, _ = run(Fn(f), (torch.randn(2, 6),), {"normalization_pass": {}})
    assert trace.steps == []


def test_normalize_runs_first_and_only_when_named():
    p = upstream_pipeline({"split_cat_pass": {}, "normalization_pass": {}})
    assert p.names() == ["normalization_pass", "split_cat_pass"]
    assert "normalization_pass" not in upstream_pipeline({"split_cat_pass": {}}).names()


# =========================================================================== remove_split_with_size_one_pass


def test_remove_split_with_size_one_on_teaching_model():
    trace, gm = run("teach_split_size_one", None, {"remove_split_with_size_one_pass": {}})
    assert patterns(trace) == ["remove_split_with_size_one"]
    split = only(nodes(gm, *SPLITS))  # the real two-piece split stays
    assert split.args[0].name == "l_y_"
    relu = only(nodes(gm, torch.relu))
    assert relu.args[0].op == "placeholder"


# =========================================================================== merge_splits_pass


def test_merge_splits_normalises_negative_dim_before_comparing():
    """The inner split is written dim=-1, the outer dim=1: the same dim, so they merge."""
    trace, gm = run("teach_merge_splits", None, {"merge_splits_pass": {}})
    assert patterns(trace) == ["merge_splits"]
    s = only(nodes(gm, *SPLITS))
    assert s.args[1] == [8, 8, 8, 8] and s.kwargs["dim"] == 1 and s.args[0].op == "placeholder"
    assert sorted(u.args[1] for u in s.users) == [0, 1, 2, 3]


def test_merge_splits_refuses_other_dim_and_shared_piece():
    def f(x):
        a0, a1 = torch.split(x, [2, 2], dim=0)
        b0, b1 = torch.split(a1, [3, 3], dim=1)  # another dim: not one split
        c0, c1 = torch.split(x, [1, 3], dim=0)
        d0, d1 = torch.split(c1, [1, 2], dim=0)  # c1 is also used below
        return a0, b0 * b1, c0, d0 + d1, c1

    trace, gm = run(Fn(f), (torch.randn(4, 6),), {"merge_splits_pass": {}})
    assert trace.steps == []
    assert len(nodes(gm, *SPLITS)) == 4


# =========================================================================== split_cat_pass


def test_simplify_split_cat_merges_runs_between_other_inputs():
    trace, gm = run("teach_simplify_split_cat", None, {"split_cat_pass": {}})
    assert patterns(trace) == ["simplify_split_cat"]
    s = only(nodes(gm, *SPLITS))
    assert s.args[1] == [4, 12, 4, 12] and s.kwargs["dim"] == 1
    cat = only(nodes(gm, *CATS))
    assert len(cat.args[0]) == 5 and [t.name for t in cat.args[0]].count("l_o_") == 3


def test_simplify_split_cat_whole_split_in_order_is_the_input():
    def f(x):
        return torch.cat(torch.split(x, [2, 3, 5], dim=1), dim=1) * 2

    trace, gm = run(Fn(f), (torch.randn(4, 10),), {"split_cat_pass": {}})
    assert patterns(trace) == ["simplify_split_cat"]
    assert not nodes(gm, *SPLITS) and not nodes(gm, *CATS)


@pytest.mark.parametrize("op,dim", [(torch.stack, 1), (torch.stack, 3), (torch.cat, 2), (torch.cat, 0)])
def test_simplify_split_cat_runs_in_stacks_and_cats_on_other_dims(op, dim):
    def f(x, o):
        s = torch.split(x, 2, dim=1)
        return op([o, s[1], s[2], s[3], o], dim=dim), s[0] * 2

    trace, gm = run(Fn(f), (torch.randn(2, 8, 3), torch.randn(2, 2, 3)), {"split_cat_pass": {}})
    assert patterns(trace) == ["simplify_split_cat"]
    assert only(nodes(gm, *SPLITS)).args[1] == [2, 6]
    assert only(nodes(gm, torch.unflatten)).args[1:] == (1, (3, 2))


def test_merge_split_squeeze_becomes_unbind():
    def f(x):
        return torch.stack([torch.squeeze(s, 1) for s in torch.split(x, 1, dim=1)]) * 1

    trace, gm = run(Fn(f), (torch.randn(2, 5),), {"split_cat_pass": {}, "unbind_stack_pass": {}})
    assert patterns(trace) == ["merge_split_squeeze", "merge_unbind_stack"]
    assert not nodes(gm, *SPLITS, torch.squeeze, torch.unbind, torch.stack)


@pytest.mark.parametrize("squeeze", [lambda s: s.squeeze(0), lambda s: s.squeeze()])
def test_merge_split_squeeze_needs_squeezes_on_the_split_dim(squeeze):
    def f(x):
        return torch.stack([squeeze(s) for s in torch.split(x, 1, dim=1)])

    trace, _ = run(Fn(f), (torch.randn(2, 5),), {"split_cat_pass": {}})
    assert "merge_split_squeeze" not in patterns(trace)


def test_simplify_split_cat_leaves_reordered_and_gapped_cats():
    def f(x):
        s = torch.split(x, 4, dim=1)  # [4, 4, 2] on width 10
        return torch.cat([s[2], s[1], s[0]], dim=1), torch.cat([s[0], s[2]], dim=1)

    trace, gm = run(Fn(f), (torch.randn(3, 10),), {"split_cat_pass": {}})
    assert trace.steps == []
    assert len(nodes(gm, *CATS)) == 2


# =========================================================================== merge_getitem_cat_pass / mutate_cat_pass


def test_merge_getitem_cat_makes_one_wider_piece():
    trace, gm = run("teach_cat_of_pieces", None, {"merge_getitem_cat_pass": {}})
    assert patterns(trace) == ["merge_getitem_cat"]
    assert not nodes(gm, *CATS)
    s = only(nodes(gm, *SPLITS))
    assert s.args[1] == [4, 12, 4, 4]


def test_mutate_cat_turns_consecutive_pieces_into_a_slice():
    trace, gm = run("teach_cat_of_pieces", None, {"mutate_cat_pass": {}})
    assert patterns(trace) == ["mutate_cat"]
    assert not nodes(gm, *CATS)
    n = only(nodes(gm, torch.narrow))
    assert n.args[1:] == (1, 4, 12)


def test_mutate_cat_every_piece_is_the_input_uneven_split():
    def f(x):
        return torch.cat(list(torch.split(x, 4, dim=-1)), dim=1) + 1

    trace, gm = run(Fn(f), (torch.randn(3, 10),), {"mutate_cat_pass": {}})
    assert patterns(trace) == ["mutate_cat"]
    add = only(nodes(gm, operator.add))
    assert add.args[0].op == "placeholder"


# =========================================================================== unbind_stack_pass


def test_unbind_stack_pass_on_teaching_model():
    trace, gm = run("teach_split_cat", None, {"unbind_stack_pass": {}})
    assert patterns(trace) == ["merge_unbind_stack"]
    assert not nodes(gm, torch.stack) and not nodes(gm, torch.unbind)
    assert only(nodes(gm, "output")).args[0][2].args[1].op == "placeholder"  # 2 * c reads y itself


def test_merge_unbind_stack_other_dims_extra_entries_and_two_users():
    def f(y, o):
        u = torch.unbind(y, 1)
        return torch.cat([o, *u, o], dim=1), torch.stack([o, *u, o], dim=2), torch.stack(u, 0)

    trace, gm = run(Fn(f), (torch.randn(2, 4, 3), torch.randn(2, 3)), {"unbind_stack_pass": {}})
    assert patterns(trace) == ["merge_unbind_stack"]  # one step for the unbind and all its users
    assert not nodes(gm, torch.unbind)
    assert len(nodes(gm, *CATS)) == 2 and len(nodes(gm, torch.stack)) == 2  # [o] before and after the block


def test_merge_unbind_stack_refuses_partial_use():
    def f(y):
        u = torch.unbind(y, 1)
        return torch.stack(u, 1), u[0] + 1

    trace, _ = run(Fn(f), (torch.randn(2, 4, 3),), {"unbind_stack_pass": {}})
    assert trace.steps == []


# =========================================================================== split_cat_to_slices_pass


def test_split_cat_to_slices_default_threshold():
    trace, gm = run("teach_split_cat_to_slices", None, {"split_cat_to_slices_pass": {}})
    assert patterns(trace) == ["split_cat_to_slices"]
    cat = only(nodes(gm, *CATS))
    assert len(cat.args[0]) == 5  # slice of 12 pieces, relu, 3 pieces left alone
    assert cat.args[0][0].target is torch.narrow and cat.args[0][0].args[1:] == (1, 0, 48)


@pytest.mark.parametrize("threshold,inputs,steps", [(3, 3, 1), (20, 16, 0)])
def test_split_cat_to_slices_threshold_option(threshold, inputs, steps):
    trace, gm = run("teach_split_cat_to_slices", None, {"split_cat_to_slices_pass": {"threshold_to_cat": threshold}})
    assert len(trace.steps) == steps
    assert len(only(nodes(gm, *CATS)).args[0]) == inputs


def test_split_cat_to_slices_ignores_pieces_cat_on_another_dim():
    """Upstream slices along the split dim whatever the cat's dim is."""

    def f(x):
        return torch.cat(torch.split(x, 1, dim=1), dim=0)

    trace, gm = run(Fn(f), (torch.randn(4, 12),), {"split_cat_to_slices_pass": {"threshold_to_cat": 2}})
    assert trace.steps == []
    assert len(only(nodes(gm, *CATS)).args[0]) == 12


# =========================================================================== unbind_cat_to_view_pass


def test_unbind_cat_to_view_on_teaching_model():
    trace, gm = run("teach_unbind_stack", None, {"unbind_cat_to_view_pass": {}})
    assert patterns(trace) == ["unbind_cat_to_view"]
    assert not nodes(gm, *CATS)
    assert only(nodes(gm, torch.flatten)).args[1:] == (1, 2)


@pytest.mark.parametrize("unbind_dim,cat_dim", [(2, 0), (0, 2), (3, 1), (1, 0)])
def test_unbind_cat_to_view_dims_far_apart(unbind_dim, cat_dim):
    """Upstream swaps the two dims with a permute, wrong when they are two or more apart."""

    def f(y):
        return torch.cat(torch.unbind(y, unbind_dim), dim=cat_dim)

    trace, gm = run(Fn(f), (torch.randn(2, 3, 4, 5),), {"unbind_cat_to_view_pass": {}})
    assert patterns(trace) == ["unbind_cat_to_view"]
    assert not nodes(gm, *CATS)


def test_unbind_cat_to_view_partial_run_over_threshold():
    def f(y, w):
        u = torch.unbind(y, 1)
        return torch.cat([w, *u[1:5], w], dim=1) * 1, u[0] + u[5]

    trace, gm = run(
        Fn(f), (torch.randn(3, 6, 2), torch.randn(3, 2)), {"unbind_cat_to_view_pass": {"threshold_to_cat": 4}}
    )
    assert patterns(trace) == ["unbind_cat_to_view"]
    assert len(only(nodes(gm, *CATS)).args[0]) == 3


# =========================================================================== split_stack_to_cats_pass / unbind_stack_to_slices_pass


def test_split_stack_to_cats_on_teaching_model():
    trace, gm = run("teach_split_stack", None, {"split_stack_to_cats_pass": {}})
    assert patterns(trace) == ["split_stack_to_cats"]
    assert len(nodes(gm, torch.stack)) == 1  # the unbind's stack is left for its own pass
    assert not nodes(gm, *SPLITS)


@pytest.mark.parametrize("stack_dim", [0, 1, 2, -1])
def test_split_stack_to_cats_any_stack_dim(stack_dim):
    def f(x):  # read by the product: stack dim 1 makes a view of x (refused as an output, see below)
        return 2 * torch.stack(torch.split(x, 2, dim=1), dim=stack_dim)

    trace, gm = run(Fn(f), (torch.randn(2, 6, 5),), {"split_stack_to_cats_pass": {}})
    assert patterns(trace) == ["split_stack_to_cats"]
    assert not nodes(gm, torch.stack) and not nodes(gm, *SPLITS)


def test_split_stack_partial_run_keeps_other_entries_in_order():
    def f(x, w):
        s = torch.split(x, 2, dim=1)
        return torch.stack([w, *s[:3], w, s[3]], dim=1)

    trace, gm = run(
        Fn(f), (torch.randn(4, 8), torch.randn(4, 2)), {"split_stack_to_cats_pass": {"threshold_to_cat": 3}}
    )
    assert patterns(trace) == ["split_stack_to_cats"]
    cat = only(nodes(gm, *CATS))
    assert len(cat.args[0]) == 3 and cat.kwargs["dim"] == 1


def test_unbind_stack_to_slices_on_teaching_model():
    trace, gm = run("teach_split_stack", None, {"unbind_stack_to_slices_pass": {}})
    assert patterns(trace) == ["unbind_stack_to_slices"]
    cat = only(nodes(gm, *CATS))
    assert [a.target for a in cat.args[0]] == [torch.movedim, torch.stack]
    assert only(nodes(gm, torch.narrow)).args[1:] == (0, 0, 11)


# =========================================================================== move_reshape_out_of_split_stack_pass


def test_move_reshape_out_of_split_stack_on_teaching_model():
    trace, gm = run("teach_reshape_split_stack", None, {"move_reshape_out_of_split_stack_pass": {}})
    assert patterns(trace) == ["move_reshape_out_of_split_stack"]
    assert not nodes(gm, torch.stack) and not nodes(gm, *SPLITS)
    assert only(nodes(gm, torch.reshape)).args[1] == (12, 8, 2, 2)
    assert not [n for n in gm.graph.nodes if n.op == "call_method"]


@pytest.mark.parametrize("stack_dim", [0, 2])
def test_move_reshape_out_of_split_stack_other_dims(stack_dim):
    def f(x):
        return torch.stack([p.reshape(3, 4) for p in torch.split(x, 2, dim=1)], dim=stack_dim)

    trace, _ = run(Fn(f), (torch.randn(6, 8),), {"move_reshape_out_of_split_stack_pass": {}})
    assert patterns(trace) == ["move_reshape_out_of_split_stack"]


# =========================================================================== einsum_to_pointwise_pass


def test_einsum_to_pointwise_on_teaching_model():
    trace, gm = run("teach_einsum", None, {"einsum_to_pointwise_pass": {}})
    assert patterns(trace) == ["einsum_to_pointwise"]
    assert not nodes(gm, torch.einsum)
    assert only(nodes(gm, torch.sum)).args[1] == -2


@pytest.mark.parametrize(
    "eq,shapes",
    [
        ("bcc,bccd->bcd", ((2, 3, 3), (2, 3, 3, 4))),  # repeated letter: einsum takes a diagonal
        ("bcd,bcde->bcd", ((2, 3, 4), (2, 3, 4, 4))),  # not the pattern
    ],
)
def test_einsum_to_pointwise_refuses_other_equations(eq, shapes):
    from torch._inductor.fx_passes.split_cat import match_einsum_strings

    assert match_einsum_strings(eq) == (eq == "bcc,bccd->bcd")  # upstream would rewrite the first
    x, w = (torch.randn(s) for s in shapes)
    trace, gm = run(Fn(lambda x, w: torch.einsum(eq, x, w) + 1), (x, w), {"einsum_to_pointwise_pass": {}})
    assert trace.steps == []
    assert nodes(gm, torch.einsum)


def test_einsum_to_pointwise_needs_an_add_user():
    trace, _ = run(
        Fn(lambda x, w: torch.einsum("bcd,bcde->bce", x, w) * 2),
        (torch.randn(2, 3, 4), torch.randn(2, 3, 4, 5)),
        {"einsum_to_pointwise_pass": {}},
    )
    assert trace.steps == []


# =========================================================================== never an identity, never near a mutation


def test_reordered_uneven_pieces_are_never_the_identity():
    """teach_split_cat's ``b``: an uneven split cat'ed in reverse survives every pass."""
    trace, gm = run("teach_split_cat", None, {"normalization_pass": {}, **ALL_PATTERN_PASSES})
    out = only(nodes(gm, "output")).args[0]
    assert out[0].args[1].op == "placeholder"  # 2 * a: the in-order cat is the identity
    b = out[1]
    assert b.target is torch.cat and [t.args[1] for t in b.args[0]] == [2, 1, 0]
    assert only(nodes(gm, *SPLITS)).args[1] == [4, 4, 2]


def test_gapped_pieces_are_never_the_identity():
    def f(x):
        s = torch.split(x, 2, dim=1)
        return torch.cat([s[0], s[2]], dim=1), torch.cat([s[1], s[0], s[2]], dim=1)

    trace, gm = run(Fn(f), (torch.randn(3, 6),), {"normalization_pass": {}, **ALL_PATTERN_PASSES})
    assert not [s for s in trace.steps if not s.pattern.startswith("normalize")]
    assert all(o.target is torch.cat for o in only(nodes(gm, "output")).args[0])


MUTATED = {
    "cat output": lambda x: torch.cat(torch.split(x, 2, dim=1), dim=1).add_(1),
    "split input": lambda x: (lambda y: (torch.cat(torch.split(y, 2, dim=1), dim=1), y.mul_(2)))(x * 1),
    "split piece": lambda x: (lambda s: (torch.cat(list(s), dim=1), s[0].add_(1)))(torch.split(x * 1, 2, dim=1)),
    "stack output": lambda x: torch.stack(torch.unbind(x, 1), 1).sub_(1),
    "unbind input view": lambda x: (lambda y: (torch.cat(torch.unbind(y, 1), 0), y.view(-1).mul_(3)))(x * 1),
    "split of a split": lambda x: (lambda a: (torch.cat(torch.split(a[1], 2, dim=1), dim=1), a[0].relu_()))(
        torch.split(x * 1, [2, 4], dim=1)
    ),
    "single-piece split": lambda x: (lambda y: (torch.split(y, 6, dim=1)[0] + 1, y.add_(1)))(x * 1),
    "stack of unbind, input view": lambda x: (lambda y: (torch.stack(torch.unbind(y, 1), 1), y.view(-1).mul_(3)))(
        x * 1
    ),
    "unbind of stack, piece": lambda x: (lambda u: (u[0].add_(1), u[1], x))(torch.unbind(torch.stack([x, x * 2]), 0)),
    "split of cat, input": lambda x: (lambda y: (torch.split(torch.cat([y, x], 1), 6, 1)[0] * 1, y.add_(1)))(x * 1),
}


def every_split_cat_pass() -> Pipeline:
    """normalization_pass, every split/cat pattern pass (threshold 2) and the identity cleanup."""
    cleanup = [p for p in default_pipeline().passes if p.name == "split_cat_cleanup"]
    return Pipeline(upstream_pipeline({"normalization_pass": {}, **ALL_PATTERN_PASSES}).passes + cleanup)


@pytest.mark.parametrize("case", list(MUTATED))
def test_nothing_is_rewritten_near_an_in_place_mutation(case):
    trace, gm = run(Fn(MUTATED[case]), (torch.randn(3, 6),), every_split_cat_pass())
    assert [s.pattern for s in trace.steps if not s.pattern.startswith("normalize")] == []


def test_same_models_without_mutation_are_rewritten():
    """The control for the mutation cases: without the in-place write each one fires."""
    for f in (
        lambda x: torch.cat(torch.split(x, 2, dim=1), dim=1) + 1,
        lambda x: torch.stack(torch.unbind(x, 1), 1) - 1,
        lambda x: (lambda u: (u[0] + 1, u[1], x))(torch.unbind(torch.stack([x, x * 2]), 0)),
        lambda x: (lambda y: (torch.split(torch.cat([y, x], 1), 6, 1)[0] * 1, y + 1))(x * 1),
    ):
        trace, _ = run(Fn(f), (torch.randn(3, 6),), every_split_cat_pass())
        assert [s for s in trace.steps if not s.pattern.startswith("normalize")]


# =========================================================================== pipelines


def test_upstream_pipeline_order_and_options():
    p = upstream_pipeline(
        {
            "merge_splits_pass": {"counter": 2},
            "batch_linear": {"min_fuse_set_size": 2, "require_fbgemm": False},
            "split_cat_to_slices_pass": {"threshold_to_cat": 3},
            "batch_layernorm": {},
            "normalization_pass": {},
            "unbind_stack_to_slices_pass": {},
        }
    )
    assert p.names() == [
        "normalization_pass",
        "batch_linear",
        "batch_layernorm",
        "merge_splits_pass",
        "split_cat_to_slices_pass",
        "unbind_stack_to_slices_pass",
    ]
    by = {q.name: q for q in p.passes}
    assert by["batch_linear"].options == SearchOptions(min_fuse_set_size=2, search="upstream")
    assert by["batch_layernorm"].options == REGISTRY["batch_layernorm"].options.replace(search="upstream")
    assert by["split_cat_to_slices_pass"].patterns[0].threshold_to_cat == 3
    assert by["unbind_stack_to_slices_pass"].patterns[0].threshold_to_cat == 10
    assert REGISTRY["split_cat_to_slices"].threshold_to_cat == 10  # the registered pattern is unchanged


def test_upstream_pipeline_rejects_unknown_names():
    with pytest.raises(KeyError, match="batch_relux"):
        upstream_pipeline({"batch_relux": {}})
    with pytest.raises(KeyError, match="'batch_aten_relu' is a post-grad fusion option"):
        upstream_pipeline({"batch_aten_relu": {}})
    with pytest.raises(ValueError):
        pattern_pass("split_cat_to_slices_pass", threshold_to_cat=0)


def test_upstream_pipeline_fuses_then_cleans_up():
    trace, gm = run(
        "teach_batch_relu",
        None,
        {"normalization_pass": {}, "batch_relu": {}, "split_stack_to_cats_pass": {}, "unbind_cat_to_view_pass": {}},
    )
    assert patterns(trace) == ["normalize_split", "batch_relu", "split_stack_to_cats", "unbind_cat_to_view"]
    assert not nodes(gm, torch.stack, torch.unbind, *CATS, *SPLITS)


def test_default_pipeline_order():
    names = default_pipeline().names()
    assert names[0] == "normalization_pass"
    last_batch = max(names.index(b) for b in BATCH_PASSES)
    assert names.index("split_cat_cleanup") > last_batch
    assert names.index("split_cat_pass") > names.index("split_cat_cleanup")


@pytest.mark.parametrize(
    "name",
    [
        "teach_simplify_split_cat",
        "teach_split_stack",
        "teach_merge_splits",
        "teach_reshape_split_stack",
        "teach_batch_linear",
    ],
)
def test_default_pipeline_verifies_every_step(name):
    trace, _ = run(name, None, default_pipeline())
    assert trace.steps and trace.nodes_after < trace.nodes_before


def test_every_split_cat_pattern_is_documented():
    for name in {n for ps in PATTERN_PASSES.values() for n in ps}:
        p = REGISTRY[name]
        assert p.description and p.preconditions and p.upstream and p.source, name
        assert p.anchors, name


@pytest.mark.parametrize("name", ["teach_split_cat", "teach_split_stack", "teach_einsum", "recsys_towers"])
def test_why_not_answers_on_every_node(name):
    """Asking any split/cat pattern about any node never raises, and a pattern only says
    it applies at the ops it starts from."""
    gm = capture(*sample_models.get(name)).gm
    names = {n for ps in PATTERN_PASSES.values() for n in ps} | {
        "remove_unbind_stack",
        "remove_stack_unbind",
        "remove_split_cat",
        "remove_cat_split",
    }
    for pname in sorted(names):
        p = REGISTRY[pname]
        for node in gm.graph.nodes:
            reason = why_not(p, node)
            target = node.target if node.op in ("call_function", "call_method") else None
            if target not in p.anchors:
                assert reason, (pname, node.name)
