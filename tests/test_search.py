"""The greedy search against a plain reference: same fused groups, same final graph.

``reference_run`` below is upstream's algorithm written out the simple way
(torch/_inductor/fx_passes/group_batch_fusion.py: ``apply_group_batch_fusion``,
``get_fusion_candidates``, ``find_independent_subset_greedy`` with its full-ancestor
``find_dependent_nodes``), swept to a fixed point over the whole graph, with the engine's
rule for keeping the graph topologically valid (a node that precedes an input moves to
just after its latest input, its users re-checked) done with list indices. It has none of
the engine's bookkeeping (GraphIndex numberings, cached keys, dirty roots, shared searches,
target index), so any difference in what those skip shows up as a different step list or
a different graph.
"""

from __future__ import annotations

import functools
import json
import operator
import random
from collections import deque

import hypothesis.strategies as st
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx import Graph, GraphModule, Node

from optimus_lens import sample_models
from optimus_lens.core import aliasing
from optimus_lens.core.engine import Engine, RunOptions, copy_graph_module
from optimus_lens.core.index import GraphIndex
from optimus_lens.core.miss import Miss
from optimus_lens.core.pattern import REGISTRY, BatchPattern, SearchOptions
from optimus_lens.core.pipeline import Pass, Pipeline
from optimus_lens.core.record import recording, snapshot_graph
from optimus_lens.core.rewriter import Rewriter
from optimus_lens.core.search import (
    UNUSED,
    SearchObserver,
    fusion_candidates,
    global_groups,
    independent_subsets,
    key_classes,
    member_depths,
)
from optimus_lens.core.stepcheck import StepCheck, UnsafeRewrite
from optimus_lens.frontend.capture import capture
from optimus_lens.passes import default_pipeline

# --------------------------------------------------------------------------- reference


REFUSED: dict[str, set] = {}  # pattern name -> nodes where the step check refused its step (as the engine's)


def _key(pattern, n):
    if n in REFUSED.get(pattern.name, ()):
        return None
    k = pattern.key(n)
    return None if k is None or isinstance(k, Miss) else k


def ref_candidates(pattern: BatchPattern, root: Node, depth: int) -> dict:
    """upstream ``get_fusion_candidates``: BFS over producers, matches not expanded."""
    if root.op == "call_function" and root.target is operator.getitem:
        return {}
    out: dict = {}
    q = deque((1, n) for n in root.all_input_nodes)
    visited = set(root.all_input_nodes)
    while q:
        d, n = q.popleft()
        k = _key(pattern, n)
        if k is not None:
            if n not in out.setdefault(k, []):
                out[k].append(n)
        elif d < depth:
            for m in n.all_input_nodes:
                if m not in visited:
                    visited.add(m)
                    q.append((d + 1, m))
    return out


def find_dependent_nodes(node: Node, interesting: list[Node]) -> set[Node]:
    """upstream: every ancestor of ``node`` (full DFS) that is in ``interesting``."""
    interesting = set(interesting)
    seen, out, stack = set(), set(), [node]
    while stack:
        n = stack.pop()
        for i in n.all_input_nodes:
            if i not in seen:
                seen.add(i)
                if i in interesting:
                    out.add(i)
                stack.append(i)
    return out


def ref_greedy(nodes: list[Node], opts: SearchOptions):
    """upstream ``find_independent_subset_greedy`` (with its dependency cache)."""
    node_list = list(dict.fromkeys(nodes))
    cache: dict = {}
    while node_list:
        subset, subset_deps, next_round = [], set(), []
        for n in node_list:
            if len(subset) >= opts.max_fuse_set_size or n in subset_deps:
                next_round.append(n)
                continue
            deps = cache.pop(n, None)
            if deps is None:
                deps = find_dependent_nodes(n, node_list)
            if not deps.intersection(subset):
                subset.append(n)
                subset_deps.update(deps)
            else:
                next_round.append(n)
                cache[n] = deps
        if len(subset) >= opts.min_fuse_set_size:
            cache = {k: v for k, v in cache.items() if v.isdisjoint(subset)}
            yield subset
        node_list = next_round


def ref_repair_each(graph: Graph, nodes: list[Node]) -> None:
    """Move every node that precedes one of its inputs to just after its latest input."""
    work = deque(nodes)
    while work:
        v = work.popleft()
        if v._erased or not v.all_input_nodes:
            continue
        where = {n: i for i, n in enumerate(graph.nodes)}
        latest = max(v.all_input_nodes, key=where.__getitem__)
        if where[latest] >= where[v]:
            latest.append(v)
            work.extend(v.users)


def ref_repair(graph: Graph, nodes: list[Node]) -> None:
    """The engine's repair: node by node where the graph has effects, else one block."""
    if aliasing.analysis(graph).quiet:
        ref_repair_block(graph, nodes)
    else:
        ref_repair_each(graph, nodes)


