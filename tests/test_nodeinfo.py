"""The node inspector's data (optimus/nodeinfo.py, `optimus inspect`): a node's op, args, metas, module,
source with code around it, and its provenance across every step of a trace."""

import pytest

from optimus_lens.cli import main
from optimus_lens.debug.inspect_node import NodeNotFound, find_nodes, lifetime, node_info, node_info_text
from optimus_lens.frontend.run import optimize


@pytest.fixture(scope="module")
def towers():
    return optimize("sample:recsys_towers", verify="off").trace


def test_a_fused_node_shows_its_metas_source_and_where_it_went(towers):
    fuse = next(s for s in towers.steps if s.pattern == "batch_layernorm")
    info = node_info(towers, "layer_norm_3")
    assert info.step == fuse.index - 1  # the last graph that holds it
    r = info.record
    assert (r.op, r.target, r.shape, r.stride, r.dtype) == (
        "call_function",
        "torch.nn.functional.layer_norm",
        [32, 32],
        [32, 1],
        "float32",
    )
    assert (r.module, r.module_type) == ("towers.3.norm", "LayerNorm")
    assert r.device == "cpu" and "  device  cpu" in node_info_text(info)
    assert [n for n, _ in info.inputs][0] == "relu_7" and info.inputs[0][1] == [32, 32]
    assert info.users == ["h"]
    assert info.source_file.endswith("sample_models/demo.py")
    marked = [text for no, text in info.code if no == int(r.source.split(":")[1])]
    assert marked and "self.norm(" in marked[0] and len(info.code) == 7
    (erased,) = [e for e in info.events if e.kind == "erased"]
    assert erased.step == fuse.index and erased.nodes == [fuse.replaced["layer_norm_3"]]
    assert erased.nodes[0] in fuse.created and not info.alive_at_end
    text = node_info_text(info)
    assert "in the captured graph" in text and f"erased at step {fuse.index} (batch_layernorm" in text


def test_a_created_node_names_the_step_and_sites_it_came_from(towers):
    fuse = next(s for s in towers.steps if s.pattern == "batch_layernorm")
    (name,) = [n for n in fuse.created if towers.after(fuse.index).nodes[n].target.endswith("layer_norm")]
    info = node_info(towers, name)
    assert info.step == len(towers.steps) and info.alive_at_end
    assert info.events[0].kind == "created" and info.events[0].step == fuse.index
    assert info.events[0].nodes == fuse.sites
    assert lifetime(towers, name) == (fuse.index, len(towers.steps))


def test_a_node_outside_the_requested_graph_or_the_trace_is_a_clear_error(towers):
    fuse = next(s for s in towers.steps if s.pattern == "batch_layernorm")
    with pytest.raises(NodeNotFound, match=rf"exists after steps 0..{fuse.index - 1}"):
        node_info(towers, "layer_norm_3", step=fuse.index)
    assert node_info(towers, "layer_norm_3", step=0).step == 0
    with pytest.raises(NodeNotFound, match="did you mean layer_norm"):
        node_info(towers, "layer_nor")
    assert find_nodes(towers.initial_graph, "layer_norm")[:2] == ["layer_norm", "layer_norm_1"]


def test_inspect_cli_prints_the_node_and_exits_2_for_an_unknown_one(tmp_path, capsys):
    trace = tmp_path / "t.json"
    assert main(["run", "sample:teach_batch_relu", "--trace", str(trace)]) == 0
    capsys.readouterr()
    assert main(["inspect", str(trace), "y1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("y1 = call_") and "provenance:" in out and "erased at step" in out
    assert main(["inspect", str(trace), "nope"]) == 2
    assert "no node 'nope'" in capsys.readouterr().err


def test_device_is_recorded_and_a_trace_without_it_still_loads(towers, tmp_path, capsys):
    import json

    from optimus_lens.core.trace import Trace

    data = json.loads(towers.dumps())
    assert all(r.get("device") == "cpu" for r in data["initial_graph"]["nodes"] if "shape" in r)
    for r in data["initial_graph"]["nodes"]:  # a trace written before device was recorded
        r.pop("device", None)
    for s in data["steps"]:
        for r in s["delta"]["upsert"]:
            r.pop("device", None)
    old = Trace.loads(json.dumps(data))
    assert old.initial_graph.nodes["layer_norm_3"].device is None
    assert "  device  (not recorded)" in node_info_text(node_info(old, "layer_norm_3"))
    (tmp_path / "old.json").write_text(json.dumps(data))
    assert main(["inspect", str(tmp_path / "old.json"), "layer_norm_3"]) == 0
    assert "device  (not recorded)" in capsys.readouterr().out


def test_the_node_a_failing_step_breaks_shows_its_changed_input_strides_and_its_error(tmp_path, monkeypatch, capsys):
    """Upstream's batch_layernorm on the held-in input: the trace records the unbound
    piece with the old layer_norm's strides (upstream's metadata), the replay finds the
    real ones, and the .view that reads them is the node that raises."""
    from test_observe import HELD_IN

    from optimus_lens.inductor.observe import observe

    (tmp_path / "held_in.py").write_text(HELD_IN)
    monkeypatch.chdir(tmp_path)
    up = observe("held_in.py:build", options={"batch_layernorm": {}}, verify=True).trace
    assert up.step(1).verify.ok is False
    info = node_info(up, "view", step=1)
    (c,) = info.changes
    assert c.before == ("layer_norm", [4, 16], [16, 1]) and c.after[0].startswith("getitem")
    assert c.actual == [80, 1] and c.layout == "view needs strides compatible with the new shape"
    assert info.failure.startswith("RuntimeError: view size is not compatible")
    assert node_info(up, "view", step=0).changes == []  # the captured graph: nothing changed yet
    up.save(tmp_path / "up.json")
    assert main(["inspect", str(tmp_path / "up.json"), "view", "--step", "1"]) == 0
    out = capsys.readouterr().out
    assert "the tensor has stride [80, 1] when run" in out and "raises  RuntimeError: view size" in out
