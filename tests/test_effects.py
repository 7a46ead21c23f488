"""The effects analysis itself: node effects read from schemas, probes and storages (never
from names), alias classes, regions, write epochs, and the step check's simulation of the
engine's repair."""

from __future__ import annotations

import operator
import random

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx import Graph, GraphModule

from optimus_lens.core import aliasing
from optimus_lens.core.effects import effect, is_plain, returns_input
from optimus_lens.core.engine import Engine, RunOptions
from optimus_lens.core.index import GraphIndex
from optimus_lens.core.miss import Miss
from optimus_lens.core.pattern import REGISTRY, Match, RewritePattern
from optimus_lens.core.pipeline import Pass, Pipeline
from optimus_lens.core.rewriter import Rewriter
from optimus_lens.core.stepcheck import StepCheck, final_places
from optimus_lens.frontend.capture import capture
from optimus_lens.passes import pattern_named
from tests.test_effects_oracle import AutocastBlock, NoGradBlock, fill_from  # noqa: F401  (registers the op)

MODE = FakeTensorMode()


class G:
    """A hand-built FX graph whose nodes carry FakeTensor example values."""

    def __init__(self):
        self.g = Graph()

    def ph(self, name, value):
        n = self.g.placeholder(name)
        n.meta["example_value"] = (
            MODE.from_tensor(value) if not isinstance(value, torch._subclasses.FakeTensor) else value
        )
        return n

    def call(self, fn, *args, method=False, **kwargs):
        n = self.g.call_method(fn, args, kwargs) if method else self.g.call_function(fn, args, kwargs)
        f = getattr(torch.Tensor, fn) if method else fn
        vals = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: a.meta["example_value"])
        with MODE:
            n.meta["example_value"] = f(*vals[0], **vals[1])
        return n


def test_writes_come_from_schemas_and_probes_not_from_names():
    b = G()
    x, y = b.ph("x", torch.randn(4, 4)), b.ph("y", torch.randn(4, 4))
    cases = {
        "aten overload": (b.call(torch.ops.aten.mul_.Tensor, x, y), [x]),
        "overload packet": (b.call(torch.ops.aten.add_, x, y), [x]),
        "custom op mutates_args": (b.call(torch.ops.optimus_test21.fill_from.default, y, x), [y]),
        "method": (b.call("sub_", x, 1.0, method=True), [x]),
        "F.relu inplace=True": (b.call(F.relu, y, inplace=True), [y]),
        "setitem": (b.call(operator.setitem, x, 0, 1.0), [x]),
        "iadd": (b.call(operator.iadd, x, y), [x]),
        "out=": (b.call(torch.add, x, y, out=y), [y]),
    }
    for what, (n, written) in cases.items():
        assert list(effect(n).writes) == written, (what, effect(n))
    for pure in (
        b.call(F.relu, x),
        b.call(torch.add, x, y),
        b.call("sum", x, method=True),
        b.call(F.layer_norm, x, (4,)),
    ):
        assert not effect(pure).effectful, effect(pure)


def test_aliases_attributes_and_identities():
    b = G()
    x = b.ph("x", torch.randn(4, 4))
    for attr in ("T", "mT", "H", "mH", "real"):
        n = b.call(getattr, x, attr)
        assert effect(n).aliases == (x,), attr
    at = b.call(torch.atleast_2d, x)
    assert effect(at).aliases == (x,) and returns_input(at) is x  # a 2-D tensor is returned itself
    drop = b.call(F.dropout, x, 0.5, False)
    assert returns_input(drop) is x  # eval-mode dropout: the input itself, whatever the FakeTensor says
    assert x in effect(b.call("contiguous", x, method=True)).aliases  # schema: Tensor(a)
    assert x in effect(b.call("type_as", x, x, method=True)).aliases  # the example shares x's storage
    assert not effect(b.call(torch.cat, [x, x])).aliases


def test_state_changes_random_ops_and_unknown_callables():
    b = G()
    x = b.ph("x", torch.randn(4, 4))
    grad = b.g.call_function(torch._C._set_grad_enabled, (False,))
    assert effect(grad).state and not effect(grad).writes
    assert effect(b.call(torch.rand_like, x)).rng

    def opaque(t):
        return t * 2

    unknown = b.g.call_function(opaque, (x,))
    unknown.meta["example_value"] = x.meta["example_value"]
    e = effect(unknown)
    assert e.state and e.writes == (x,) and e.aliases == (x,)  # may write and alias all it receives
    size = b.call("size", x, 1, method=True)
    assert not effect(b.g.call_function(operator.floordiv, (size, 2))).effectful  # arithmetic on sizes