def ref_repair_block(graph: Graph, nodes: list[Node]) -> None:
    """The block repair rule, plainly: the nodes now at or before one of their inputs (late)
    move as one block, either down (with every user of a moved node at or before the
    latest input the block reads, placed after that input) or up (with every input of a
    late node at or after it and every input of a moved node at or after the first late
    node, placed before the first node from there that stays), the smaller block, down
    on a tie, never a placeholder up; in the block, by longest path from its first
    nodes, then list order."""
    where = {n: i for i, n in enumerate(graph.nodes)}
    late = [v for v in dict.fromkeys(nodes) if not v._erased and any(where[i] >= where[v] for i in v.all_input_nodes)]
    if not late:
        return
    down = set(late)
    while True:
        top = max(where[i] for v in down for i in v.all_input_nodes)
        more = {u for v in down for u in v.users if u not in down and where[u] <= top}
        if not more:
            break
        down |= more
    first = min(where[v] for v in late)
    up = {i for v in late for i in v.all_input_nodes if where[i] >= where[v]}
    while True:
        more = {i for v in up for i in v.all_input_nodes if i not in up and where[i] >= first}
        if not more:
            break
        up |= more
    going_up = len(up) < len(down) and all(n.op != "placeholder" for n in up)
    block = up if going_up else down

    @functools.cache
    def depth(v: Node) -> int:
        return max((depth(i) + 1 for i in v.all_input_nodes if i in block), default=0)

    order = sorted(block, key=lambda v: (depth(v), where[v]))
    if going_up:
        stay = [n for n in graph.nodes if where[n] >= first and n not in block]
        anchor = stay[0] if stay else graph._root
        for v in order:
            anchor.prepend(v)
    else:
        cur = [n for n in graph.nodes if where[n] <= top and n not in block][-1]
        for v in order:
            cur.append(v)
            cur = v


def reference_run(
    gm: GraphModule, pipeline: Pipeline, sweeps: list | None = None
) -> list[tuple[str, str, tuple[str, ...]]]:
    """Run ``pipeline`` over ``gm`` the plain way; returns (pass, pattern, site names) per
    step. ``sweeps``, if given, receives the sweep number (0 = first) of every step."""
    graph, steps = gm.graph, []
    sweep = 0
    REFUSED.clear()

    def apply(p, pattern, site, do, anchor=None):
        """``do(rw)`` with the engine's step check: a step it refuses is rolled back,
        recorded, and its pattern left out at the site (the anchor of a rewrite)."""
        names = tuple(n.name for n in site)
        safe = StepCheck({n: i for i, n in enumerate(graph.nodes)})
        rw = Rewriter(graph, [safe])
        with recording(gm) as rec:
            do(rw)
        try:
            safe.verify(graph, rw.original_args)
        except UnsafeRewrite:
            rw.rollback()
            REFUSED.setdefault(pattern.name, set()).update([anchor] if anchor is not None else site)
        else:
            ref_repair(graph, [*rec.created_alive(), *(r for r in rec.rewired if not r._erased)])
        steps.append((p.name, pattern.name, names))
        if sweeps is not None:
            sweeps.append(sweep)

    for p in pipeline.enabled():
        for sweep in range(p.max_iterations):  # noqa: B007 - apply() reads it
            before = len(steps)
            for pattern in p.patterns:
                if isinstance(pattern, BatchPattern):
                    opts = p.options or pattern.options
                    node = graph.output_node()
                    while node.op != "root":
                        for nodes in ref_candidates(pattern, node, opts.max_fuse_search_depth).values():
                            if len(nodes) < opts.min_fuse_set_size:
                                continue
                            for subset in ref_greedy(nodes, opts):
                                apply(p, pattern, subset, lambda rw, s=subset, q=pattern: q.fuse(rw, s))
                        node = node.prev
                else:
                    for node in reversed(list(graph.nodes)):
                        if node._erased or node in REFUSED.get(pattern.name, ()):
                            continue
                        t = node.target if node.op in ("call_function", "call_method") else None
                        if pattern.anchors and t not in pattern.anchors:
                            continue
                        m = pattern.match(node)
                        if m is not None and not isinstance(m, Miss):
                            apply(p, pattern, m.nodes, lambda rw, m=m, q=pattern: q.rewrite(rw, m), node)
            if len(steps) == before:
                break
    return steps


def code_of(gm: GraphModule) -> str:
    return gm.graph.python_code("self").src


def engine_run(gm: GraphModule, pipeline: Pipeline, record: bool = True):
    """Run the engine step by step, checking after every step that the index is
    consistent and that replaying the trace gives the live graph."""
    eng = Engine(gm, (), pipeline, RunOptions(verify="off", record=record))
    for k, _step in enumerate(eng.steps(), 1):
        eng.index.check()
        if record:
            assert eng.trace.graph_at(k).signature() == snapshot_graph(gm.graph).signature(), (
                f"replay differs at step {k}"
            )
    return eng.trace


