"""Walkthroughs of the predefined patterns (optimus_lens.teach): built from each pattern's
registration and teaching model, search frames that agree with the engine, exercises
on which the pattern really does not fire."""

import pytest

from optimus_lens.core.engine import Engine, RunOptions, copy_graph_module
from optimus_lens.core.index import GraphIndex
from optimus_lens.core.pipeline import Pass, Pipeline
from optimus_lens.core.search import SearchObserver, fusion_candidates, independent_subsets
from optimus_lens.debug.why import DryRun
from optimus_lens.frontend.capture import capture
from optimus_lens.frontend.run import model_and_inputs
from optimus_lens.passes import pattern_named
from optimus_lens.passes.profit import group_estimate
from optimus_lens.teach.lookup import TeachError, lesson_pipeline, predefined, teaching_model
from optimus_lens.teach.replay import search_frames
from optimus_lens.teach.variants import depend_last
from optimus_lens.teach.walk import walkthrough

BATCH = [n for n in predefined() if pattern_named(n).kind == "batch"]


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
        p = pattern_named(name)
        first = w.slides[0]
        assert first.kind == "before" and p.description in first.lines
        for pre in p.preconditions:
            assert f"• {pre}" in first.lines
        assert p.source in first.lines[-1]
        kinds = [s.kind for s in w.slides]
        want = ["before", "search", *(["dependent"] if w.dependent else []), "match", "after", "gain", "exercise"]
        assert kinds == want, name
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
@pytest.mark.parametrize("name", BATCH)
def test_search_frames_end_with_the_groups_the_engine_fuses(name, mode):
    w = walkthrough(name, timing=False, search=mode)
    cap = _captured(name)
    p = pattern_named(name)
    eng = Engine(
        cap.gm,
        cap.example_inputs,
        Pipeline([Pass(name, [p], options=p.options.replace(search=mode), estimate=group_estimate)]),
        RunOptions(verify="off"),
    )
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
    for name in ["batch_relu", "batch_layernorm"]:
        cap = _captured(name)
        w = walkthrough(name, timing=False)
        gm = copy_graph_module(cap.gm)
        depend_last(gm, w.sites[0])
        dry = DryRun(gm, lesson_pipeline(pattern_named(name)))
        assert [sorted(s.sites) for s in dry.steps] == [sorted(g) for g in w.dependent.groups]


class _Seen(SearchObserver):
    def __init__(self):
        self.visits, self.rounds = [], []

    def on_visit(self, depth, node, key):
        self.visits.append((depth, node, key))

    def on_round(self, subset, waiting):
        self.rounds.append((list(subset), {n.name: why for n, why in waiting.items()}))


def test_upstream_rings_are_the_visits_fusion_candidates_reports():
    cap = _captured("batch_linear")
    p = pattern_named("batch_linear")
    w = walkthrough("batch_linear", timing=False, search="upstream")
    root = next(n for n in cap.gm.graph.nodes if n.name == w.search.root)
    seen = _Seen()
    assert fusion_candidates(root, p.key, 5, observer=seen) == fusion_candidates(root, p.key, 5)
    assert all(1 <= d <= 5 for d, _, _ in seen.visits)
    rings = [f for f in w.search.frames if f.title.startswith("Ring ")]
    assert len(rings) == max(d for d, _, _ in seen.visits)
    assert rings[-1].marks == {root.name: 0, **{n.name: d for d, n, _ in seen.visits}}


def test_greedy_rounds_are_the_rounds_independent_subsets_reports():
    cap = _captured("batch_relu")
    w = walkthrough("batch_relu", timing=False, search="upstream")
    gm = copy_graph_module(cap.gm)
    depend_last(gm, w.sites[0])
    p = pattern_named("batch_relu")
    nodes = [n for n in gm.graph.nodes if n.name in w.sites[0]]
    index = GraphIndex(gm.graph)
    seen = _Seen()
    want = [[n.name for n in s] for s in independent_subsets(nodes, index, p.options, seen)]
    got = [[n.name for n in s] for s, _ in seen.rounds if len(s) >= p.options.min_fuse_set_size]
    assert got == want == [w.sites[0][:-1]]
    first, last = w.sites[0][0], w.sites[0][-1]
    assert seen.rounds[0][1] == {last: f"depends on chosen {first}"}
    frames = [f for f in w.dependent.frames if f.title.startswith("Greedy round")]
    assert [f.left_out for f in frames] == [why for _, why in seen.rounds]


def test_every_exercise_is_a_variant_where_the_pattern_does_not_fire(walks):
    for name, w in walks.items():
        e = w.exercise
        assert e is not None, name
        assert e.node in e.graph.nodes and e.question and e.change
        assert set(e.added) <= set(e.graph.nodes)
        dry = DryRun(e.gm, lesson_pipeline(pattern_named(name)))
        assert not [s for s in dry.steps if s.pattern == name], name
        verdict = dry.explain(e.node, [name]).verdicts[0]
        assert not verdict.applies and verdict.text == e.answer, name
        assert not e.answer.startswith(("not an anchor", "no match")), name