def test_common_targets_are_read_once_per_target():
    b = G()
    x, w = b.ph("x", torch.randn(4, 4)), b.ph("w", torch.randn(4, 4))
    assert is_plain(b.call(torch._C._nn.linear, x, w))
    assert is_plain(b.call(torch.cat, [x, w]))
    assert not is_plain(b.call(F.relu, x))  # a Python function: its inplace flag decides
    assert not is_plain(b.call("add_", x, 1.0, method=True))
    assert aliasing.analysis(b.g).quiet is False


def test_a_rewired_node_keeps_its_answer_only_for_inputs_of_the_same_sizes_and_strides(monkeypatch):
    from optimus_lens.core import effects

    resolved = []
    real = effects._resolve
    monkeypatch.setattr(effects, "_resolve", lambda n: resolved.append(n.name) or real(n))
    monkeypatch.setattr(effects, "_RESOLVED", {})  # answers shared by signature: none yet
    b = G()
    x, y = b.ph("x", torch.randn(4, 6)), b.ph("y", torch.randn(4, 6))
    o = b.ph("o", torch.randn(30)[6:].view(4, 6))  # (4, 6) at storage offset 6
    t, u = b.ph("t", torch.randn(6, 4).t()), b.ph("u", torch.randn(6, 4).t())  # strides (1, 4)
    r = b.call(F.relu, x)  # a Python function: probed
    c = b.call("contiguous", t, method=True)  # a copy here, an alias by its schema
    assert not effect(r).aliases and effect(c).aliases == (t,)
    r.replace_input_with(x, y)  # laid out alike: the answer carries over
    c.replace_input_with(t, u)
    assert not effect(r).aliases and effect(c).aliases == (u,)
    assert resolved == ["relu", "contiguous"]  # read once each, before the rewiring
    r.replace_input_with(y, o)  # another storage offset only: no op decides its effects by it
    assert not effect(r).aliases and resolved == ["relu", "contiguous"]
    r.replace_input_with(o, t)  # other strides: probed again
    c.replace_input_with(u, x)
    assert not effect(r).aliases and effect(c).aliases == (x,)
    assert resolved == ["relu", "contiguous", "relu", "contiguous"]
    v = b.call("view", x, -1, method=True)  # its example value is in x's storage
    effect(v)
    v.replace_input_with(x, y)  # y's is not: read again
    assert effect(v).aliases == (y,) and resolved[-2:] == ["view", "view"]
    p = b.call(torch.relu, x)  # a plain target: one answer for every call, none resolved
    assert effect(p) is effect(b.call(torch.relu, t)) and not effect(p).aliases and "relu" not in resolved[4:]


def test_nodes_of_one_signature_share_one_answer_with_their_own_inputs(monkeypatch):
    from optimus_lens.core import effects

    resolved = []
    real = effects._resolve
    monkeypatch.setattr(effects, "_resolve", lambda n: resolved.append(n.name) or real(n))
    monkeypatch.setattr(effects, "_RESOLVED", {})
    b = G()
    xs = [b.ph(f"x{i}", torch.randn(4, 6)) for i in range(3)]
    ds = [b.call(F.dropout, x, 0.5, False) for x in xs]  # eval mode: each returns its own input
    rs = [b.call(F.relu, x) for x in xs]
    assert [returns_input(d) for d in ds] == xs and all(not effect(r).aliases for r in rs)
    assert resolved == ["dropout", "relu"]  # one read per signature
    t = b.ph("t", torch.randn(6, 4).t())
    assert returns_input(b.call(F.dropout, t, 0.5, False)) is t and resolved[-1] == "dropout_3"  # other strides
    assert effect(b.call(F.relu, xs[0], inplace=True)).writes == (xs[0],)  # another constant


def test_a_pure_aten_overload_is_plain_unless_its_value_shares_an_inputs_storage():
    b = G()
    x = b.ph("x", torch.randn(4, 6))
    mm = b.call(torch.ops.aten.mm.default, x, b.call(torch.ops.aten.t.default, x))
    uv = b.call(torch.ops.aten._unsafe_view.default, x, [24])  # no alias in its schema, a view all the same
    assert is_plain(mm) and not effect(mm).aliases
    assert is_plain(uv) and effect(uv).aliases == (x,)
    assert not is_plain(b.call(torch.ops.aten.view.default, x, [24]))  # Tensor(a) -> Tensor(a)
    assert not is_plain(b.call(torch.ops.aten.native_dropout.default, x, 0.5, True))  # random
    assert not is_plain(b.call(torch.ops.aten.add_.Tensor, x, x))  # writes