def assert_same_as_reference(gm: GraphModule, pipeline: Pipeline, record: bool = True) -> int:
    """Both runs on copies of ``gm`` (so both name new nodes alike); returns the number of steps."""
    ref_gm, gm = copy_graph_module(gm), copy_graph_module(gm)
    expected = reference_run(ref_gm, pipeline)
    trace = engine_run(gm, pipeline, record)
    got = [(s.pass_name, s.pattern, tuple(s.sites)) for s in trace.steps]
    assert got == expected
    assert code_of(gm) == code_of(ref_gm)
    return len(got)


# --------------------------------------------------------------------------- random DAGs

WIDTH = 4
UNARY = {"relu": F.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid}


def random_dag(seed: int, size: int, p_edge_far: float) -> GraphModule:
    """A random DAG of (2, 4) fp32 tensors: placeholders, then ``size`` ops drawn from
    relu / tanh / sigmoid / linear (shared weight placeholders) / layer_norm / add /
    in-place ``add_``, each reading earlier nodes (mostly recent ones; with probability
    ``p_edge_far`` any earlier one), every sink an output. Example values are FakeTensors."""
    rng = random.Random(seed)
    mode = FakeTensorMode()
    g = Graph()

    def ph(name, shape):
        n = g.placeholder(name)
        n.meta["example_value"] = mode.from_tensor(torch.zeros(shape))
        return n

    def op(fn, *args, **kwargs):
        if isinstance(fn, str):  # a method, e.g. the in-place "add_"
            n = g.call_method(fn, args, kwargs)
            fn = getattr(torch.Tensor, fn)
        else:
            n = g.call_function(fn, args, kwargs)
        vals = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: a.meta["example_value"])
        with mode:
            n.meta["example_value"] = fn(*vals[0], **vals[1])
        return n

    xs = [ph(f"x{i}", (2, WIDTH)) for i in range(rng.randint(1, 3))]
    weights = [ph(f"w{i}", (WIDTH, WIDTH)) for i in range(3)]
    vals = list(xs)

    def pick():
        if rng.random() < p_edge_far:
            return rng.choice(vals)
        return rng.choice(vals[-4:])

    for _ in range(size):
        kind = rng.choice(["relu", "tanh", "sigmoid", "linear", "linear", "layer_norm", "add", "add_"])
        if kind == "add_" and rng.random() < 0.5:
            kind = "relu"
        if kind in UNARY:
            vals.append(op(UNARY[kind], pick()))
        elif kind == "linear":
            vals.append(op(torch._C._nn.linear, pick(), rng.choice(weights)))
        elif kind == "layer_norm":
            vals.append(op(F.layer_norm, pick(), (WIDTH,)))
        elif kind == "add_":  # writes into an earlier tensor: its readers must not fuse
            vals.append(op("add_", pick(), 1.0))
        else:
            vals.append(op(torch.add, pick(), pick()))
    sinks = [v for v in vals[len(xs) :] if not v.users] or [vals[-1]]
    g.output(tuple(sinks))
    return GraphModule(torch.nn.Module(), g)


def small_pipeline(min_size: int, max_size: int, depth: int, search: str = "upstream") -> Pipeline:
    opts = SearchOptions(
        min_fuse_set_size=min_size, max_fuse_set_size=max_size, max_fuse_search_depth=depth, search=search
    )
    batch = [Pass(n, [REGISTRY[n]], options=opts) for n in ("batch_linear", "batch_layernorm", "batch_sigmoid")]
    # two patterns in one pass: a step of either dirties the other's roots
    batch.append(Pass("relu_and_tanh", [REGISTRY["batch_relu"], REGISTRY["batch_tanh"]], options=opts))
    rewrites = [p for p in default_pipeline(search="upstream").passes if not isinstance(p.patterns[0], BatchPattern)]
    return Pipeline(batch + rewrites)


dag_params = st.tuples(
    st.integers(0, 2**31),
    st.integers(5, 40),
    st.sampled_from([0.0, 0.2, 0.6]),
    st.integers(2, 3),
    st.integers(2, 6),
    st.integers(1, 5),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dag_params)
def test_random_dags_fuse_the_same_groups_into_the_same_graph_as_the_reference(params):
    seed, size, far, min_size, max_size, depth = params
    assert_same_as_reference(random_dag(seed, size, far), small_pipeline(min_size, max(min_size, max_size), depth))


