"""optimus_lens.core.lang: the declarative match language — bindings, argument binding across spellings,
repeated captures, pieces of a split, predicates, and the near-miss reasons it gives."""

from __future__ import annotations

import torch
import torch.nn as nn

from optimus_lens.core.lang import ANY, Const, Each, Op, Pieces, Var, bind, match, require
from optimus_lens.core.miss import Miss
from optimus_lens.frontend.capture import capture
from optimus_lens.passes.common import CAT, LINEAR, SPLIT

SPLIT_CAT = Op(CAT, Pieces(Op(SPLIT, Var("x"), dim=Var("d")), name="pieces"), dim=Var("d"), name="cat")


class SplitCat(nn.Module):
    def __init__(self, cat_dim=1, take=None, reorder=False):
        super().__init__()
        self.cat_dim, self.take, self.reorder = cat_dim, take, reorder

    def forward(self, x):
        parts = list(torch.split(x, 2, dim=1))
        if self.reorder:
            parts = parts[::-1]
        if self.take:
            parts = parts[: self.take]
        return torch.cat(parts, self.cat_dim) + 1


def _node(gm, target):
    return next(n for n in gm.graph.nodes if n.op == "call_function" and n.target is target)


def _gm(model, *inputs):
    torch._dynamo.reset()
    return capture(model, inputs).gm


def test_split_cat_identity_binds_the_split_input_the_dim_and_every_piece():
    gm = _gm(SplitCat(), torch.randn(3, 6))
    b = match(SPLIT_CAT, _node(gm, torch.cat))
    assert not isinstance(b, Miss), b
    assert b["x"].op == "placeholder" and b["d"] == 1 and b["cat"].target is torch.cat
    assert [p.args[1] for p in b["pieces"]] == [0, 1, 2]


def test_a_capture_used_twice_must_bind_the_same_value_and_the_miss_says_where():
    gm = _gm(SplitCat(cat_dim=0), torch.randn(3, 6))
    miss = match(SPLIT_CAT, _node(gm, torch.cat))
    assert isinstance(miss, Miss)
    assert miss.startswith("cat.dim") and "d is 0 here but 1 before" in miss


def test_pieces_out_of_order_or_partial_name_the_failed_condition():
    gm = _gm(SplitCat(reorder=True), torch.randn(3, 6))
    assert "not taken in order" in match(SPLIT_CAT, _node(gm, torch.cat))
    gm = _gm(SplitCat(take=2), torch.randn(3, 6))
    assert "2 of split's 3 pieces are taken" in match(SPLIT_CAT, _node(gm, torch.cat))


def test_wrong_root_op_names_the_node_and_what_was_expected():
    gm = _gm(SplitCat(), torch.randn(3, 6))
    add = next(n for n in gm.graph.nodes if n.name.startswith("add"))
    miss = match(SPLIT_CAT, add)
    assert isinstance(miss, Miss) and add.name in miss and "cat" in miss


def test_arguments_bind_by_name_whether_given_by_position_or_keyword_with_defaults():
    class M(nn.Module):
        def forward(self, x):
            return torch.cat([x, x], 1), torch.cat([x, x], dim=1), torch.cat([x, x])

    gm = _gm(M(), torch.randn(2, 3))
    cats = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is torch.cat]
    assert [bind(c)["dim"] for c in cats] == [1, 1, 0]
    assert all(isinstance(match(Op(CAT, dim=1), c), dict) for c in cats[:2])
    assert "dim: is 0, not 1" in match(Op(CAT, dim=1), cats[2])


def test_method_calls_bind_like_the_torch_function_of_the_same_name():
    class M(nn.Module):
        def forward(self, x):
            a, b = x.split(2, dim=1)
            return a * b

    gm = _gm(M(), torch.randn(2, 4))
    split = next(n for n in gm.graph.nodes if n.op == "call_method")
    b = match(Op(SPLIT, Var("x"), Var("size"), dim=Var("d")), split)
    assert b["size"] == 2 and b["d"] == 1


def test_aten_op_overloads_bind_by_their_schema_with_keyword_only_defaults():
    """An ATen graph's targets are OpOverloads, whose ``__call__`` is ``*args, **kwargs``:
    the binding comes from the op's schema (post-grad pattern files match ATen graphs)."""
    from torch.fx import Graph

    aten = torch.ops.aten
    g = Graph()
    b, x, w = g.placeholder("b"), g.placeholder("x"), g.placeholder("w")
    addmm = g.call_function(aten.addmm.default, (b, x, w), {"beta": 2})
    sub = g.call_function(aten.sub.Tensor, (x, w))
    assert bind(addmm) == {"input": b, "mat1": x, "mat2": w, "beta": 2, "alpha": 1}
    m = match(Op(aten.addmm.default, Var("b"), Var("x"), Var("w"), beta=Var("beta")), addmm)
    assert (m["b"], m["x"], m["w"], m["beta"]) == (b, x, w, 2)
    assert match(Op(aten.sub.Tensor, Var("x"), Var("y"), alpha=Var("a")), sub)["a"] == 1
    assert "mat2: w is placeholder" in match(Op(aten.addmm.default, ANY, ANY, Op(aten.t.default)), addmm)


