"""The Rewriter: every change goes through it, and a step that raises or leaves the graph
invalid is rolled back to exactly the graph before it, recorded as failed, and the run
goes on with the pattern disabled at that site (or stops, by option)."""

import operator
import re
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from optimus_lens.core import meta
from optimus_lens.core.engine import Engine, PatternError, RunOptions
from optimus_lens.core.index import find_cycle
from optimus_lens.core.miss import Miss
from optimus_lens.core.pattern import Match, RewritePattern
from optimus_lens.core.pipeline import Pass, Pipeline
from optimus_lens.core.rewriter import InvalidGraph, Listener, Rewriter
from optimus_lens.core.trace import Trace
from optimus_lens.frontend.capture import capture
from optimus_lens.passes.common import RELU, is_call


def fingerprint(graph) -> list[tuple]:
    """Everything that makes a graph this graph: node order, identity, names, ops,
    targets, arguments (node references by identity), users in order, example values."""
    out = []
    for n in graph.nodes:
        args = torch.fx.node.map_arg((n.args, dict(n.kwargs)), lambda a: ("node", id(a), a.name))
        out.append(
            (
                id(n),
                n.name,
                n.op,
                str(n.target),
                repr(args),
                [id(u) for u in n.users],
                id(n.meta.get("example_value")),
                sorted(n.meta),
            )
        )
    return out


