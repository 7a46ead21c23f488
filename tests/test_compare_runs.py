"""``optimus compare A B``: any two runs of one model, nodes paired by structure, name
and provenance, steps by the captured nodes they came from, and a one-line summary."""

from __future__ import annotations

import json
import re

import pytest

from optimus_lens.cli import main
from optimus_lens.core.graphmatch import match_nodes, origins, structure_keys
from optimus_lens.core.trace import GraphSnapshot, NodeRecord, Trace
from optimus_lens.debug.compare import compare_runs
from optimus_lens.frontend.run import optimize
from optimus_lens.viz.runs import runs_picture

MODEL = "sample:recsys_towers"


@pytest.fixture(scope="module")
def runs() -> tuple[Trace, Trace]:
    """The default pipeline, and the same without batch_relu (so no stack/unbind cleanup)."""
    full = optimize(MODEL, verify="end").trace
    no_relu = optimize(MODEL, verify="end", skip=["batch_relu"]).trace
    return full, no_relu


def _renamed(t: Trace, prefix: str = "x_") -> Trace:
    """The same run with every node renamed: what another torch version's names look like."""
    text = t.dumps()
    names = sorted({*t.initial_graph.nodes, *(c for s in t.steps for c in s.created)}, key=len, reverse=True)
    data = json.loads(text)

    def ren(x):
        if isinstance(x, dict):
            return {
                k: (prefix + v if k in ("name", "node") and isinstance(v, str) and v in names else ren(v))
                for k, v in x.items()
            }
        if isinstance(x, list):
            return [prefix + v if isinstance(v, str) and v in names else ren(v) for v in x]
        return x

    data["initial_graph"] = ren(data["initial_graph"])
    for s in data["steps"]:
        for k in ("sites", "created", "erased", "delta"):
            s[k] = ren(s[k])
        s["replaced"] = {prefix + a: prefix + b for a, b in s["replaced"].items()}
    return Trace.from_json(data)


def _snap(*recs: tuple[str, str, str, list]) -> GraphSnapshot:
    return GraphSnapshot(
        NodeRecord(n, op, tgt, args, {}, [a["node"] for a in args if isinstance(a, dict)]) for n, op, tgt, args in recs
    )


def test_structure_keys_equal_the_same_computation_under_other_names():
    a = _snap(
        ("x", "placeholder", "x", []),
        ("r", "call_function", "torch.relu", [{"node": "x"}]),
        ("s", "call_function", "torch.sigmoid", [{"node": "r"}]),
    )
    b = _snap(
        ("x", "placeholder", "x", []),
        ("q", "call_function", "torch.relu", [{"node": "x"}]),
        ("t", "call_function", "torch.tanh", [{"node": "q"}]),
    )
    shared: dict = {}
    ka, kb = structure_keys(a, shared), structure_keys(b, shared)
    assert ka["r"] == kb["q"] and ka["s"] != kb["t"]
    m = match_nodes(a, b)
    assert m.pairs == {"x": "x", "r": "q"} and m.only_a == ["s"] and m.only_b == ["t"] and not m.identical


def test_origins_follow_each_created_node_back_to_the_captured_nodes(runs):
    full, _ = runs
    o = origins(full)
    first = full.steps_of_pass("batch_linear")[0]
    assert all(o[c] == frozenset(first.sites) for c in first.created)


def test_a_run_compared_with_itself_under_other_names_is_the_same_node_for_node(runs):
    full, _ = runs
    r = compare_runs(full, _renamed(full))
    assert r.start.identical and r.final.identical and r.identical
    assert r.summary().startswith("SAME:") and "final graphs the same node for node" in r.summary()


def test_two_configs_differ_in_the_steps_and_nodes_one_of_them_made(runs):
    full, no_relu = runs
    r = compare_runs(full, no_relu, "full", "no_relu")
    assert not r.identical
    assert {s.pass_name for s in r.only_a} == {"batch_relu", "split_cat_cleanup"} and r.only_b == []
    assert r.groups["batch_linear"] == (2, 2, True) and r.groups["batch_relu"] == (2, 0, False)
    g_b = no_relu.graph_at(len(no_relu.steps))
    kinds = {g_b.nodes[n].short_target for n in r.final.only_b}
    assert "relu" in kinds and kinds <= {"relu", "getitem", "stack", "unbind"}  # unfused relus, uncleaned pieces
    assert (
        r.summary().startswith("DIFFERENT:") and "steps only in A: batch_relu x2, split_cat_cleanup x4" in r.summary()
    )


def test_the_command_compares_two_trace_files_and_exits_1_when_they_differ(runs, tmp_path, capsys):
    full, no_relu = runs
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    full.save(a)
    no_relu.save(b)
    assert main(["compare", str(a), str(b)]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith("DIFFERENT: A=") and any(ln.startswith("steps only in A:") for ln in out)
    assert main(["compare", str(a), str(a), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)  # --json alone: only the document on stdout
    assert doc["schema"] == {"name": "optimus.compare", "version": 1}
    assert doc["identical"] is True and doc["final"]["only_a"] == [] and doc["summary"].startswith("SAME")


def test_a_side_may_be_a_model_spec_run_here(runs, tmp_path, capsys):
    full, _ = runs
    a = tmp_path / "a.json"
    full.save(a)
    assert main(["compare", str(a), MODEL, "--trace", str(tmp_path / "t")]) == 0
    assert (tmp_path / "t.b.json").is_file() and not (tmp_path / "t.a.json").exists()
    assert main(["compare", str(tmp_path / "missing.json"), MODEL]) == 2


def test_compare_model_keeps_ours_against_upstreams_and_gains_the_summary(capsys, tmp_path):
    out = tmp_path / "c.json"
    assert main(["compare", "sample:teach_batch_linear", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "same groups" in text and text.strip().splitlines()[-1].startswith(("SAME:", "DIFFERENT:"))
    doc = json.loads(out.read_text())
    assert doc["a"]["label"] == "ours" and doc["b"]["label"] == "upstream" and "groups" in doc


def _positions(dot_source: str) -> dict[str, str]:
    return dict(re.findall(r'^\s*"?([\w.:]+)"? \[.*?pos="([^"]+)"', dot_source, re.M))


def test_both_final_graphs_are_drawn_on_one_layout_with_what_differs_marked(runs, tmp_path):
    full, no_relu = runs
    r = compare_runs(full, no_relu, "full", "no_relu")
    a, b = full.graph_at(len(full.steps)), no_relu.graph_at(len(no_relu.steps))
    pic = runs_picture(a, b, r.final, "full", "no_relu")
    pa, pb = _positions(pic.before.source), _positions(pic.after.source)
    shared = set(pa) & set(pb)
    assert len(shared - {"__bb0__", "__bb1__"}) >= 20 and all(
        pa[n] == pb[n] for n in shared
    )  # a node both have sits in one place
    legend = [e.text for e in pic.diff.legend]
    assert any(t.startswith("only in no_relu") for t in legend) and any(t.startswith("only in full") for t in legend)
    out = tmp_path / "cmp.html"
    full.save(tmp_path / "a.json")
    no_relu.save(tmp_path / "b.json")
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--report", str(out)]) == 1
    page = out.read_text()
    assert "A: " in page and "B: " in page and "DIFFERENT:" in page and page.count("<svg") >= 2