def test_each_and_predicates_give_their_reason():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 3)

        def forward(self, x):
            return torch.cat([self.a(x), self.b(x)], dim=1)

    gm = _gm(M(), torch.randn(2, 4))
    cat = _node(gm, torch.cat)
    assert isinstance(match(Op(CAT, Each(Op(LINEAR, "x", ANY, ANY))), cat), dict)
    same_width = require(
        lambda b: len({t.meta["example_value"].shape[-1] for t in b["ts"]}) == 1, "the linears have different widths"
    )
    miss = match(Op(CAT, Var("ts", Each(Op(LINEAR))), where=[same_width]), cat)
    assert miss == "cat: the linears have different widths"


def test_const_and_non_node_values():
    class M(nn.Module):
        def forward(self, x):
            return torch.cat([x, x], dim=-1)

    gm = _gm(M(), torch.randn(2, 3))
    cat = _node(gm, torch.cat)
    assert isinstance(match(Op(CAT, ANY, Const(-1)), cat), dict)
    assert "is -1, not 1" in match(Op(CAT, ANY, Const(1)), cat)
    assert "cat.tensors: l_x_ is not a getitem" in match(Op(CAT, Pieces(ANY)), cat)
    assert "cat.tensors[0]: l_x_ is placeholder" in match(Op(CAT, Each(Op(SPLIT))), cat)
    assert "cat.dim: is -1, not a node" in match(Op(CAT, dim=Op(SPLIT)), cat)


def test_anchors_are_the_root_targets():
    assert torch.cat in SPLIT_CAT.anchors and "split" not in SPLIT_CAT.anchors
    assert "split" in Op(SPLIT).anchors


def test_the_shipped_split_cat_identity_is_a_rule_of_the_language_with_its_reasons():
    from optimus_lens.core.lang import RulePattern
    from optimus_lens.core.pattern import Match, why_not
    from optimus_lens.passes import pattern_named

    p = pattern_named("remove_split_cat")
    assert isinstance(p, RulePattern) and p.source.startswith("optimus/passes/split_cat/identities.py:")
    gm = _gm(SplitCat(), torch.randn(3, 6))
    assert isinstance(p.match(_node(gm, torch.cat)), Match)
    gm = _gm(SplitCat(cat_dim=0), torch.randn(3, 6))
    assert why_not(p, _node(gm, torch.cat)) == "cat: cat dim 0 != split dim 1"
    gm = _gm(SplitCat(take=2), torch.randn(3, 6))
    assert "2 of split's 3 pieces are taken" in why_not(p, _node(gm, torch.cat))


def test_check_takes_a_miss_returning_function_as_a_predicate():
    from optimus_lens.core.lang import check

    gm = _gm(SplitCat(), torch.randn(3, 6))
    cat = _node(gm, torch.cat)
    ok = Op(CAT, Var("ts"), where=[check(lambda b: None)])
    assert isinstance(match(ok, cat), dict)
    refused = Op(CAT, Var("ts"), where=[check(lambda b: Miss(f"{len(b['ts'])} tensors is too many"))])
    assert match(refused, cat) == "cat: 3 tensors is too many"


def test_pieces_put_the_getitems_in_the_site_between_the_root_and_the_producer():
    gm = _gm(SplitCat(), torch.randn(3, 6))
    b = match(SPLIT_CAT, _node(gm, torch.cat))
    assert [n.name for n in b.nodes] == ["cat", "getitem", "getitem_1", "getitem_2", "split"]


def _run_rule(model, rule, *inputs):
    from optimus_lens.core.engine import Engine, RunOptions
    from optimus_lens.core.lang import RulePattern
    from optimus_lens.core.pipeline import Pass, Pipeline

    gm = _gm(model, *inputs)
    trace = Engine(gm, inputs, Pipeline([Pass("p", [RulePattern(rule)])]), RunOptions(verify="step")).run()
    return trace, gm


def test_a_rule_identity_erases_the_pieces_and_the_split_it_no_longer_needs():
    from optimus_lens.core.lang import Rule

    trace, gm = _run_rule(SplitCat(), Rule("split_cat", SPLIT_CAT, lambda rw, x, **_: x), torch.randn(3, 6))
    assert [s.pattern for s in trace.steps] == ["split_cat"] and trace.final_verify.ok
    assert {n.op for n in gm.graph.nodes} == {"placeholder", "call_function", "output"}
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"] == [__import__("operator").add]