# random DAGs (seed, size, p_edge_far, min, max, depth) on which a batch pass of the reference
# fuses again in a later sweep: the engine must find those groups from its dirty roots alone
LATER_SWEEP_CASES = [
    (41, 22, 0.6, 2, 2, 3),
    (58, 28, 0.2, 2, 2, 3),
    (77, 35, 0.6, 2, 3, 3),
    (78, 36, 0.2, 2, 2, 4),
    (83, 25, 0.6, 2, 2, 3),
    (84, 33, 0.6, 2, 2, 5),
    (94, 27, 0.2, 2, 2, 4),
    (104, 40, 0.2, 2, 2, 3),
    (115, 38, 0.6, 2, 2, 2),
    (119, 39, 0.6, 2, 2, 5),
    (120, 26, 0.2, 2, 2, 5),
    (125, 38, 0.2, 2, 2, 4),
    (129, 28, 0.6, 2, 2, 5),
    (142, 28, 0.6, 2, 2, 5),
    (158, 31, 0.2, 2, 2, 2),
    (192, 21, 0.6, 2, 2, 5),
    (193, 27, 0.6, 2, 2, 4),
    (217, 40, 0.6, 2, 2, 3),
    (222, 34, 0.2, 2, 2, 4),
    (225, 32, 0.2, 2, 2, 3),
    (231, 37, 0.2, 2, 2, 5),
    (238, 35, 0.6, 2, 2, 5),
    (244, 40, 0.6, 2, 3, 5),
    (268, 34, 0.6, 2, 2, 5),
    (277, 38, 0.2, 2, 2, 3),
    (278, 39, 0.6, 2, 3, 4),
    (295, 37, 0.6, 2, 4, 5),
    (328, 30, 0.6, 2, 3, 5),
]


def test_groups_the_reference_finds_only_in_a_later_sweep_are_found_from_dirty_roots():
    later = 0
    for seed, size, far, lo, hi, depth in LATER_SWEEP_CASES:
        pipeline = small_pipeline(lo, hi, depth)
        sweeps: list[int] = []
        steps = reference_run(random_dag(seed, size, far), pipeline, sweeps)
        later += sum(1 for st, w in zip(steps, sweeps) if w > 0 and st[1].startswith("batch_"))
        assert_same_as_reference(random_dag(seed, size, far), pipeline, record=False)
    assert later >= len(LATER_SWEEP_CASES)


def test_random_dags_do_fuse_so_the_comparison_is_not_vacuous():
    fused = sum(assert_same_as_reference(random_dag(s, 30, 0.2), small_pipeline(2, 4, 3)) for s in range(10))
    assert fused >= 10


class ReluByUsers(type(REGISTRY["batch_relu"])):
    """batch_relu whose group key also holds the targets of the node's users (upstream's
    ``fuse_nodes_with_same_users``): fusing a relu's consumers changes its key."""

    name = "relu_by_users_test_only"

    def key(self, node):
        k = super().key(node)
        if k is None or isinstance(k, Miss):
            return k
        return (k, tuple(sorted(str(u.target) for u in node.users)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31), st.integers(10, 40), st.integers(2, 4))
def test_keys_that_read_users_are_recomputed_when_a_step_changes_the_users(seed, size, depth):
    opts = SearchOptions(min_fuse_set_size=2, max_fuse_set_size=4, max_fuse_search_depth=depth, search="upstream")
    pipeline = Pipeline(
        [Pass("users", [REGISTRY["batch_tanh"], REGISTRY["batch_sigmoid"], ReluByUsers()], options=opts)]
    )
    assert_same_as_reference(random_dag(seed, size, 0.3), pipeline, record=False)


def test_a_key_that_changes_when_a_step_fuses_the_users_is_not_served_stale():
    # relu_a, relu_b feed tanhs that fuse (max 2), relu_c's tanh is left over: afterwards
    # relu_c's users are (tanh,) and relu_a's, relu_b's are (stack,), so only a and b group
    mode = FakeTensorMode()
    g = Graph()
    x = g.placeholder("x")
    x.meta["example_value"] = mode.from_tensor(torch.zeros(2, WIDTH))
    nodes = {}
    for name, fn, src in [
        ("relu_a", F.relu, "x"),
        ("relu_b", F.relu, "x"),
        ("relu_c", F.relu, "x"),
        ("tanh_a", torch.tanh, "relu_a"),
        ("tanh_b", torch.tanh, "relu_b"),
        ("tanh_c", torch.tanh, "relu_c"),
    ]:
        n = nodes[name] = g.call_function(fn, (nodes.get(src, x),))
        n.name = name
        with mode:
            n.meta["example_value"] = fn(torch.zeros(2, WIDTH))
    g.output((nodes["tanh_a"], nodes["tanh_b"], nodes["tanh_c"]))
    opts = SearchOptions(min_fuse_set_size=2, max_fuse_set_size=2, max_fuse_search_depth=5, search="upstream")
    pipeline = Pipeline([Pass("users", [REGISTRY["batch_tanh"], ReluByUsers()], options=opts)])
    assert assert_same_as_reference(GraphModule(torch.nn.Module(), g), pipeline) == 2


def _is_ancestor(a: Node, b: Node) -> bool:
    return a in find_dependent_nodes(b, [a])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31), st.integers(5, 40), st.integers(1, 4), st.integers(1, 6))
