"""The default (global) search finds every group an exhaustive search finds.

Inputs from real models that upstream's bounded search misses (a linear behind a linear,
towers that meet far below their last linear, MMoE's experts and gates on one input),
and an exhaustive oracle: after each batch pass, no key class of its patterns still holds
``min_fuse_set_size`` mutually independent nodes. The oracle computes the largest
anti-chain of a key class its own way (full ancestor walks, then Dilworth's theorem
through networkx's bipartite matching), sharing no code with optimus_lens.core.search.
"""

from __future__ import annotations

import functools

import hypothesis.strategies as st
import networkx as nx
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from torch import nn
from torch.fx import GraphModule, Node

from optimus_lens import sample_models
from optimus_lens.core.engine import Engine, RunOptions, copy_graph_module
from optimus_lens.core.miss import Miss
from optimus_lens.core.pattern import REGISTRY, BatchPattern, SearchOptions
from optimus_lens.core.pipeline import Pass, Pipeline
from optimus_lens.core.record import module_path
from optimus_lens.core.rewriter import Rewriter
from optimus_lens.frontend.capture import capture
from optimus_lens.frontend.run import optimize
from optimus_lens.passes import default_pipeline
from optimus_lens.passes.profit import group_estimate
from tests.test_search import random_dag, small_pipeline

# --------------------------------------------------------------------------- the oracle


def _ancestors(n: Node) -> set[Node]:
    seen, stack = set(), [n]
    while stack:
        for i in stack.pop().all_input_nodes:
            if i not in seen:
                seen.add(i)
                stack.append(i)
    return seen


def width(members: list[Node]) -> int:
    """The largest number of mutually independent ``members``: k minus a maximum
    matching of the comparability graph (Dilworth / Fulkerson)."""
    if len(members) < 2:
        return len(members)
    g = nx.Graph()
    left = [("l", n) for n in members]
    g.add_nodes_from(left)
    g.add_nodes_from(("r", n) for n in members)
    member = set(members)
    for v in members:
        for u in _ancestors(v) & member:
            g.add_edge(("l", u), ("r", v))
    matching = nx.bipartite.hopcroft_karp_matching(g, top_nodes=left)
    return len(members) - len(matching) // 2


def key_classes(gm: GraphModule, pattern: BatchPattern) -> dict:
    out: dict = {}
    for n in gm.graph.nodes:
        if not n.users:
            continue
        k = pattern.key(n)
        if k is not None and not isinstance(k, Miss):
            out.setdefault(k, []).append(n)
    return out


def assert_nothing_left_to_fuse(gm: GraphModule, pipeline: Pipeline) -> int:
    """Run ``pipeline`` over ``gm`` keeping the graph after every pass; after each batch
    pass, every key class of its patterns must be narrower than ``min_fuse_set_size``.
    Returns the number of batch steps."""
    eng = Engine(gm, (), pipeline, RunOptions(verify="off", record=False, keep_stages=True))
    eng.run()
    stages = dict(eng.stages[1:])
    for p in pipeline.enabled():
        for pattern in p.patterns:
            if not isinstance(pattern, BatchPattern):
                continue
            opts = p.options or pattern.options
            refused = {n.name for n in eng._refused.get(pattern.name, ())}  # the step check refused their step
            for k, members in key_classes(stages[p.name], pattern).items():
                members = [n for n in members if n.name not in refused]
                if opts.profitable_only and width(members) == len(members) >= opts.min_fuse_set_size:
                    # left on purpose: the profit estimate refuses the group
                    est = group_estimate(stages[p.name], pattern.fuse, list(members))
                    assert not est.profitable, (p.name, k, [n.name for n in members], est.text())
                    continue
                assert width(members) < opts.min_fuse_set_size, (p.name, k, [n.name for n in members])
    return sum(1 for s in eng.trace.steps if s.pattern.startswith("batch_"))


# --------------------------------------------------------------------------- issue inputs


class LinearBehindLinear(nn.Module):
    """``a2(a1(x)) + b2(b1(x))`` with four Linear(8, 8)."""

    def __init__(self):
        super().__init__()
        self.a1, self.a2, self.b1, self.b2 = (nn.Linear(8, 8) for _ in range(4))

    def forward(self, x):
        return self.a2(self.a1(x)) + self.b2(self.b1(x))


def _groups(trace, pattern: str, nodes_by_name: dict) -> list[list[str]]:
    return [[module_path(nodes_by_name[s])[0] for s in st.sites] for st in trace.steps if st.pattern == pattern]


def _run(model, inputs, **kw):
    res = optimize(model, inputs, verify="step", keep_stages=True, **kw)
    assert res.trace.final_verify.ok and not res.trace.failed_steps()
    names = {n.name: n for n in res.engine.stages[0][1].graph.nodes}
    return res, names