class UnbindStackUse(nn.Module):
    def forward(self, x, y):
        u = torch.unbind(torch.stack([x, y], dim=0), dim=0)
        return u[1] * 2 + u[0]


def test_a_pieces_rule_replaces_each_getitem_of_a_tuple_valued_root_by_its_element():
    from optimus_lens.core.lang import Rule
    from optimus_lens.passes.common import STACK, UNBIND

    rule = Rule(
        "stack_unbind", Op(UNBIND, Op(STACK, Var("xs"), dim=0), dim=0), lambda rw, xs, **_: list(xs), pieces=True
    )
    trace, gm = _run_rule(UnbindStackUse(), rule, torch.randn(2, 3), torch.randn(2, 3))
    assert [s.pattern for s in trace.steps] == ["stack_unbind"] and trace.final_verify.ok
    assert not [n for n in gm.graph.nodes if n.target in (torch.stack, torch.unbind)]


def test_a_pieces_rule_refuses_a_root_used_other_than_through_getitems():
    from optimus_lens.core.lang import Rule, RulePattern
    from optimus_lens.passes.common import STACK, UNBIND

    p = RulePattern(Rule("stack_unbind", Op(UNBIND, Op(STACK, Var("xs"))), lambda rw, xs, **_: list(xs), pieces=True))

    class WholeTuple(nn.Module):  # FX keeps cat(unbind(...)) whole; Dynamo would unpack it
        def forward(self, x, y):
            return torch.cat(torch.unbind(torch.stack([x, y])))

    unbind = _node(torch.fx.symbolic_trace(WholeTuple()), torch.unbind)
    miss = p.match(unbind)
    assert isinstance(miss, Miss) and "is not a getitem with a constant index" in miss


def test_anchored_patterns_refuse_other_ops_and_need_ends_the_match_with_the_miss():
    from optimus_lens.core.miss import need
    from optimus_lens.core.pattern import AnchoredPattern, Match

    class FirstPieceOfASplit(AnchoredPattern):
        name = "first_piece"
        anchors = frozenset({torch.cat})

        def find(self, node):
            ts = need(Miss("no list") if not isinstance(node.args[0], (list, tuple)) else node.args[0])
            return Match(node, [node]) if ts[0].target is __import__("operator").getitem else Miss("not a piece")

    gm = _gm(SplitCat(), torch.randn(3, 6))
    p = FirstPieceOfASplit()
    assert isinstance(p.match(_node(gm, torch.cat)), Match)
    assert p.match(next(n for n in gm.graph.nodes if n.op == "placeholder")).startswith("not an anchor")
    cat = _node(gm, torch.cat)
    old = cat.args
    cat.args = (cat.args[0][0], 1)
    try:
        assert p.match(cat) == "no list"
    finally:
        cat.args = old


def test_pieces_answers_as_its_checks_one_by_one_do(monkeypatch):
    """The one-pass check of a list of pieces against the three checks made one by one
    (forced by making the one pass always unsure): the same bindings, or the same reason."""
    import operator

    from torch.fx import Graph

    from optimus_lens.core import lang

    g = Graph()
    x = g.placeholder("x")
    x.meta["example_value"] = torch.zeros(3, 2)
    u, v = g.call_function(torch.unbind, (x,)), g.call_function(torch.unbind, (x,))
    for p in (u, v):
        p.meta["example_value"] = tuple(torch.zeros(2) for _ in range(3))
    us = [g.call_function(operator.getitem, (u, i)) for i in range(3)]
    vs = [g.call_function(operator.getitem, (v, i)) for i in range(3)]
    odd = g.call_function(operator.getitem, (u, True))  # True == 1: taken as piece 1
    lists = [us, us[::-1], us[:2], [us[0], vs[1], us[2]], [us[0], x, us[2]], [x, *us], [us[0], odd, us[2]], us + us]
    stacks = [g.call_function(torch.stack, (list(ps),)) for ps in lists]
    pattern = Op(torch.stack, Pieces(Op(torch.unbind, Var("y")), name="ps"), name="s")

    def answers():
        out = []
        for s in stacks:
            got = match(pattern, s)
            out.append((str(got), got.partial) if isinstance(got, Miss) else (dict(got), got.nodes))
        return out

    fast = answers()
    monkeypatch.setattr(lang, "_in_order", lambda value: lang._UNSURE)
    assert answers() == fast
    assert [isinstance(a, str) for a, _ in fast] == [False, True, True, True, True, True, False, True]