def test_independent_subsets_yield_anti_chains_exactly_like_upstreams_greedy(seed, size, min_size, max_size):
    gm = random_dag(seed, size, 0.3)
    rng = random.Random(seed)
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    cands = rng.sample(nodes, k=min(len(nodes), rng.randint(1, 15)))
    opts = SearchOptions(min_fuse_set_size=min_size, max_fuse_set_size=max(min_size, max_size))
    got = list(independent_subsets(cands, GraphIndex(gm.graph), opts))
    for subset in got:
        assert opts.min_fuse_set_size <= len(subset) <= opts.max_fuse_set_size
        for a in subset:
            for b in subset:
                assert a is b or not _is_ancestor(a, b), f"{a} is an ancestor of {b}"
    assert got == list(ref_greedy(cands, opts))


def test_a_long_chain_bucket_is_split_into_single_members_and_dropped():
    g = Graph()
    x = g.placeholder("x")
    chain = [x]
    for _ in range(6):
        chain.append(g.call_function(torch.relu, (chain[-1],)))
    g.output(chain[-1])
    assert list(independent_subsets(chain[1:], GraphIndex(g), SearchOptions(min_fuse_set_size=2))) == []


class Seen(SearchObserver):
    """Every report of the search, kept as it came."""

    def __init__(self):
        self.visits, self.rounds, self.depths, self.left, self.classes = [], [], [], [], {}

    def on_visit(self, depth, node, key):
        self.visits.append((depth, node, key))

    def on_round(self, subset, waiting):
        self.rounds.append((list(subset), dict(waiting)))

    def on_depths(self, depths, above):
        self.depths.append((depths, above))

    def on_left_out(self, node, reason):
        self.left.append((node, reason))

    def on_classes(self, classes):
        self.classes = classes


def _groups(members, index, opts, observer):
    """:func:`global_groups` as the engine asks it, a member of a yielded group counting as gone."""
    taken, out = set(), []
    for g in global_groups(members, index, opts, lambda n: n not in taken, observer):
        taken.update(g)
        out.append(g)
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31), st.integers(5, 40), st.integers(2, 3), st.integers(1, 4))
def test_an_observer_sees_each_move_of_the_search_and_changes_no_result(seed, size, min_size, depth):
    gm = random_dag(seed, size, 0.3)
    pattern = REGISTRY["batch_relu"]
    opts = SearchOptions(min_fuse_set_size=min_size, max_fuse_set_size=4, max_fuse_search_depth=depth)
    index = GraphIndex(gm.graph)
    for root in gm.graph.nodes:
        seen = Seen()
        got = fusion_candidates(root, pattern.key, depth, observer=seen)
        assert got == fusion_candidates(root, pattern.key, depth)
        matched: dict = {}
        for d, n, k in seen.visits:  # the matched visits, in order, are the buckets
            assert 1 <= d <= depth
            if k is not None:
                matched.setdefault(k, []).append(n)
        assert matched == got
        for nodes in got.values():
            seen = Seen()
            subsets = list(independent_subsets(nodes, index, opts, seen))
            assert subsets == list(independent_subsets(nodes, index, opts))
            assert [s for s, _ in seen.rounds if len(s) >= min_size] == subsets
            for subset, waiting in seen.rounds:
                for n, why in waiting.items():
                    assert n not in subset
                    if why.startswith("depends on chosen "):
                        names = why.removeprefix("depends on chosen ").split(", ")
                        assert any(_is_ancestor(m, n) for m in subset if m.name in names), why
    keyed = [n for n in gm.graph.nodes if n.users]
    seen = Seen()
    classes = key_classes(gm.graph.nodes, pattern.key, index, opts, seen)
    assert classes == key_classes(gm.graph.nodes, pattern.key, index, opts)
    assert {n for _, ms in classes for n in ms} <= set(keyed)
    assert all(len(ms) >= min_size for _, ms in classes)
    left = {n for n, _ in seen.left}
    assert left | {n for ms in seen.classes.values() for n in ms} == set(gm.graph.nodes)
    assert all(r is UNUSED for n, r in seen.left if not n.users and _key(pattern, n) is not None)
    for _, members in classes:
        seen = Seen()
        assert _groups(members, index, opts, seen) == _groups(members, index, opts, None)
        depths, above = seen.depths[0]
        assert depths == member_depths(sorted(members, key=index.pos.__getitem__), index)
        for n in members:
            assert above[n] == {m for m in members if m is not n and _is_ancestor(m, n)}


# --------------------------------------------------------------------------- work done