def test_a_linear_behind_a_linear_is_grouped_with_the_linear_that_shares_its_input():
    torch.manual_seed(0)
    model, x = LinearBehindLinear().eval(), torch.randn(4, 8)
    res, names = _run(model, (x,))
    assert _groups(res.trace, "batch_linear_lhs", names) == [["a1", "b1"]]
    assert torch.allclose(res.engine.gm(*res.captured.example_inputs)[0], model(x), atol=1e-6)


def test_upstreams_search_misses_the_linear_behind_a_linear():
    torch.manual_seed(0)
    res, _ = _run(LinearBehindLinear().eval(), (torch.randn(4, 8),), pipeline=default_pipeline(search="upstream"))
    assert not res.trace.steps


def test_twin_towers_fuses_all_18_tower_linears_in_three_groups_of_six_one_layer_each():
    model, inputs = sample_models.get("twin_towers")
    res, names = _run(model, inputs)
    groups = _groups(res.trace, "batch_linear", names)
    assert groups == [[f"towers.{t}.{layer}" for t in range(6)] for layer in (0, 3, 6)]
    assert [len(g) for g in _groups(res.trace, "batch_layernorm", names)] == [6, 6, 6]


def test_upstreams_search_fuses_none_of_the_twin_towers_linears():
    model, inputs = sample_models.get("twin_towers")
    res, _ = _run(model, inputs, pipeline=default_pipeline(search="upstream"))
    assert not res.trace.steps_of_pass("batch_linear")


def test_mmoe_runs_one_wide_matmul_over_x_for_the_8_expert_first_layers_and_the_3_gates():
    model, inputs = sample_models.get("mmoe")
    res, names = _run(model, inputs)
    (group,) = _groups(res.trace, "batch_linear_lhs", names)
    assert sorted(group) == sorted([f"experts.{e}.0" for e in range(8)] + [f"gates.{g}" for g in range(3)])
    # the expert second layers read different inputs: one batched matmul, not an lhs group
    assert [sorted(g) for g in _groups(res.trace, "batch_linear", names)] == [[f"experts.{e}.2" for e in range(8)]]
    x = res.engine.gm.graph.find_nodes(op="placeholder")[0]
    assert not any(u.target is torch.stack for u in x.users), "x must not be stacked"


def test_deepfm_fuses_its_26_field_linears_in_one_group():
    model, inputs = sample_models.get("deepfm")
    res, names = _run(model, inputs)
    assert [sorted(g) for g in _groups(res.trace, "batch_linear", names)] == [sorted(f"proj.{f}" for f in range(26))]


