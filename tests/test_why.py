"""``optimus why`` answers from a dry run of the engine: what it says is what the run does."""

from __future__ import annotations

import functools

import pytest
import torch

from optimus_lens import sample_models
from optimus_lens.cli import main
from optimus_lens.core.engine import Engine, RunOptions, copy_graph_module
from optimus_lens.debug.why import DryRun, WhyError
from optimus_lens.frontend.capture import capture
from optimus_lens.passes import default_pipeline
from tests.test_search_global import LinearBehindLinear


@functools.cache
def _captured(name: str):
    model, inputs = sample_models.get(name)
    return capture(model, inputs)


def _run_steps(gm, pipeline):
    return Engine(copy_graph_module(gm), (), pipeline, RunOptions(verify="off", record=False)).run().steps


def _assert_agrees(dry: DryRun, steps, step: int = 1) -> int:
    """Every verdict of every node of the dry run's graph against ``steps`` of a separate
    run; returns how many verdicts say "applies"."""
    applied = 0
    for n in list(dry.before.graph.nodes):
        for v in dry.explain(n.name).verdicts:
            first = next((s.index for s in steps[step - 1 :] if s.pattern == v.pattern and n.name in s.sites), None)
            assert v.applies == (first is not None), (n.name, v)
            assert v.step == first, (n.name, v)
            assert v.text and "raised" not in v.text, (n.name, v)
            applied += v.applies
    return applied


# industrial_recsys (5,134 nodes, the paper-scale sample) runs in benchmarks/search_scale.py and the sweep
@pytest.mark.parametrize("name", [n for n in sample_models.names() if n != "industrial_recsys"])
def test_why_says_for_every_node_of_every_sample_what_the_run_does(name):
    gm = _captured(name).gm
    pipe = default_pipeline()
    steps = _run_steps(gm, pipe)
    applied = _assert_agrees(DryRun(gm, pipe), steps)
    assert applied >= sum(len(s.sites) for s in steps if s.pattern.startswith("batch_"))