def towers(n_towers: int, layers: int) -> GraphModule:
    """x (2, 4*T) split into T towers of ``layers`` x (linear -> relu), concatenated; the
    nodes carry the module path and source line Dynamo records."""
    mode = FakeTensorMode()
    g = Graph()

    def where(n, module, line):
        n.meta["nn_module_stack"] = {module: (f"L['self'].{module}", torch.nn.Linear)}
        n.meta["stack_trace"] = f'  File "towers.py", line {line}, in forward\n    h = self.{module}(h)\n'

    def ph(name, shape):
        n = g.placeholder(name)
        n.meta["example_value"] = mode.from_tensor(torch.zeros(shape))
        return n

    def op(fn, *args, **kwargs):
        n = g.call_function(fn, args, kwargs)
        vals = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: a.meta["example_value"])
        with mode:
            n.meta["example_value"] = fn(*vals[0], **vals[1])
        return n

    x = ph("x", (2, WIDTH * n_towers))
    ws = [[ph(f"w{t}_{i}", (WIDTH, WIDTH)) for i in range(layers)] for t in range(n_towers)]
    split = op(torch.split, x, WIDTH, dim=1)
    outs = []
    for t in range(n_towers):
        h = op(operator.getitem, split, t)
        for i, w in enumerate(ws[t]):
            where(w, f"towers.{t}.fc{i}", 1)
            h = op(torch._C._nn.linear, h, w)
            where(h, f"towers.{t}.fc{i}", 10 + i)
            h = op(F.relu, h)
            where(h, f"towers.{t}.act{i}", 10 + i)
        outs.append(h)
    g.output((op(torch.cat, outs, dim=1),))
    return GraphModule(torch.nn.Module(), g)


def search_work(gm: GraphModule, monkeypatch) -> dict[str, int]:
    """Root searches, nodes examined by them, and keys computed in one engine run."""
    import optimus_lens.core.engine as engine_mod
    import optimus_lens.core.search as search_mod

    work = {"searches": 0, "examined": 0, "keys": 0}

    class Counting(search_mod.CandidateSearch):
        def __init__(self, key, depth):
            def counted(n):
                work["examined"] += 1
                return key(n)

            super().__init__(counted, depth)

        def __call__(self, root):
            work["searches"] += 1
            return super().__call__(root)

    class CountingKeys(search_mod.KeyCache):
        def __missing__(self, n):
            work["keys"] += 1
            return super().__missing__(n)

    monkeypatch.setattr(engine_mod, "CandidateSearch", Counting)
    monkeypatch.setattr(engine_mod, "KeyCache", CountingKeys)
    Engine(gm, (), default_pipeline(search="upstream"), RunOptions(verify="off", record=False)).run()
    monkeypatch.undo()
    return work


def test_search_work_grows_linearly_with_graph_depth(monkeypatch):
    # work(L) = a + b*L: going from 8 to 16 layers adds twice what going from 4 to 8 added
    graphs = {n: towers(8, n) for n in (4, 8, 16)}
    sizes = {n: len(g.graph.nodes) for n, g in graphs.items()}
    work = {n: search_work(g, monkeypatch) for n, g in graphs.items()}
    for k in work[4]:
        assert work[16][k] - work[8][k] <= 2.2 * (work[8][k] - work[4][k]), (k, work)
    assert sizes[16] - sizes[8] == 2 * (sizes[8] - sizes[4])
    assert len(graphs[16].graph.nodes) < 0.6 * sizes[16]  # and it did fuse


def test_batch_passes_with_fewer_same_key_nodes_than_min_fuse_set_size_search_no_root(monkeypatch):
    gm = towers(4, 1)  # 4 linears and 4 relus in the whole graph: a group needs 5
    work = search_work(gm, monkeypatch)
    assert work["searches"] == 0
    assert not any(n.target is torch.bmm or n.target is torch.baddbmm for n in gm.graph.nodes)


# --------------------------------------------------------------------------- index


def test_index_stays_valid_when_many_nodes_are_inserted_at_one_place():
    g = Graph()
    x = g.placeholder("x")
    y = g.call_function(torch.relu, (x,))
    g.output(y)
    index = GraphIndex(g)
    last = x
    for _ in range(3000):  # every insert lands between x's latest successor and y
        with g.inserting_after(last):
            last = g.call_function(torch.neg, (last,))
        index.update([last], [], [])
    y.replace_input_with(x, last)
    index.update([], [], [y])
    index.check()
    assert index.renumbers == 1  # only the initial numbering: inserts relabel locally
    assert index.relabels > 0


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.sampled_from([2, 4, 64]))
def test_index_stays_valid_under_random_inserts_and_rewires_with_tiny_gaps(seed, gap):
    """Runs of new nodes land anywhere (several per step, before their own inputs too)
    and users are rewired to them; with labels 2..64 apart, relabelling happens often."""
    from unittest import mock

    import optimus_lens.core.index as index_mod

    rng = random.Random(seed)
    with mock.patch.object(index_mod, "GAP", gap), mock.patch.object(index_mod, "SPREAD", 2):
        g = Graph()
        nodes = [g.placeholder("x")]
        for _ in range(10):
            nodes.append(g.call_function(torch.relu, (rng.choice(nodes),)))
        g.output(nodes[-1])
        index = GraphIndex(g)
        for _ in range(25):
            created = []
            for _ in range(rng.randint(1, 3)):
                where = rng.choice([n for n in g.nodes if n.op != "placeholder"])
                with g.inserting_before(where):
                    for _ in range(rng.randint(1, 4)):
                        created.append(g.call_function(torch.neg, (rng.choice(nodes),)))
            rewired = []
            for c in created:
                users = [
                    u
                    for u in g.nodes
                    if u.op == "call_function" and u not in created and u.args[0] is not c and rng.random() < 0.1
                ]
                for u in users[:1]:
                    if u in find_dependent_nodes(c, [u]):  # would make a cycle
                        continue
                    u.replace_input_with(u.args[0], c)
                    rewired.append(u)
            nodes += created
            index.update(created, [], rewired)
            index.check()
        assert index.renumbers == 1


