"""Walkthroughs of the predefined patterns (optimus.teach): built from each pattern's
registration and teaching model, search frames that agree with the engine, exercises
on which the pattern really does not fire."""
import pytest

from optimus.capture import capture
from optimus.engine import Engine, RunOptions, copy_graph_module
from optimus.pattern import get
from optimus.pipeline import Pass, Pipeline
from optimus.run import model_and_inputs
from optimus.search import fusion_candidates
from optimus.teach import (TeachError, bfs_rings, greedy_rounds, lesson_pipeline, predefined, search_frames,
                           teaching_model, walkthrough)
from optimus.why import DryRun

BATCH = [n for n in predefined() if get(n).kind == "batch"]


@pytest.fixture(scope="module")
def walks():
    """Every predefined pattern's walkthrough (latency with 2 samples: the test checks the figures exist)."""
    return {n: walkthrough(n, repeats=2, warmup=1) for n in predefined()}


def _captured(pattern):
    model, inputs, _ = model_and_inputs("sample:" + teaching_model(pattern))
    return capture(model, tuple(inputs))


def test_every_predefined_pattern_has_a_teaching_model_on_which_it_fires(walks):
    for name, w in walks.items():
        assert w.model == teaching_model(name)
        assert w.sites, f"{name} makes no step on {w.model}"
        assert all(s.pattern == name for s in w.trace.steps)
        assert w.trace.final_verify is not None and w.trace.final_verify.ok, name


def test_walkthrough_text_comes_from_the_pattern_registration(walks):
    for name, w in walks.items():
        p = get(name)
        first = w.slides[0]
        assert first.kind == "before" and p.description in first.lines
        for pre in p.preconditions:
            assert f"• {pre}" in first.lines
        assert p.source in first.lines[-1]
        kinds = [s.kind for s in w.slides]
        assert kinds[:4] == ["before", "search", "match", "after"] and "gain" in kinds and kinds[-1] == "exercise"
        match = next(s for s in w.slides if s.kind == "match")
        assert all(site in " ".join(match.lines) for site in w.sites[0])


def test_what_it_bought_is_measured(walks):
    g = walks["batch_relu"].gain
    assert g.nodes_before == walks["batch_relu"].trace.nodes_before
    assert g.nodes_after == walks["batch_relu"].trace.nodes_after
    for t in (g.before_ms, g.after_ms):
        assert 0 < t[1] <= t[0] <= t[2]
    assert g.peak_before > 0 and g.peak_after > 0 and g.repeats == 2


@pytest.mark.parametrize("mode", ["global", "upstream"])
@pytest.mark.parametrize("name", ["batch_linear", "batch_relu", "batch_layernorm", "batch_linear_lhs"])
def test_search_frames_end_with_the_groups_the_engine_fuses(name, mode):
    w = walkthrough(name, timing=False, search=mode)
    cap = _captured(name)
    p = get(name)
    eng = Engine(cap.gm, cap.example_inputs, Pipeline([Pass(name, [p], options=p.options.replace(search=mode))]),
                 RunOptions(verify="off"))
    fused = [sorted(s.sites) for s in eng.run().steps]
    assert sorted(map(sorted, w.search.frames[-1].groups)) == sorted(fused)
    assert w.search.groups == w.search.frames[-1].groups


@pytest.mark.parametrize("mode", ["global", "upstream"])
def test_a_member_that_depends_on_another_is_left_out_with_the_reason(walks, mode):
    w = walkthrough("batch_relu", timing=False, search=mode)
    d = w.dependent
    last = w.sites[0][-1]
    assert all(last not in g for g in d.groups) and len(d.groups) == 1
    reasons = {n: r for f in d.frames for n, r in f.left_out.items()}
    assert last in reasons and w.sites[0][0] in reasons[last]


def test_dependent_variant_groups_agree_with_the_engine():
    from optimus.teach import _depend_last

    for name in ["batch_relu", "batch_layernorm"]:
        cap = _captured(name)
        w = walkthrough(name, timing=False)
        gm = copy_graph_module(cap.gm)
        _depend_last(gm, w.sites[0])
        dry = DryRun(gm, lesson_pipeline(get(name)))
        assert [sorted(s.sites) for s in dry.steps] == [sorted(g) for g in w.dependent.groups]


def test_upstream_rings_are_fusion_candidates_with_visits_recorded():
    cap = _captured("batch_linear")
    p = get("batch_linear")

    def key(n):
        k = p.key(n)
        return None if isinstance(k, str) else k

    for root in cap.gm.graph.nodes:
        visits, buckets = bfs_rings(root, key, 5)
        assert buckets == fusion_candidates(root, key, 5)
        assert all(1 <= d <= 5 for d, _, _ in visits)


def test_greedy_rounds_replays_independent_subsets():
    from optimus.search import GraphIndex, independent_subsets
    from optimus.teach import _depend_last

    cap = _captured("batch_relu")
    w = walkthrough("batch_relu", timing=False)
    gm = copy_graph_module(cap.gm)
    _depend_last(gm, w.sites[0])
    p = get("batch_relu")
    nodes = [n for n in gm.graph.nodes if n.name in w.sites[0]]
    index = GraphIndex(gm.graph)
    want = [[n.name for n in s] for s in independent_subsets(nodes, index, p.options)]
    got = [[n.name for n in s] for s, _ in greedy_rounds(nodes, index, p.options) if len(s) >= p.options.min_fuse_set_size]
    assert got == want == [w.sites[0][:-1]]


def test_every_exercise_is_a_variant_where_the_pattern_does_not_fire(walks):
    for name, w in walks.items():
        e = w.exercise
        assert e is not None, name
        assert e.node in e.graph.nodes and e.question and e.change
        assert set(e.added) <= set(e.graph.nodes)
        dry = DryRun(e.gm, lesson_pipeline(get(name)))
        assert not [s for s in dry.steps if s.pattern == name], name
        verdict = dry.explain(e.node, [name]).verdicts[0]
        assert not verdict.applies and verdict.text == e.answer, name
        assert not e.answer.startswith(("not an anchor", "no match")), name


def test_unknown_pattern_is_a_clear_error():
    with pytest.raises(TeachError, match="unknown pattern 'batch_nope'; known: batch_linear"):
        walkthrough("batch_nope")
    assert isinstance(TeachError("x"), KeyError)


def test_search_frames_leave_the_graph_unchanged():
    cap = _captured("batch_tanh")
    before = str(cap.gm.graph)
    search_frames(cap.gm, get("batch_tanh"))
    search_frames(cap.gm, get("batch_tanh"), "upstream")
    assert str(cap.gm.graph) == before