@pytest.mark.parametrize("name", ["recsys_towers", "twin_towers", "mmoe"])
def test_why_at_a_later_step_explains_the_nodes_earlier_steps_created(name):
    gm = _captured(name).gm
    pipe = default_pipeline()
    steps = _run_steps(gm, pipe)
    for k in (2, len(steps) // 2 + 1, len(steps) + 1):
        dry = DryRun(gm, pipe, step=k)
        created = {c for s in steps[: k - 1] for c in s.created}
        assert created & {n.name for n in dry.before.graph.nodes}
        _assert_agrees(dry, steps, step=k)


def test_why_names_the_step_that_creates_a_node_missing_before_it():
    gm = _captured("recsys_towers").gm
    steps = _run_steps(gm, default_pipeline())
    made = steps[-1].created[0]
    with pytest.raises(WhyError, match=f"step {steps[-1].index}.*creates it"):
        DryRun(gm, default_pipeline(), step=1).node(made)
    with pytest.raises(WhyError, match="outside"):
        DryRun(gm, default_pipeline(), step=len(steps) + 2)


def test_why_under_upstreams_search_gives_its_bounded_walk_as_the_reason():
    torch.manual_seed(0)
    gm = capture(LinearBehindLinear().eval(), (torch.randn(4, 8),)).gm
    a1 = next(n for n in gm.graph.nodes if "linear" in str(n.target))
    glob = DryRun(gm, default_pipeline()).explain(a1.name, ["batch_linear_lhs"]).verdicts[0]
    assert glob.applies and glob.step == 1
    up = DryRun(gm, default_pipeline(search="upstream")).explain(a1.name, ["batch_linear_lhs"]).verdicts[0]
    assert not up.applies and "bounded search" in up.text and "2 nodes share its group key" in up.text


def test_why_a_member_of_a_chain_names_the_members_it_depends_on_or_feeds():
    from optimus_lens.core.pattern import REGISTRY, SearchOptions
    from optimus_lens.core.pipeline import Pass, Pipeline
    from tests.test_search import towers

    gm = towers(1, 4)  # one tower: linear -> relu -> linear -> ...
    pipe = Pipeline([Pass("l", [REGISTRY["batch_linear"]], options=SearchOptions(min_fuse_set_size=2))])
    lin = [n.name for n in gm.graph.nodes if "linear" in str(n.target)]
    (v,) = DryRun(gm, pipe).explain(lin[1]).verdicts
    assert not v.applies
    assert v.text.startswith("4 nodes share its group key but at most 1 of them are mutually independent")
    assert all(name in v.text for name in (lin[0], lin[2], lin[3]))


def test_cli_why_with_step_and_pattern(capsys):
    steps = _run_steps(_captured("recsys_towers").gm, default_pipeline())
    k = next(s.index for s in steps if s.pattern == "remove_unbind_stack")
    stack = next(s.sites[-1] for s in steps if s.pattern == "remove_unbind_stack")
    assert main(["why", "sample:recsys_towers", stack, "--step", str(k), "--pattern", "remove_unbind_stack"]) == 0
    out = capsys.readouterr().out
    assert f"before step {k}" in out and f"rewrites at step {k}" in out
    assert main(["why", "sample:recsys_towers", stack, "--step", "1"]) == 2
    assert "creates it" in capsys.readouterr().err
    assert main(["why", "sample:recsys_towers", "linear", "--pattern", "no_such_pattern"]) == 2
    assert main(["why", "sample:recsys_towers", "linear", "--step", "999"]) == 2


def test_optimus_passes_whose_reader_has_left_stops_quietly(monkeypatch):
    """``optimus passes | head``: once head exits, writes raise BrokenPipeError."""
    import os

    fd = os.open(os.devnull, os.O_WRONLY)

    class ClosedPipe:
        def write(self, s):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            pass

        def fileno(self):
            return fd

    monkeypatch.setattr("sys.stdout", ClosedPipe())
    try:
        assert main(["passes"]) == 0
    finally:
        os.close(fd)


def test_a_dry_run_names_the_nodes_it_creates_as_the_recorded_run_did():
    """The trace of ``optimus run`` (on the capture itself) and the dry run of ``optimus
    why`` (on a copy) give every created node the same name, so ``why --step`` can be asked
    about a name read in the trace."""
    from optimus_lens.frontend.run import optimize

    trace = optimize("sample:recsys_towers", verify="off").trace
    dry = DryRun(_captured("recsys_towers").gm, default_pipeline())
    assert [(s.pattern, s.sites, s.created) for s in dry.steps] == [
        (s.pattern, s.sites, s.created) for s in trace.steps
    ]


def test_trace_dry_run_reads_our_trace_at_its_steps_and_an_upstream_trace_from_its_rebuilt_graph(tmp_path, monkeypatch):
    from test_observe import HELD_IN

    from optimus_lens.debug.why import trace_dry_run
    from optimus_lens.frontend.run import optimize
    from optimus_lens.inductor.observe import observe

    trace = optimize("sample:recsys_towers", verify="off").trace
    k = next(s.index for s in trace.steps if s.pattern == "remove_unbind_stack")
    dry, how = trace_dry_run(trace, k, "sample:recsys_towers")
    assert how.startswith("a dry run of the trace's passes") and dry.step == k
    v = dry.explain(trace.step(k).sites[0], ["remove_unbind_stack"]).verdicts[0]
    assert v.applies and v.step == k
    with pytest.raises(WhyError, match="outside"):
        trace_dry_run(trace, len(trace.steps) + 2, "sample:recsys_towers")

    (tmp_path / "held_in.py").write_text(HELD_IN)
    monkeypatch.chdir(tmp_path)
    up = observe("held_in.py:build", options={"batch_layernorm": {}}, verify=True).trace
    dry, how = trace_dry_run(up, 1, "held_in.py:build")  # upstream's trace: our pipeline on its graph
    assert "rebuilt from the trace" in how
    (v,) = dry.explain("layer_norm", ["batch_layernorm"]).verdicts
    assert v.applies and sorted(v.with_nodes) == [f"layer_norm_{i}" for i in range(1, 5)]
    with pytest.raises(WhyError, match="cannot be run"):  # after upstream's broken step: view fails
        trace_dry_run(up, 2, "held_in.py:build")


def test_a_near_miss_carries_its_partial_match():
    from optimus_lens.core.pattern import REGISTRY, SearchOptions
    from optimus_lens.core.pipeline import Pass, Pipeline
    from tests.test_search import towers

    gm = towers(1, 4)
    pipe = Pipeline([Pass("l", [REGISTRY["batch_linear"]], options=SearchOptions(min_fuse_set_size=2))])
    lin = [n.name for n in gm.graph.nodes if "linear" in str(n.target)]
    (v,) = DryRun(gm, pipe).explain(lin[1]).verdicts
    assert sorted(v.partial) == sorted([lin[0], lin[2], lin[3]])  # the others sharing its group key
    gm = _captured("recsys_towers").gm
    (v,) = DryRun(gm, default_pipeline()).explain("h", ["remove_split_cat"]).verdicts
    # the cat and the getitems it reads matched; their input is not a split
    assert not v.applies and v.partial[0] == "h" and "not split" in v.text, v
    assert len(v.partial) > 1 and all(n.startswith("getitem") for n in v.partial[1:]), v.partial