def test_repair_moves_a_node_created_before_its_inputs_and_its_users():
    g = Graph()
    a = g.placeholder("a")
    b = g.call_function(torch.relu, (a,))
    c = g.call_function(torch.tanh, (b,))
    g.output(c)
    index = GraphIndex(g)
    with g.inserting_before(b):
        s = g.call_function(torch.add, (b, c))  # reads nodes that come after it
    d = g.call_function(torch.neg, (s,))
    s.append(d)
    index.update([s, d], [], [])
    index.check()
    order = list(g.nodes)
    assert order.index(s) > order.index(c) and order.index(d) > order.index(s)


def _chains(n: int, depth: int) -> tuple[Graph, list[list[Node]]]:
    """Placeholder a, then n chains of ``depth`` relus on it, chain after chain."""
    g = Graph()
    a = g.placeholder("a")
    chains = []
    for _ in range(n):
        h, chain = a, []
        for _ in range(depth):
            h = g.call_function(torch.relu, (h,))
            chain.append(h)
        chains.append(chain)
    g.output(tuple(c[-1] for c in chains))
    return g, chains


def test_repair_moves_the_late_inputs_of_a_new_node_up_when_that_moves_fewer_nodes():
    g, chains = _chains(4, 5)
    index = GraphIndex(g)
    with g.inserting_before(chains[0][1]):  # reads the first node of every chain
        s = g.call_function(torch.stack, ([c[0] for c in chains],))
    chains[0][1].replace_input_with(chains[0][0], s)
    moved = index.update([s], [], [chains[0][1]], block=True)
    index.check()
    assert moved == 3  # chains 1..3's first nodes, not chain 0's tail below s
    order = list(g.nodes)
    assert [order.index(c[0]) for c in chains[1:]] == sorted(order.index(c[0]) for c in chains[1:])
    assert order.index(chains[3][0]) < order.index(s)


def test_repair_moves_a_block_down_when_moving_inputs_up_would_move_more_or_a_placeholder():
    g, chains = _chains(2, 6)
    index = GraphIndex(g)
    with g.inserting_before(chains[0][0]):  # reads the last node of chain 1: its 6 nodes would go up
        s = g.call_function(torch.neg, (chains[1][-1],))
    t = g.call_function(torch.tanh, (s,))
    s.append(t)
    moved = index.update([s, t], [], [], block=True)
    index.check()
    assert moved == 2
    order = list(g.nodes)
    assert order.index(chains[1][-1]) < order.index(s) < order.index(t)
    g, chains = _chains(2, 3)
    with g.inserting_before(g.output_node()):
        b = g.placeholder("b")  # last in the list: a late input that is a placeholder
    index = GraphIndex(g)
    with g.inserting_before(chains[0][0]):
        u = g.call_function(torch.add, (chains[0][0], b))
        v = g.call_function(torch.neg, (u,))
        w = g.call_function(torch.neg, (v,))
    moved = index.update([u, v, w], [], [], block=True)  # up would move b alone, down moves all three
    index.check()
    assert moved == 3
    order = list(g.nodes)
    assert order.index(b) == order.index(u) - 1 and order.index(b) > order.index(chains[1][-1])


@pytest.mark.parametrize("n_towers, layers", [(8, 6), (16, 3)])
def test_repair_moves_at_most_one_node_per_tower_per_step_on_a_towers_graph(n_towers, layers):
    """A fusion is inserted before its first member and reads the last tower's input:
    repair lifts the other towers' inputs above it instead of moving their later
    layers below it (which made the moves quadratic in depth)."""
    gm = towers(n_towers, layers)
    eng = Engine(gm, (), default_pipeline(), RunOptions(verify="off", record=False))
    moves = []
    update = eng.index.update

    def counted(*args, **kwargs):
        moves.append(update(*args, **kwargs))
        return moves[-1]

    eng.index.update = counted  # type: ignore[method-assign]
    eng.run()
    eng.index.check()
    assert len(moves) > layers and max(moves) <= n_towers, moves