class TwoTowers(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        return self.c(torch.relu(self.a(x)) + torch.relu(self.b(x)))


def _captured():
    torch.manual_seed(0)
    return capture(TwoTowers().eval(), (torch.randn(3, 4),))


class ReluToClamp(RewritePattern):
    """relu(x) -> clamp(x, min=0): right, so a rolled-back site and a rewritten one can be compared."""

    name = "relu_to_clamp"
    anchors = frozenset(RELU[0]) | frozenset(RELU[1])

    def __init__(self, breaks_at: int = 0):
        self.breaks_at, self.calls = breaks_at, 0

    def match(self, node):
        return Match(node, [node]) if is_call(node, *RELU) else Miss("not relu")

    def rewrite(self, rw, m):
        self.calls += 1
        (n,) = m.nodes
        with rw.inserting_before(n):
            c = rw.call(torch.clamp, n.args[0], min=0.0)
        if self.calls == self.breaks_at:
            self.breaks(rw, n, c)
        rw.replace_all_uses(n, c)
        rw.erase(n)

    def breaks(self, rw, n, c):
        raise RuntimeError("broken after creating a node")


class MakesCycle(ReluToClamp):
    name = "makes_cycle"

    def breaks(self, rw, n, c):
        rw.replace_all_uses(n, c)  # the relu's user now reads the clamp ...
        user = next(iter(c.users))
        rw.modify(c, args=(user,))  # ... and the clamp reads that user: a cycle
        rw.erase(n)


class ErasesUsedNode(ReluToClamp):
    name = "erases_used_node"

    def breaks(self, rw, n, c):
        rw.erase(n.args[0])  # the linear feeding the relu still has users


class MutatesDirectly(ReluToClamp):
    name = "mutates_directly"

    def breaks(self, rw, n, c):
        n.replace_all_uses_with(c)  # around the Rewriter


@pytest.mark.parametrize(
    "pattern,kind,error",
    [
        (ReluToClamp(breaks_at=1), "raised", "RuntimeError"),
        (MakesCycle(breaks_at=1), "invalid", "InvalidGraph"),
        (ErasesUsedNode(breaks_at=1), "raised", "RuntimeError"),
        (MutatesDirectly(breaks_at=1), "direct-mutation", "DirectMutation"),
    ],
)
def test_a_broken_step_is_rolled_back_exactly_recorded_failed_and_the_run_goes_on(pattern, kind, error):
    c = _captured()
    before = fingerprint(c.gm.graph)
    eng = Engine(c.gm, c.example_inputs, Pipeline([Pass("p", [pattern], max_iterations=2)]), RunOptions(verify="step"))
    seen = []
    gen = eng.steps()
    first = next(gen)
    seen.append(first)
    # the graph after the failed (first) step is the graph before it, node for node
    assert first.error is not None and first.error["kind"] == kind and first.error["type"] == error
    assert fingerprint(c.gm.graph) == before, "the rolled-back graph differs from the graph before the step"
    seen.extend(gen)
    failed = [s for s in seen if s.error]
    ok = [s for s in seen if not s.error]
    assert len(failed) == 1 and len(ok) == 1  # the other relu is still rewritten
    assert failed[0].sites != ok[0].sites  # and the broken site is not retried
    assert all(s.verify.ok for s in ok)
    assert eng.trace.final_verify.ok
    assert failed[0].delta.upsert == [] and failed[0].delta.remove == []
    src = failed[0].error["source"]
    assert re.fullmatch(r"tests/test_rewriter\.py:\d+", src), src
    line = int(src.rsplit(":", 1)[1])
    code = Path(__file__).read_text().splitlines()[line - 1]
    assert "def breaks" not in code and code.strip()  # the line in the pattern that raised
    assert sum(1 for n in c.gm.graph.nodes if n.target is torch.clamp) == 1
    assert sum(1 for n in c.gm.graph.nodes if is_call(n, *RELU)) == 1


def test_on_error_stop_raises_with_the_graph_as_before_the_step():
    c = _captured()
    before = fingerprint(c.gm.graph)
    eng = Engine(
        c.gm,
        c.example_inputs,
        Pipeline([Pass("p", [ReluToClamp(breaks_at=1)])]),
        RunOptions(verify="off", on_error="stop"),
    )
    with pytest.raises(PatternError, match="broken after creating a node") as e:
        eng.run()
    assert e.value.pattern == "relu_to_clamp" and e.value.site
    assert fingerprint(c.gm.graph) == before
    assert eng.trace.steps[-1].error["kind"] == "raised"


def test_rollback_restores_users_order_erased_nodes_and_metadata():
    c = _captured()
    g = c.gm.graph
    before = fingerprint(g)
    relus = [n for n in g.nodes if is_call(n, *RELU)]
    lin = relus[0].args[0]
    rw = Rewriter(g)
    with rw.guarding(c.gm):
        with rw.inserting_before(relus[0]):
            t = rw.call(torch.tanh, lin)
        rw.replace_all_uses(relus[0], t)
        rw.erase(relus[0])
        rw.set_meta(lin, "stack_trace", "changed")
        rw.modify(relus[1], args=(t,))
        rw.replace_input(next(iter(t.users)), t, relus[1])
    assert fingerprint(g) != before
    rw.rollback()
    assert fingerprint(g) == before
    g.lint()
    assert relus[0] in list(g.nodes) and not relus[0]._erased


def test_listeners_hear_every_change_in_order():
    c = _captured()
    g = c.gm.graph
    heard = []

    class Ear(Listener):
        def notify_inserted(self, node):
            heard.append(("inserted", node.target))

        def notify_erased(self, node):
            heard.append(("erased", node.name))

        def notify_replaced(self, old, new, users):
            heard.append(("replaced", old.name, new.name, len(users)))

        def notify_modified(self, node, old_inputs):
            heard.append(("modified", node.name))

    relu = next(n for n in g.nodes if is_call(n, *RELU))
    rw = Rewriter(g, [Ear()])
    with rw.inserting_before(relu):
        t = rw.call(torch.tanh, relu.args[0])
    rw.replace_all_uses(relu, t)
    rw.erase(relu)
    rw.modify(t, kwargs={})
    assert heard == [
        ("inserted", torch.tanh),
        ("replaced", relu.name, t.name, 1),
        ("erased", relu.name),
        ("modified", t.name),
    ]


def test_find_cycle_names_the_cycle_and_ignores_acyclic_changes():
    c = _captured()
    g = c.gm.graph
    relu = next(n for n in g.nodes if is_call(n, *RELU))
    user = next(iter(relu.users))
    assert find_cycle([relu, user], None) is None
    rw = Rewriter(g)
    rw.modify(relu, args=(user,))
    cyc = find_cycle(list(rw.changed), None)
    assert cyc and cyc[0] is relu and cyc[-1] is relu
    with pytest.raises(InvalidGraph, match="cycle"):
        rw.validate()
    rw.rollback()
    rw2 = Rewriter(g)
    rw2.validate()


def test_no_shipped_pattern_mutates_the_graph_directly():
    """Every change in optimus/passes/ goes through the Rewriter: no FX mutator is called there."""
    mutators = re.compile(
        r"\.(replace_all_uses_with|replace_input_with|erase_node|create_node|call_function|"
        r"call_method|placeholder|get_attr|output|prepend|_update_args_kwargs|"
        r"inserting_after)\(|\.(args|kwargs|target|op|name)\s*=[^=]|\.meta\[[^\]]*\]\s*=[^=]|"
        r"\.meta\.(update|pop|setdefault)\("
    )
    root = Path(__file__).resolve().parent.parent / "optimus" / "passes"
    hits = [
        f"{p.name}:{i}: {line.strip()}"
        for p in sorted(root.rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if mutators.search(line)
    ]
    assert hits == []


def test_failed_steps_round_trip_through_json_and_old_traces_still_load():
    c = _captured()
    t = Engine(
        c.gm, c.example_inputs, Pipeline([Pass("p", [ReluToClamp(breaks_at=1)])]), RunOptions(verify="off")
    ).run()
    assert any(s.error for s in t.steps)
    back = Trace.loads(t.dumps())
    assert back.to_json() == t.to_json()
    assert back.failed_steps() == [s for s in back.steps if s.error]
    old = t.to_json()
    for s in old["steps"]:
        s.pop("error", None)
    assert all(s.error is None for s in Trace.from_json(old).steps)


def _unbind_graph():
    c = _captured()
    lin = next(n for n in c.gm.graph.nodes if n.target is torch._C._nn.linear)
    rw = Rewriter(c.gm.graph)
    with rw.inserting_after(lin):
        st = rw.call(torch.stack, [lin, lin, lin])
        with rw.inserting_after(st):
            ub = rw.call(torch.unbind, st)
    return c, rw, ub


def test_getitems_in_one_go_are_the_getitems_call_makes():
    c, rw, ub = _unbind_graph()
    with rw.inserting_after(ub):
        bulk = rw.getitems(ub, 3)
    with rw.inserting_after(bulk[-1]):
        one = [rw.call(operator.getitem, ub, i) for i in range(3)]
    for a, b in zip(bulk, one):
        assert (a.op, a.target, a.args[1]) == (b.op, b.target, b.args[1])
        assert a.meta["example_value"] is b.meta["example_value"] is ub.meta["example_value"][a.args[1]]
    assert [n.name for n in bulk] == ["getitem", "getitem_1", "getitem_2"]
    assert rw.created[-6:] == [*bulk, *one] and all(n in rw.changed for n in bulk)
    before = fingerprint(c.gm.graph)
    rw.rollback()
    assert all(n._erased for n in bulk) and before != fingerprint(c.gm.graph)
    assert not [n for n in c.gm.graph.nodes if n.target is operator.getitem]


def test_nodes_made_under_the_guard_are_wired_as_fx_makes_them_and_other_create_hooks_see_their_arguments():
    c, rw, ub = _unbind_graph()
    seen = []
    with rw.guarding(c.gm):  # only the guard's hook: the arguments are set on the made node
        with rw.inserting_after(ub):
            bulk = rw.getitems(ub, 3)
    assert [n.args for n in bulk] == [(ub, 0), (ub, 1), (ub, 2)]
    assert all(list(n.all_input_nodes) == [ub] and n in ub.users for n in bulk)
    found = c.gm.graph.find_nodes(op="call_function", target=operator.getitem)
    assert all(n in found for n in bulk)
    c.gm._register_create_node_hook(lambda n: seen.append((n.name, n.args)))
    try:
        with rw.guarding(c.gm):
            with rw.inserting_after(bulk[-1]):
                more = rw.getitems(ub, 2)
    finally:
        c.gm._create_node_hooks.clear()
    assert seen == [(more[0].name, (ub, 0)), (more[1].name, (ub, 1))]  # made with their arguments
    c.gm.graph.lint()


def test_a_guarded_step_leaves_no_cycle_its_rewriter_is_freed_without_the_collector():
    import gc
    import weakref

    c, rw, ub = _unbind_graph()
    with rw.guarding(c.gm):
        with rw.inserting_after(ub):
            rw.getitems(ub, 2)
    gone = weakref.ref(rw)
    gc.disable()  # the engine runs with the collector paused: only reference counts free a step
    try:
        del rw
        assert gone() is None
    finally:
        gc.enable()


def test_getitems_of_a_value_that_is_not_a_tuple_of_fake_tensors_are_inferred_one_by_one():
    c, rw, ub = _unbind_graph()
    ub.meta["example_value"] = None  # no value to read the pieces from
    with rw.inserting_after(ub):
        made = rw.getitems(ub, 2)
    assert [n.args for n in made] == [(ub, 0), (ub, 1)] and all(n.meta.get("example_value") is None for n in made)
    rw.rollback()


def _fuse_relus(one_by_one: bool):
    """Both relus of TwoTowers replaced by the pieces of one relu over their stack, as a batch
    fusion does: by the group operation, or by the single operations it stands for."""
    c = _captured()
    g = c.gm.graph
    heard: list = []

    class Ear(Listener):
        def notify_inserted(self, node):
            heard.append(("inserted", node.name))

        def notify_erased(self, node):
            heard.append(("erased", node.name, [i.name for i in node.all_input_nodes]))

        def notify_replaced(self, old, new, users):
            heard.append(("replaced", old.name, new.name, [u.name for u in users]))

    relus = [n for n in g.nodes if is_call(n, *RELU)]
    before = fingerprint(g)
    rw = Rewriter(g, [Ear()])
    with rw.inserting_before(relus[0]):
        st = rw.call(torch.stack, [r.args[0] for r in relus])
        pieces = rw.getitems(rw.call(torch.unbind, rw.call(torch.relu, st)), 2)
    if one_by_one:
        for old, new in zip(relus, pieces):
            rw.carry_meta(old, new)
            rw.replace_all_uses(old, new)
        for old in relus:
            rw.erase(old)
    else:
        rw.replace_each(relus, pieces)
    return c, rw, before, heard


def test_a_group_replacement_is_the_single_replacements_it_stands_for_and_rolls_back_exactly():
    c1, rw1, before, heard1 = _fuse_relus(one_by_one=False)
    c2, _, _, heard2 = _fuse_relus(one_by_one=True)
    names = lambda g: [(n.name, str(n.target), str(n.args), [u.name for u in n.users]) for n in g.nodes]  # noqa: E731
    assert names(c1.gm.graph) == names(c2.gm.graph)
    assert heard1 == heard2 and [h[0] for h in heard1].count("erased") == 2
    assert [n.name for n in rw1.erased] == ["relu", "relu_1"]
    user = next(u for u in c1.gm.graph.nodes if u.op == "call_function" and u.target is operator.add)
    assert rw1.original_args(user)[0].name == "relu"  # the arguments before the step changed them
    rw1.validate()
    rw1.rollback()
    assert fingerprint(c1.gm.graph) == before
    c1.gm.graph.lint()


def test_erase_each_erases_users_first_and_refuses_a_kept_use_before_any_change():
    c, rw, ub = _unbind_graph()
    with rw.inserting_after(ub):
        pieces = rw.getitems(ub, 3)
    before = fingerprint(c.gm.graph)
    with pytest.raises(RuntimeError, match="still has users"):
        rw.erase_each([ub, *pieces])  # the unbind's pieces still read it
    assert fingerprint(c.gm.graph) == before
    rw.erase_each([*pieces, ub, pieces[0]])
    assert all(n._erased for n in (*pieces, ub)) and rw.erased[-4:] == [*pieces, ub]


def test_the_final_layout_check_reads_again_a_move_whose_new_value_changed_after_it_was_made():
    from optimus_lens.core.listener import LayoutCheck
    from optimus_lens.core.strides import LayoutError

    g = torch.fx.Graph()
    x = g.placeholder("x")
    r = g.call_function(torch.relu, (x,))
    v = g.call_method("view", (r, 32))
    g.output(v)
    mode = torch._subclasses.fake_tensor.FakeTensorMode()
    x.meta["example_value"] = mode.from_tensor(torch.randn(4, 8))
    for n in (r, v):
        n.meta["example_value"] = meta.infer(n)
    for changed_later in (False, True):
        check = LayoutCheck()
        rw = Rewriter(g, [check])
        with rw.inserting_before(r):
            t = rw.call(torch.tanh, x)
        rw.replace_each([r], [t])  # equal strides: the view sees no difference
        assert (r, t) in rw.same_strides
        if changed_later:  # the replacement's value becomes a transposed one: the view would break
            rw.set_meta(t, "example_value", mode.from_tensor(torch.randn(8, 4)).t())
            with pytest.raises(LayoutError, match="view"):
                check.verify(rw.same_strides)
        else:
            check.verify(rw.same_strides)
        rw.rollback()