def test_views_of_one_buffer_given_as_inputs_are_one_class():
    b = G()
    p, q = b.ph("p", torch.randn(4, 4)), b.ph("q", torch.randn(4, 4))  # separate fake storages
    before = b.call(torch.relu, p)
    w = b.call("mul_", q, 2.0, method=True)
    after = b.call(torch.relu, p)
    ge = aliasing.analysis(b.g)
    assert not ge.is_written(p) and ge.is_written(q)
    assert ge.signature(before) == ge.signature(after) == ()  # p is not written: one group
    base = torch.randn(4, 4)
    aliasing.note_inputs(b.g, (base[:], base.view(4, 4)))  # the real inputs share a storage
    ge = aliasing.analysis(b.g)
    assert ge.is_written(p)
    assert ge.signature(before) != ge.signature(after)  # read before and after the write
    assert w in [n for _, n in ge.writers(next(iter(ge.written_classes(p))))]


def test_regions_are_numbered_and_keyed():
    gm = capture(NoGradBlock(), (torch.randn(4, 8),), grad=True).gm
    lins = [n for n in gm.graph.nodes if n.target is torch._C._nn.linear]
    regions = [aliasing.region(n) for n in lins]
    assert regions == [0, 0, 0, 1, 1, 1]
    keys = [pattern_named("batch_linear_lhs").key(n) for n in lins]
    assert len(set(keys[:3])) == 1 and len(set(keys[3:])) == 1 and keys[0] != keys[3]


def test_capture_keeps_the_models_regions_in_the_mode_the_run_is_for():
    grad = capture(NoGradBlock(), (torch.randn(4, 8),), grad=True)
    plain = capture(NoGradBlock(), (torch.randn(4, 8),))
    assert sum(n.target is torch._C._set_grad_enabled for n in grad.gm.graph.nodes) == 2
    assert not any(n.target is torch._C._set_grad_enabled for n in plain.gm.graph.nodes)  # all no-grad
    assert grad.info()["grad"] and not plain.info()["grad"]
    auto = capture(AutocastBlock(), (torch.randn(4, 8),))
    assert (
        sum(aliasing.analysis(auto.gm.graph).effectful[n].state for n in aliasing.analysis(auto.gm.graph).effectful)
        == 2
    )


def test_a_node_created_inside_autocast_gets_the_dtype_it_computes_there():
    gm = capture(AutocastBlock(), (torch.randn(4, 8),)).gm
    lins = [n for n in gm.graph.nodes if n.target is torch._C._nn.linear]
    rw = Rewriter(gm.graph)
    with rw.inserting_before(lins[4]):
        inside = rw.call(torch._C._nn.linear, *lins[4].args)
    with rw.inserting_before(lins[1]):
        outside = rw.call(torch._C._nn.linear, *lins[4].args)
    assert inside.meta["example_value"].dtype == torch.bfloat16
    assert outside.meta["example_value"].dtype == torch.float32
    assert torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu")  # the replay is undone
    rw.rollback()


class _ReplaceByEarlierCopy(RewritePattern):
    """A deliberately unsound rewrite: ``y = x.clone()`` read after ``x.add_(1)``: every use
    of the second clone is pointed at the first (taken before the write)."""

    name = "replace_by_earlier_copy"

    def match(self, node):
        if node.op == "call_method" and node.target == "clone" and node.args[0].op == "placeholder":
            first = next(n for n in node.graph.nodes if n.op == "call_method" and n.target == "clone")
            if first is not node:
                return Match(node, [node], {"first": first})
        return Miss("no")

    def rewrite(self, rw, m):
        rw.replace_all_uses(m.anchor, m.info["first"])
        rw.erase(m.anchor)


class _TwoClones(nn.Module):
    def forward(self, x):
        a = x.clone()
        x.add_(1)
        b = x.clone()
        return a * 1, b * 1


def test_the_engine_refuses_a_rewrite_that_moves_a_read_across_a_write():
    x = torch.randn(3)
    gm = capture(_TwoClones(), (x,)).gm
    pipe = Pipeline([Pass("p", [_ReplaceByEarlierCopy()])])
    trace = Engine(gm, (x.clone(),), pipe, RunOptions(verify="off")).run()
    (step,) = trace.steps
    assert step.error["kind"] == "unsafe" and "between" in step.error["message"]


def _random_graph(seed: int) -> GraphModule:
    from tests.test_search import random_dag

    return random_dag(seed, 24, 0.4)


def _depends(n, on) -> bool:
    todo, seen = [n], set()
    while todo:
        m = todo.pop()
        if m is on:
            return True
        todo.extend(i for i in m.all_input_nodes if i not in seen and not seen.add(i))
    return False