class QKV(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(8, 4), nn.Linear(8, 6), nn.Linear(8, 5)

    def forward(self, x):
        return self.q(x) * 2, self.k(x) + 1, self.v(x) - 1


def test_extending_an_lhs_group_repacks_its_weights_once():
    """q and v fused first, then k added: one cat of the three weights, one split."""
    torch.manual_seed(0)
    model, x = QKV().eval(), torch.randn(3, 8)
    c = capture(model, (x,))
    gm = c.gm
    lhs = REGISTRY["batch_linear_lhs"]
    lin = {module_path(n)[0]: n for n in gm.graph.nodes if n.op == "call_function" and "linear" in str(n.target)}
    lhs.fuse(Rewriter(gm.graph), [lin["q"], lin["v"]])
    (wide,) = [n for n in gm.graph.nodes if n.target is F.linear and n.args[1].target is torch.cat]
    lhs.fuse(Rewriter(gm.graph), [wide, lin["k"]])
    gm.graph.lint()
    gm.recompile()
    cats = [n for n in gm.graph.nodes if n.target is torch.cat]
    assert len(cats) == 2  # weights, biases
    assert all(not any(isinstance(a, Node) and a.target is torch.cat for a in c.args[0]) for c in cats)
    assert sum(1 for n in gm.graph.nodes if n.target is torch.split) == 1
    for got, want in zip(gm(*c.example_inputs), model(x)):
        torch.testing.assert_close(got, want)


# --------------------------------------------------------------------------- exhaustive oracle

dag_params = st.tuples(
    st.integers(0, 2**31), st.integers(5, 40), st.sampled_from([0.0, 0.2, 0.6]), st.integers(2, 3), st.integers(2, 6)
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dag_params)
def test_random_dags_leave_no_key_class_with_enough_independent_members(params):
    seed, size, far, lo, hi = params
    assert_nothing_left_to_fuse(random_dag(seed, size, far), small_pipeline(lo, max(lo, hi), 1, search="global"))


def test_the_oracle_is_not_vacuous_upstreams_search_leaves_groups_that_the_global_one_fuses():
    missed = fused = 0
    for seed in range(30):
        fused += assert_nothing_left_to_fuse(random_dag(seed, 30, 0.2), small_pipeline(2, 4, 1, search="global"))
        try:
            assert_nothing_left_to_fuse(random_dag(seed, 30, 0.2), small_pipeline(2, 4, 2, search="upstream"))
        except AssertionError:
            missed += 1
    assert fused >= 30 and missed >= 5


@functools.cache
def _captured(name: str):
    model, inputs = sample_models.get(name)
    return capture(model, inputs)


# industrial_recsys (5,134 nodes, the paper-scale sample) runs in benchmarks/search_scale.py and the sweep
@pytest.mark.parametrize("name", [n for n in sample_models.names() if n != "industrial_recsys"])
def test_every_sample_model_is_left_with_no_key_class_with_enough_independent_members(name):
    assert_nothing_left_to_fuse(copy_graph_module(_captured(name).gm), default_pipeline())


def test_a_long_chain_of_one_key_is_not_fused_and_costs_one_walk_per_sweep():
    from tests.test_search import towers

    gm = towers(1, 600)  # one tower: every linear depends on the one before
    assert (
        assert_nothing_left_to_fuse(
            gm, Pipeline([Pass("l", [REGISTRY["batch_linear"]], options=SearchOptions(min_fuse_set_size=2))])
        )
        == 0
    )


def test_cli_run_search_upstream_keeps_upstreams_bounded_search(capsys):
    from optimus_lens.cli import main

    assert main(["run", "sample:twin_towers", "--verify", "off"]) == 0
    assert "batch_linear: 3" in capsys.readouterr().out
    assert main(["run", "sample:twin_towers", "--verify", "off", "--search", "upstream"]) == 0
    assert "batch_linear:" not in capsys.readouterr().out


class SharedAndOwnInputs(nn.Module):
    """q, k, v read one input (a batch_linear_lhs group); each tower's linear reads its own."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(8, 8) for _ in range(3))
        self.towers = nn.ModuleList(nn.Linear(4, 4) for _ in range(4))

    def forward(self, x, ys):
        t = [f(y) for f, y in zip(self.towers, ys.unbind(0))]
        return self.q(x) + self.k(x) + self.v(x), torch.stack(t)


def test_the_global_search_keys_only_nodes_whose_group_hint_is_shared(monkeypatch):
    torch.manual_seed(0)
    model, inputs = SharedAndOwnInputs().eval(), (torch.randn(2, 8), torch.randn(4, 3, 4))
    lhs = type(REGISTRY["batch_linear_lhs"])
    keyed: list[str] = []
    key = lhs.key

    def counting(self, node):
        keyed.append(node.name)
        return key(self, node)

    monkeypatch.setattr(lhs, "key", counting)
    with_hints, names = _run(model, inputs)
    hinted = sorted(keyed)
    keyed.clear()
    monkeypatch.setattr(lhs, "hints", lambda self: False)
    without, _ = _run(model, inputs)
    assert _groups(with_hints.trace, "batch_linear_lhs", names) == [["q", "k", "v"]]
    assert [(s.pattern, s.sites) for s in with_hints.trace.steps] == [(s.pattern, s.sites) for s in without.trace.steps]
    assert with_hints.engine.gm.code == without.engine.gm.code
    assert sorted(module_path(names[n])[0] for n in set(hinted)) == ["k", "q", "v"]
    # without hints: the towers' 4 linears and the fused one are keyed too
    assert len(set(keyed)) == 8 and set(hinted) < set(keyed)


def _depths_by_definition(members: list[Node]) -> dict[Node, int]:
    """The most members on one path strictly above each member, from full ancestor walks."""
    member = set(members)
    above = {v: _ancestors(v) & member for v in members}

    @functools.cache
    def depth(v: Node) -> int:
        return max((depth(u) + 1 for u in above[v]), default=0)

    return {v: depth(v) for v in members}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31), st.integers(5, 40), st.sampled_from([0.0, 0.2, 0.6]), st.sampled_from([0, 4, 10_000]))
def test_member_depths_by_the_list_span_and_by_the_region_walk_match_the_definition(seed, size, far, per_member):
    """per_member 0: always the walk over inputs (the span is never short enough); 10,000:
    always the list span; 4: whichever the class's spread picks."""
    import random

    from optimus_lens.core import search
    from optimus_lens.core.index import GraphIndex

    gm = random_dag(seed, size, far)
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    rng = random.Random(seed)
    members = rng.sample(nodes, k=rng.randint(1, len(nodes)))
    saved = search.SPAN_PER_MEMBER, search.SPAN_SLACK
    search.SPAN_PER_MEMBER, search.SPAN_SLACK = per_member, 0 if per_member == 0 else saved[1]
    try:
        got = search.member_depths(members, GraphIndex(gm.graph))
    finally:
        search.SPAN_PER_MEMBER, search.SPAN_SLACK = saved
    assert list(got) == members
    assert got == _depths_by_definition(members)