# --------------------------------------------------------------------------- sample models


@functools.cache
def _captured(name: str):
    model, inputs = sample_models.get(name)
    return capture(model, inputs)


@pytest.mark.parametrize("name", sample_models.names())
def test_every_sample_model_fuses_the_same_groups_into_the_same_graph_as_the_reference(name):
    c = _captured(name)
    assert_same_as_reference(copy_graph_module(c.gm), default_pipeline(search="upstream"))


def test_recsys_towers_has_steps_to_compare():
    c = _captured("recsys_towers")
    assert assert_same_as_reference(copy_graph_module(c.gm), default_pipeline(search="upstream")) >= 3


# --------------------------------------------------------------------------- trace size


def test_node_record_json_leaves_out_defaults_and_derivable_inputs_and_reads_back():
    from optimus_lens.core.trace import NodeRecord

    rec = NodeRecord(
        "cat",
        "call_function",
        "torch.cat",
        [[{"node": "a"}, {"node": "b"}, {"node": "a"}]],
        {"dim": 1},
        ["a", "b"],
        [2, 8],
        "float32",
    )
    d = rec.to_json()
    assert set(d) == {"name", "op", "target", "args", "kwargs", "shape", "dtype"}
    assert NodeRecord.from_json(d) == rec
    odd = NodeRecord("x", "placeholder", "x", inputs=["y"])  # inputs not derivable: kept
    assert NodeRecord.from_json(odd.to_json()) == odd
    full = {
        "name": "p",
        "op": "placeholder",
        "target": "p",
        "args": [],
        "kwargs": {},
        "inputs": [],
        "shape": None,
        "dtype": None,
        "module": None,
        "module_type": None,
        "source": None,
    }
    assert NodeRecord.from_json(full) == NodeRecord("p", "placeholder", "p")


def test_a_fused_towers_trace_is_under_three_snapshots_and_its_deltas_hold_only_changed_nodes():
    gm = towers(16, 6)
    snapshot_bytes = len(json.dumps(snapshot_graph(gm.graph).to_json(), separators=(",", ":")))
    trace = Engine(gm, (), default_pipeline(search="upstream"), RunOptions(verify="off")).run()
    assert len(trace.steps) >= 12
    assert len(trace.dumps()) <= 3 * snapshot_bytes
    for k, step in enumerate(trace.steps, 1):
        before = trace.before(k).nodes
        for rec in step.delta.upsert:
            assert rec.name in step.created or before[rec.name] != rec, f"step {k} re-records unchanged {rec.name}"


# --------------------------------------------------------------------------- garbage collector


class _RaisingFuse(type(REGISTRY["batch_relu"])):
    name = "raising_fuse_test_only"

    def fuse(self, graph, nodes):
        raise RuntimeError("boom")


def test_the_collector_is_paused_only_while_the_engine_works_and_restored_after_an_error():
    import gc

    from optimus_lens.core.engine import PatternError

    assert gc.isenabled()
    eng = Engine(towers(8, 2), (), default_pipeline(search="upstream"), RunOptions(verify="off", record=False))
    seen = [gc.isenabled() for _ in eng.steps()]
    assert seen and all(seen)  # the caller's code between steps runs with the collector on
    assert gc.isenabled()
    opts = SearchOptions(min_fuse_set_size=2)
    with pytest.raises(PatternError, match="boom"):
        Engine(
            towers(8, 2),
            (),
            Pipeline([Pass("p", [_RaisingFuse()], options=opts)]),
            RunOptions(verify="off", on_error="stop"),
        ).run()
    assert gc.isenabled()


# --------------------------------------------------------------------------- memo while keying


def test_is_written_is_answered_from_a_cached_analysis_that_follows_every_change():
    from torch.fx import symbolic_trace

    from optimus_lens.core import aliasing
    from optimus_lens.core.aliasing import is_written

    class M(torch.nn.Module):
        def forward(self, x):
            a, b, c = torch.split(x, 2, dim=1)
            y = torch.relu(a)
            b.add_(1)  # writes into x's storage through a view
            return y, c

    g = symbolic_trace(M()).graph
    nodes = list(g.nodes)
    plain = {n: is_written(n) for n in nodes}
    assert plain[next(n for n in nodes if n.op == "placeholder")]
    assert not plain[next(n for n in nodes if n.target is torch.relu)]
    version = aliasing.analysis(g).version
    assert {n: is_written(n) for n in nodes} == plain
    assert aliasing.analysis(g).version == version  # nothing changed: the same tables answer
    relu = next(n for n in nodes if n.target is torch.relu)
    with g.inserting_after(relu):
        g.call_method("mul_", (relu, 2))  # a change made around the Rewriter: the node count differs
    assert is_written(relu)  # not a stale answer
