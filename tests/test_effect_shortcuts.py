"""The shortcuts of the per-node analyses give the general path's answers: an effect shared
between the nodes of one signature, an effect carried over a rewiring, a getitem's effect
kept on what it indexes, canonical arguments bound without re-sorting, the graph inputs
grouped by storage, and the index's first numbering."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F
from torch.fx import Node

from optimus_lens.core import aliasing, effects, meta
from optimus_lens.core.index import GAP, LEVEL_SLACK, GraphIndex
from optimus_lens.core.miss import Miss
from optimus_lens.frontend.capture import capture
from optimus_lens.passes.common import REQUIRED, bind_args
from optimus_lens.passes.linears import linear_input, linear_operands
from optimus_lens.sample_models import get
from tests.test_effects import MODE, G
from tests.test_effects_oracle import fill_from  # noqa: F401  (registers the op)

SAMPLES = ("transformer_block", "teach_batch_dropout", "teach_batch_detach", "teach_split_cat", "swish_mlp")


def _hand_built() -> G:
    """A graph of every kind of answer: writes, aliases, identities, state, random, unknown."""
    b = G()
    x, y = b.ph("x", torch.randn(4, 4)), b.ph("y", torch.randn(4, 4))
    t = b.ph("t", torch.randn(4, 4).t())
    b.call(torch.ops.aten.mul_.Tensor, x, y)
    b.call(torch.ops.aten.add_, x, y)
    b.call(torch.ops.optimus_test21.fill_from.default, y, x)
    b.call("sub_", x, 1.0, method=True)
    b.call(F.relu, y, inplace=True)
    b.call(F.relu, t)
    b.call(operator.setitem, x, 0, 1.0)
    b.call(torch.add, x, y, out=y)
    b.call(F.dropout, t, 0.5, False)
    b.call("contiguous", t, method=True)
    b.call("type_as", x, x, method=True)
    b.call(torch.atleast_2d, x)
    pieces = b.call(torch.unbind, x)
    b.g.call_function(operator.getitem, (pieces, 1)).meta["example_value"] = meta.value(pieces)[1]
    b.call(getattr, x, "mT")
    b.call(torch.rand_like, x)
    b.g.call_function(torch._C._set_grad_enabled, (False,))
    size = b.call("size", x, 1, method=True)
    b.g.call_function(operator.floordiv, (size, 2))
    return b


@pytest.fixture(scope="module")
def graphs():
    out = [_hand_built().g]
    for name in SAMPLES:
        model, inputs = get(name)
        out.append(capture(model, inputs).gm.graph)
    return out


def _calls(g):
    return [n for n in g.nodes if n.op in ("call_function", "call_method")]


def test_an_answer_shared_by_signature_is_the_nodes_own(graphs, monkeypatch):
    monkeypatch.setattr(effects, "_RESOLVED", {})
    for g in graphs:
        for n in _calls(g):
            for _ in range(2):  # read afresh, then from the table
                assert effects._resolve_shared(n, meta.value(n)) == effects._resolve(n), n.format_node()


def test_the_kind_of_a_nodes_own_value_is_all_the_shared_answer_reads_of_it(monkeypatch):
    """Two relus of one input layout whose own values are laid out differently share an
    answer, and it is each one's own."""
    monkeypatch.setattr(effects, "_RESOLVED", {})
    b = G()
    xs = [b.ph(f"x{i}", torch.randn(4, 6)) for i in range(2)]
    r0, r1 = b.call(F.relu, xs[0]), b.call(F.relu, xs[1])
    r1.meta["example_value"] = MODE.from_tensor(torch.randn(6, 4).t())
    resolved = []
    real = effects._resolve
    monkeypatch.setattr(effects, "_resolve", lambda n: resolved.append(n.name) or real(n))
    assert effects.effect(r0) == real(r0) and effects.effect(r1) == real(r1)
    assert resolved == ["relu"]