def _fusable_pair(seed: int):
    """The first random graph from ``seed`` on with two independent relus of one group key
    (a pair batch_relu fuses: the fusion of dependent members would make a cycle), and a pair
    of them drawn by ``seed``."""
    relu = REGISTRY["batch_relu"]
    for s in range(seed * 1000, seed * 1000 + 50):
        gm = _random_graph(s)
        relus = [n for n in gm.graph.nodes if n.target is F.relu]
        pairs = [
            (a, b)
            for i, a in enumerate(relus)
            for b in relus[i + 1 :]
            if not (_depends(a, b) or _depends(b, a))
            and relu.key(a) == relu.key(b)
            and not isinstance(relu.key(a), str)
        ]
        if pairs:
            return gm, list(random.Random(seed).choice(pairs))
    raise AssertionError(f"no random graph from seed {seed * 1000} on has two independent fusable relus")


@pytest.mark.parametrize("seed", range(12))
def test_the_simulated_repair_puts_every_node_where_the_engines_repair_does(seed):
    gm, group = _fusable_pair(seed)
    g = gm.graph
    index = GraphIndex(g)
    pos = dict(index.pos)
    safe = StepCheck(pos)
    rw = Rewriter(g, [safe])
    REGISTRY["batch_relu"].fuse(rw, group)
    created = [n for n in dict.fromkeys(safe.created) if not n._erased]
    rewired = [n for n in safe.rewired if not n._erased]
    place = final_places(pos, created, rewired)
    index.update(created, safe.erased, rewired)  # the engine's own repair
    order = {n: i for i, n in enumerate(g.nodes)}
    fixed = [n for n in g.nodes if n in pos and n not in place]
    for v, p in place.items():
        if v._erased:
            continue
        for f in fixed:
            assert (pos[f] < p) == (order[f] < order[v]), (v.name, f.name)


def test_a_tensor_given_a_copy_of_another_ones_dict_reads_its_own_storage_key():
    from optimus_lens.core.meta import _SKEY, _SKEY_OF, storage_key

    with MODE:
        x, y = torch.empty(4, 8), torch.empty(4, 8)
        v = x.view(-1)
    assert storage_key(x) == storage_key(v)  # read, and kept on the FakeTensor
    for k in (_SKEY, _SKEY_OF):  # what a deep copy does: Tensor.__deepcopy__ copies __dict__
        y.__dict__[k] = x.__dict__[k]
    assert storage_key(y) != storage_key(x) and storage_key(y) == y.untyped_storage()._cdata


def test_the_graph_keeps_its_offset_readers_as_rewrites_add_and_remove_them():
    b = G()
    x = b.ph("x", torch.randn(4, 8))
    y = b.call(torch.relu, x)
    b.g.output((y,))
    assert aliasing.offset_readers(b.g) == set()
    rw = Rewriter(b.g)
    with rw.inserting_after(y):
        off = rw.create("call_method", "storage_offset", (y,))
        strided = rw.call(torch.as_strided, y, (2, 2), (1, 1), 3)
        plain = rw.call(torch.as_strided, y, (2, 2), (1, 1))  # no storage_offset argument: reads none
    assert aliasing.offset_readers(b.g) == {off, strided}
    assert plain not in aliasing.offset_readers(b.g)
    rw.erase(strided)
    assert aliasing.offset_readers(b.g) == {off}
    rw.rollback()
    assert aliasing.offset_readers(b.g) == set()


def test_a_created_node_is_classified_with_its_value_not_before_it():
    b = G()
    x = b.ph("x", torch.randn(4, 8))
    y = b.call(torch.relu, x)
    b.g.output((y,))
    aliasing.analysis(b.g)
    rw = Rewriter(b.g)
    with rw.inserting_after(y):
        w = rw.call(torch.Tensor.add_, y, 1)  # a write: read with its example value, it is effectful
        v = rw.call(torch.Tensor.view, y, (8, 4))
    ge = aliasing.analysis(b.g)
    assert w in ge.effectful and ge.effectful[w].writes == (y,)
    assert v not in ge.odd  # its storage is y's: no alias edge the storages do not show
    rw.rollback()


def test_an_erased_node_is_answered_as_it_was_in_the_graph():
    b = G()
    x = b.ph("x", torch.randn(4, 8))
    w = b.call("add_", x, 1, method=True)
    assert effect(w).writes == (x,)
    b.g.erase_node(w)  # FX clears its arguments: nothing left to read the write from
    assert w.args == (None, 1) and effect(w).writes == (x,)
