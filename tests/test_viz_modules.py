"""Module folding: the nn_module_stack hierarchy folded into ``mod:<path>`` nodes, on by
default above a measured size, opened by the step's marks and by the unfolded set."""

from __future__ import annotations

from test_viz import node_line, rec, towers_snapshot

from optimus_lens import viz
from optimus_lens.core.trace import Delta, GraphSnapshot, Step, Trace
from optimus_lens.viz import MODULES_ABOVE, graph_view


def test_modules_fold_into_one_node_with_their_node_count_and_parallel_towers_into_one():
    snap = towers_snapshot(6)
    v = graph_view(snap, viz.Marks(groups={"cat": 0}), "", viz.ViewOptions(modules=True, fold=False))
    assert v.shown == 8 and v.elided == 0  # x, six tower nodes, cat
    assert r"towers.3\n3 nodes" in node_line(v.source, "mod:towers.3")
    assert v.modules == [f"towers.{i}" for i in range(6)]
    svg = viz.render_svg(v)
    assert 'class="node lens&#45;module">\n<title>mod:towers.3</title>' in svg
    assert viz.module_path("mod:towers.3") == "towers.3" and viz.module_path("towers.3") is None
    both = graph_view(snap, viz.Marks(groups={"cat": 0}), "", viz.ViewOptions(modules=True, fold=True))
    assert both.shown == 3 and r"towers.0 … ×6\n3 nodes" in node_line(both.source, "mod:towers.0")
    marked = graph_view(snap, viz.Marks(groups={"r2": 0}), "", viz.ViewOptions(modules=True, fold=False))
    assert "mod:towers.2" not in marked.source and "r2" in marked.source  # a module the step touched stays open
    opened = graph_view(
        snap, viz.Marks(groups={"cat": 0}), "", viz.ViewOptions(modules=True, fold=False, unfolded={"towers.4"})
    )
    assert "mod:towers.4" not in opened.source and all(f"\t{n} [" in opened.source for n in ("a4", "r4", "b4"))
    assert "towers.4" not in opened.modules and opened.shown == 10


def nested_snapshot(layers: int = 3) -> GraphSnapshot:
    """x -> enc.layer.i (attn: 3 nodes, ffn: 3 nodes) in sequence -> head (one node)."""
    nodes, prev = [rec("l_x_", "placeholder", "L_x_")], "l_x_"
    for i in range(layers):
        for part in ("attn", "ffn"):
            for j in range(3):
                name = f"{part}{i}_{j}"
                nodes.append(
                    rec(
                        name,
                        "call_function",
                        "torch.relu",
                        inputs=[prev],
                        module=f"enc.layer.{i}.{part}.op{j}",
                        module_type="ReLU",
                    )
                )
                prev = name
    nodes.append(rec("head", inputs=[prev], module="head", module_type="Linear"))
    return GraphSnapshot(nodes)


def test_module_folding_follows_the_hierarchy_outermost_closed_module_first():
    snap = nested_snapshot(3)
    whole = graph_view(snap, viz.Marks(groups={"head": 0}), "", viz.ViewOptions(modules=True, fold=False))
    assert whole.modules == ["enc"] and whole.shown == 3  # x, enc (18 nodes), head
    assert r"enc\n18 nodes" in node_line(whole.source, "mod:enc")
    touched = graph_view(snap, viz.Marks(groups={"ffn1_1": 0}), "", viz.ViewOptions(modules=True, fold=False))
    # enc, enc.layer, enc.layer.1 and enc.layer.1.ffn hold the mark: open; their other children fold
    assert touched.modules == ["enc.layer.0", "enc.layer.1.attn", "enc.layer.2"]
    inner = graph_view(
        snap, viz.Marks(groups={"ffn1_1": 0}), "", viz.ViewOptions(modules=True, fold=False, unfolded={"enc.layer.0"})
    )
    assert inner.modules == ["enc.layer.0.attn", "enc.layer.0.ffn", "enc.layer.1.attn", "enc.layer.2"]


def test_module_folding_is_on_by_default_above_modules_above_drawable_nodes():
    small = towers_snapshot(6)  # 20 nodes
    k = MODULES_ABOVE // 3 + 1
    big = towers_snapshot(k)
    assert not graph_view(small, viz.Marks(groups={"cat": 0}), "", viz.ViewOptions(fold=False)).modules
    assert len(graph_view(big, viz.Marks(groups={"cat": 0}), "", viz.ViewOptions(fold=False)).modules) == k
    assert not graph_view(big, viz.Marks(groups={"cat": 0}), "", viz.ViewOptions(fold=False, modules=False)).modules


def _nested_trace() -> Trace:
    snap = nested_snapshot(3)
    new = rec("new", "call_function", "torch.tanh", inputs=["ffn2_2"])
    head = rec("head", inputs=["new"], module="head", module_type="Linear")
    step = Step(
        index=1,
        pass_name="p",
        pattern="p",
        sites=["head"],
        created=["new"],
        erased=[],
        replaced={},
        delta=Delta(upsert=[new, head], remove=[]),
        match_s=0.0,
        rewrite_s=0.0,
        nodes_after=len(snap) + 1,
    )
    return Trace(model="nested", initial_graph=snap, steps=[step], passes=[])


def test_step_picture_draws_folded_modules_on_its_one_layout_and_unfolds_on_request():
    trace = _nested_trace()
    pic = viz.step_picture(trace, 1, viz.ViewOptions(modules=True, fold=False))
    assert pic.before.modules == pic.after.modules == ["enc"]
    assert "mod:enc" in pic.layout.nodes
    opened = viz.step_picture(trace, 1, viz.ViewOptions(modules=True, fold=False, unfolded={"enc", "enc.layer"}))
    assert opened.diff.modules == ["enc.layer.0", "enc.layer.1", "enc.layer.2"]
    svg = viz.layout.draw_pinned(opened.after.source)
    assert svg.count("lens&#45;module") == 3 and "<title>mod:enc.layer.1</title>" in svg


def test_the_report_folds_modules_by_default_on_a_graph_above_modules_above():
    from optimus_lens.viz.report import embedded_svgs, html_report

    snap = nested_snapshot(MODULES_ABOVE // 6 + 1)  # 6 nodes a layer: above the threshold
    new = rec("new", "call_function", "torch.tanh", inputs=[list(snap.nodes)[-2]])
    head = rec("head", inputs=["new"], module="head", module_type="Linear")
    step = Step(
        index=1,
        pass_name="p",
        pattern="p",
        sites=["head"],
        created=["new"],
        erased=[],
        replaced={},
        delta=Delta(upsert=[new, head], remove=[]),
        match_s=0.0,
        rewrite_s=0.0,
        nodes_after=len(snap) + 1,
    )
    trace = Trace(model="nested", initial_graph=snap, steps=[step], passes=[])
    svgs = embedded_svgs(html_report(trace, catalogue=[]))["1"]
    assert all("<title>mod:enc</title>" in svgs[side] and "lens&#45;module" in svgs[side] for side in svgs)