def test_an_answer_carried_over_a_rewiring_is_the_one_read_afresh(graphs):
    """Every call node of the graphs, one tensor input at a time replaced by a fresh
    placeholder laid out alike (its own storage): the carried answer is the resolved one."""
    for g in graphs:
        for n in _calls(g):
            for i in list(n.all_input_nodes):
                v = meta.value(i)
                if not isinstance(v, torch.Tensor) or v._has_symbolic_sizes_strides:
                    continue
                effects.effect(n)  # the memo before the rewiring
                with g.inserting_before(n):
                    p = g.placeholder(f"fresh_{i.name}")
                mode = getattr(v, "fake_mode", None) or MODE
                with mode:
                    p.meta["example_value"] = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device)
                n.replace_input_with(i, p)
                carried = effects.effect(n)
                del n.__dict__[effects._MEMO]  # read afresh
                assert carried == effects.effect(n), n.format_node()
                n.replace_input_with(p, i)
                g.erase_node(p)


def test_the_getitems_of_one_value_share_its_view_answer():
    b = G()
    x = b.ph("x", torch.randn(3, 4))
    pieces = b.call(torch.unbind, x)
    gets = [b.g.call_function(operator.getitem, (pieces, i)) for i in range(3)]
    for i, n in enumerate(gets):
        n.meta["example_value"] = meta.value(pieces)[i]
    answers = [effects.effect(n) for n in gets]
    assert all(a is answers[0] for a in answers)
    assert answers[0].aliases == (pieces,) and not answers[0].effectful


def _bind_reference(node: Node, params: tuple) -> dict | Miss:
    """bind_args as first written: every binding through one dict, re-sorted at the end."""
    names = [p for p, _ in params]
    if len(node.args) > len(params):
        return Miss(f"{len(node.args)} positional arguments; expected at most {len(params)}")
    out = dict(zip(names, node.args))
    for k, v in node.kwargs.items():
        if k not in names:
            return Miss(f"unexpected argument {k}=")
        if k in out:
            return Miss(f"argument {k} given twice")
        out[k] = v
    for name, default in params:
        if name not in out:
            if default is REQUIRED:
                return Miss(f"missing argument {name}")
            out[name] = default
    return {n: out[n] for n in names}


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((1,), {}),
        ((1, 2), {}),
        ((1, 2, 3, 4), {}),
        ((1, 2, 3, 4, 5), {}),
        ((), {"x": 1}),
        ((1,), {"hi": 3}),
        ((1,), {"hi": 3, "lo": 2}),
        ((1, 2), {"lo": 5}),
        ((1,), {"other": 2}),
        ((), {}),
        ((), {"lo": 1}),
    ],
)
def test_bound_arguments_are_the_reference_bindings(args, kwargs):
    node = torch.fx.Graph().call_function(torch.clamp, args, kwargs)
    params = (("x", REQUIRED), ("lo", None), ("hi", None), ("flag", False))
    got, want = bind_args(node, params), _bind_reference(node, params)
    assert got == want and type(got) is type(want)
    if isinstance(got, dict):
        assert list(got) == list(want)  # signature order


def test_inputs_sharing_a_storage_are_grouped_in_order_of_their_first_input():
    b = G()
    phs = [b.ph(f"p{i}", torch.randn(4)) for i in range(7)]
    u, v, w = torch.randn(8), torch.randn(8), torch.randn(4)
    real = (v[:4], u[:4], w, u[4:], v[4:], u[2:6], torch.randn(4))
    aliasing.note_inputs(b.g, real)
    ge = aliasing.analysis(b.g)
    assert ge.input_groups == [[phs[0], phs[4]], [phs[1], phs[3], phs[5]]]
    aliasing.note_inputs(b.g, real[:2])  # fewer inputs than placeholders: none shared
    assert aliasing.analysis(b.g).input_groups == []


def test_the_first_numbering_is_list_order_and_levels_one_above_the_inputs(graphs):
    for g in graphs:
        index = GraphIndex(g)
        nodes = list(g.nodes)
        assert [index.pos[n] for n in nodes] == [(i + 1) * GAP for i in range(len(nodes))]
        for n in nodes:
            want = max((index.level[i] for i in n.all_input_nodes), default=-LEVEL_SLACK) + LEVEL_SLACK
            assert index.level[n] == want