def test_unknown_pattern_is_a_clear_error(monkeypatch):
    with pytest.raises(TeachError, match="unknown pattern 'batch_nope'; known: batch_linear"):
        walkthrough("batch_nope")
    with pytest.raises(KeyError) as e:  # caught like passes.pattern_named's unknown name
        teaching_model("batch_nope")
    assert str(e.value) == f"unknown pattern 'batch_nope'; known: {', '.join(predefined())}"  # as written, unquoted
    from optimus_lens import sample_models

    teaching = {k: m for k, m in sample_models.REGISTRY.items() if m.kind != "teaching"}
    monkeypatch.setattr(sample_models, "REGISTRY", teaching)
    with pytest.raises(TeachError, match="no teaching model teaches 'batch_relu'"):
        walkthrough("batch_relu")


def test_search_frames_leave_the_graph_unchanged():
    cap = _captured("batch_tanh")
    before = str(cap.gm.graph)
    search_frames(cap.gm, pattern_named("batch_tanh"))
    search_frames(cap.gm, pattern_named("batch_tanh"), "upstream")
    assert str(cap.gm.graph) == before


# ----------------------------------------------------------------------------- lesson files


def _svgs(text: str) -> int:
    return text.count("<svg")


def test_every_predefined_pattern_has_a_lesson_file_with_its_sites_and_before_after_graphs(walks, tmp_path):
    import re

    from optimus_lens.viz import fit_step, trace_layout
    from optimus_lens.viz.lesson import LESSON_PANES, write_lesson

    for name, w in walks.items():
        path = tmp_path / f"{name}.html"
        write_lesson(w, path)
        text = path.read_text()
        slides = {
            m.group(1): m.group(2)
            for m in re.finditer(
                r"<section class='slide' id='slide-\d+' data-kind='(\w+)' hidden>(.*?)</section>", text, re.DOTALL
            )
        }
        assert "Before:" in slides["before"] and _svgs(slides["before"]) >= 1, name
        assert "After:" in slides["after"] and _svgs(slides["after"]) >= 2, name  # after + provenance
        # each site drawn in the match picture: itself, or (where the members would not fit the
        # pane) the "×k" node it is folded into, as the lesson's fit chose
        pic, _ = fit_step(w.trace, 1, LESSON_PANES, layout=trace_layout(w.trace), arrangements=("single",))
        drawn = {m: n for n in pic.before.drawn.order for m in pic.before.drawn.members.get(n, [n])}
        for site in w.sites[0]:
            assert f"<title>{drawn[site]}</title>" in slides["match"], (name, site)
            assert site in slides["match"].split("<svg")[0], (name, site)  # and named in the text
        assert "Show the answer" in slides["exercise"] and w.exercise.answer.split(";")[0][:40] in slides[
            "exercise"
        ].replace("&#x27;", "'").replace("&quot;", '"'), name
        if w.search is not None:
            assert slides["search"].count("class='viewer fview'") == len(w.search.frames)
            assert slides["dependent"].count("class='viewer fview'") == len(w.dependent.frames)
            assert "type='range'" in slides["search"]
        else:  # a rewrite pattern: its anchor nodes drawn, matches and misses
            assert "Where it looks" in slides["search"] and _svgs(slides["search"]) == 1, name


def test_lesson_file_is_offline_and_navigable(walks, tmp_path):
    from optimus_lens.viz.lesson import lesson_html

    text = lesson_html(walks["batch_linear"])
    assert "http://" not in text.replace("http://www.w3.org", "") and "https://" not in text
    assert "<script src" not in text and "<link" not in text
    assert "id='prev'" in text and "id='next'" in text and "ArrowRight" in text and "ArrowLeft" in text
    assert "lensMount" in text  # the step viewer's pan/zoom script, inline


def test_lesson_cli_writes_one_file_per_pattern_and_refuses_an_unknown_one(tmp_path, monkeypatch, capsys):
    import optimus_lens.teach.lookup
    from optimus_lens.cli import main as cli

    monkeypatch.setattr(optimus_lens.teach.lookup, "predefined", lambda: ["batch_tanh", "normalize_cat"])
    assert cli(["lesson", "--all", "-o", str(tmp_path / "lessons"), "--repeats", "1"]) == 0
    assert sorted(p.name for p in (tmp_path / "lessons").iterdir()) == ["batch_tanh.html", "normalize_cat.html"]
    monkeypatch.undo()
    assert cli(["lesson", "batch_nope", "-o", str(tmp_path / "x.html")]) == 2
    err = capsys.readouterr().err
    assert "unknown pattern 'batch_nope'" in err and "batch_linear, batch_linear_lhs" in err
    assert cli(["lesson", "-o", str(tmp_path / "x.html")]) == 2
    assert "give one PATTERN or --all" in capsys.readouterr().err
    assert not (tmp_path / "x.html").exists()
    assert cli(["lesson", "normalize_cat", "-o", str(tmp_path / "nc.html"), "--repeats", "1"]) == 0
    assert "normalize_cat" in (tmp_path / "nc.html").read_text()