def test_the_input_a_linear_hint_reads_is_the_linears_operand():
    b = G()
    x, w, bias = b.ph("x", torch.randn(4, 8)), b.ph("w", torch.randn(6, 8)), b.ph("b", torch.randn(6))
    wt = b.ph("wt", torch.randn(8, 6))
    linears = [
        b.call(F.linear, x, w, bias),
        b.call(F.linear, x, w),
        b.call(torch._C._nn.linear, x, weight=w, bias=bias),
        b.call(F.linear, input=x, weight=w),
        b.call(torch.addmm, bias, x, wt),
        b.call(torch.addmm, bias, mat1=x, mat2=wt),
        b.call("addmm", bias, x, wt, method=True),
        b.call(torch.matmul, x, wt),
        b.call(operator.matmul, x, wt),
        b.call("matmul", x, wt, method=True),
    ]
    for n in linears:
        o = linear_operands(n)
        assert not isinstance(o, Miss), n.format_node()
        assert linear_input(n) is o.x is x, n.format_node()
    assert linear_input(b.call(torch.relu, x)) is None


def test_a_call_s_signature_in_one_loop_equals_the_argument_walk():
    import operator as op

    from optimus_lens.core.opschema import arg_signature, call_signature

    g = torch.fx.Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    mode = torch._subclasses.fake_tensor.FakeTensorMode()
    x.meta["example_value"] = mode.from_tensor(torch.randn(4, 8))
    y.meta["example_value"] = mode.from_tensor(torch.randn(8))
    calls = [
        ((x,), {"inplace": False}),
        ((x, y, x), {}),
        ((x, 2, 0.5, None, "s", True), {"dim": -1, "other": y}),
        ((x, [y, x]), {}),  # nested: the walk
        ((x, slice(0, 2)), {"k": (1, 2)}),
        ((op.add,), {}),  # a callable constant
    ]
    for args, kwargs in calls:
        want_slots: dict = {}
        try:
            want = (arg_signature(args, want_slots), arg_signature(kwargs, want_slots))
        except TypeError:
            want = None
        got_slots: dict = {}
        try:
            got = call_signature(args, torch.fx.immutable_collections.immutable_dict(kwargs), got_slots)
        except TypeError:
            got = None
        assert got == want and list(got_slots) == list(want_slots)


def test_a_fusion_miss_read_without_the_effect_of_a_node_known_pure_is_the_general_one(graphs):
    """Every call node of the graphs (writes, aliases, identities, an output that is an
    alias): the miss read with the analysis's shortcut (no effect built for a node it found
    without effects) is the miss read from the node's effect."""
    from optimus_lens.passes import common

    def general(n: Node, ge: aliasing.GraphEffects) -> Miss | None:
        e = effects.effect(n)
        return (
            common._member_miss(n, e, ge)
            or common.fresh_output_miss(n)
            or common._offset_miss(n, ge)
            or (Miss("aliased output") if e.aliases and any(u.op == "output" for u in n.users) else None)
        )

    shortcuts = 0
    for g in graphs:
        ge = aliasing.analysis(g)
        for n in _calls(g):
            fast, slow = common._fusion_miss(n, ge), general(n, ge)
            assert (fast is None) == (slow is None), n.format_node()
            if fast is not None and "aliased output" not in str(slow):
                assert str(fast) == str(slow), n.format_node()
            shortcuts += aliasing.known_effectful(g, n) is False
    assert shortcuts > 10


def test_a_storage_key_read_without_the_storage_object_is_the_storage_objects(graphs):
    """Every example value of the graphs (views, pieces, placeholders) and a real tensor and
    its view: the key is the ``_cdata`` of the value's ``untyped_storage()``."""
    values = [torch.randn(4, 4), torch.randn(4, 4)[1:]]
    for g in graphs:
        for n in g.nodes:
            v = meta.value(n)
            values.extend(v if isinstance(v, (list, tuple)) else [v])
    seen = 0
    for v in values:
        if isinstance(v, torch.Tensor) and v.layout == torch.strided:
            assert meta._read_storage_key(v) == v.untyped_storage()._cdata
            seen += 1
    assert seen > 20
