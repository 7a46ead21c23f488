"""viz/: step graphs as DOT (sites highlighted, created/erased marked, legend, k-hop cut of
big graphs), SVG rendering with a time limit, plotly figures, the HTML report and viewer."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from optimus_lens import viz
from optimus_lens.core.trace import Delta, GraphSnapshot, NodeRecord, Step, Trace, VerifyResult
from optimus_lens.perf.timings import BenchResult, StageTiming
from optimus_lens.viz import graph_view
from optimus_lens.viz.palette import STANDARD
from optimus_lens.viz.select import neighbourhood

# --------------------------------------------------------------------------- a hand-built trace


def rec(name, op="call_function", target="torch._C._nn.linear", inputs=(), shape=(4, 8), args=None, **kw):
    inputs = list(inputs)
    return NodeRecord(
        name=name,
        op=op,
        target=target,
        args=args if args is not None else [{"node": i} for i in inputs],
        inputs=inputs,
        shape=list(shape) if shape is not None else None,
        dtype="float32",
        **kw,
    )


def five_linears_trace(failed_step: bool = False) -> Trace:
    """x -> 5 independent linears (each with a lifted weight) -> cat -> output; step 1 fuses the
    linears into stack/bmm/unbind/getitems, step 2 (same pass) fuses the getitems' users (none
    here: it renames the cat's input list, enough to exercise a second group)."""
    nodes = [rec("l_x_", "placeholder", "L_x_", shape=(4, 8))]
    for i in range(5):
        nodes.append(
            rec(
                f"l_self_modules_fc{i}_parameters_weight_",
                "placeholder",
                f"L_self_modules_fc{i}_parameters_weight_",
                shape=(8, 8),
                module=f"fc{i}",
            )
        )
        nodes.append(
            rec(
                f"linear_{i}",
                inputs=["l_x_", f"l_self_modules_fc{i}_parameters_weight_"],
                module=f"fc{i}",
                module_type="Linear",
                source="m.py:3: return self.fc(x)",
            )
        )
    nodes.append(rec("cat", target="torch.cat", inputs=[f"linear_{i}" for i in range(5)], shape=(4, 40)))
    nodes.append(rec("output", "output", "output", inputs=["cat"], shape=None))
    snap = GraphSnapshot(nodes)
    weights = [f"l_self_modules_fc{i}_parameters_weight_" for i in range(5)]
    created = [
        rec("stack", target="torch.stack", inputs=weights, shape=(5, 8, 8)),
        rec("bmm", target="torch.bmm", inputs=["l_x_", "stack"], shape=(5, 4, 8)),
        rec("unbind", target="torch.unbind", inputs=["bmm"], shape=[[4, 8]] * 5),
    ]
    created += [
        rec(f"getitem_{i}", target="_operator.getitem", inputs=["unbind"], args=[{"node": "unbind"}, i])
        for i in range(5)
    ]
    cat2 = rec("cat", target="torch.cat", inputs=[f"getitem_{i}" for i in range(5)], shape=(4, 40))
    step1 = Step(
        index=1,
        pass_name="batch_linear",
        pattern="batch_linear",
        sites=[f"linear_{i}" for i in range(5)],
        created=[c.name for c in created],
        erased=[f"linear_{i}" for i in range(5)],
        replaced={f"linear_{i}": f"getitem_{i}" for i in range(5)},
        delta=Delta(upsert=created + [cat2], remove=[f"linear_{i}" for i in range(5)]),
        match_s=1e-4,
        rewrite_s=2e-3,
        nodes_after=len(snap) + 3,
        verify=VerifyResult(True, 0.0, 0.0, "outputs"),
    )
    relu = rec("relu", target="torch.relu", inputs=["cat"], shape=(4, 40))
    out2 = rec("output", "output", "output", inputs=["relu"], shape=None)
    step2 = Step(
        index=2,
        pass_name="batch_linear",
        pattern="batch_linear",
        sites=["cat"],
        created=["relu"],
        erased=[],
        replaced={},
        delta=Delta(upsert=[relu, out2], remove=[]),
        match_s=1e-4,
        rewrite_s=1e-4,
        nodes_after=len(snap) + 4,
        verify=VerifyResult(False if failed_step else True, 0.5 if failed_step else 0.0, 0.1, "outputs"),
    )
    return Trace(
        model="five_linears",
        initial_graph=snap,
        steps=[step1, step2],
        passes=[{"name": "batch_linear", "enabled": True, "patterns": ["batch_linear"]}],
    )


def node_line(source: str, name: str) -> str:
    """The DOT statement that declares node ``name``."""
    m = re.search(rf'^\s*"?{re.escape(name)}"? \[.*$', source, re.M)
    assert m, f"node {name} is not in the DOT source"
    return m.group(0)


def chain_snapshot(n: int) -> GraphSnapshot:
    nodes = [rec("n0", "placeholder", "L_n0_")]
    nodes += [rec(f"n{i}", target="torch.relu", inputs=[f"n{i - 1}"]) for i in range(1, n)]
    return GraphSnapshot(nodes)


# --------------------------------------------------------------------------- DOT


def test_before_view_fills_sites_with_group_colour_and_dashes_erased_nodes_red():
    v = viz.step_view(five_linears_trace(), 1, "before")
    for i in range(5):
        line = node_line(v.source, f"linear_{i}")
        assert f'fillcolor="{STANDARD.groups[0]}"' in line
        assert "dashed" in line and STANDARD.erased_border in line
    assert STANDARD.groups[0] not in node_line(v.source, "cat")  # not a site


def test_after_view_marks_created_nodes_green_and_drops_erased_sites():
    v = viz.step_view(five_linears_trace(), 1, "after")
    for name in ("stack", "bmm", "unbind", "getitem_3"):
        line = node_line(v.source, name)
        assert STANDARD.created_border in line and STANDARD.created_fill in line
    assert not re.search(r'^\s*"?linear_0"? \[', v.source, re.M)
    assert set(v.focus) == set(five_linears_trace().step(1).created)  # the viewer zooms onto the new nodes


def test_legend_names_the_marks_present_in_the_view():
    before = viz.step_view(five_linears_trace(), 1, "before").source
    after = viz.step_view(five_linears_trace(), 1, "after").source
    assert "__legend__" in before and "pattern site: step 1 (batch_linear)" in before and "erased (5)" in before
    assert "created (8)" in after and "erased" not in after.split("__legend__", 1)[1]


def test_a_viewer_that_shows_the_legend_itself_gets_a_drawing_without_one():
    drawn = viz.step_view(five_linears_trace(), 1, "before")
    bare = viz.step_view(five_linears_trace(), 1, "before", viz.ViewOptions(legend_in_graph=False))
    assert "__legend__" in drawn.source and "__legend__" not in bare.source
    assert bare.legend == drawn.legend and any("step 1 (batch_linear)" in e.text for e in bare.legend)


def test_labels_give_op_short_target_shape_dtype_and_readable_placeholders():
    t = five_linears_trace()
    src = viz.step_view(t, 1, "after", viz.ViewOptions(fold_params=False)).source
    assert 'label="x\\n4×8 f32"' in node_line(src, "l_x_")
    assert "fc0.weight" in node_line(src, "l_self_modules_fc0_parameters_weight_")
    assert "getitem [3]" in node_line(src, "getitem_3")
    assert "5×(4×8)" in node_line(src, "unbind")  # tuple output of equal shapes
    assert "bmm\\n5×4×8 f32" in node_line(src, "bmm")
    assert "m.py:3" in node_line(viz.step_view(t, 1, "before").source, "linear_0")  # tooltip has the source line


def test_parameter_placeholders_fold_into_their_users():
    t = five_linears_trace()
    folded = viz.step_view(t, 1, "before")
    assert folded.folded == 5
    assert not re.search(r'^\s*"?l_self_modules_fc0_parameters_weight_"? \[', folded.source, re.M)
    assert not re.search(r"\bl_self_modules_fc0_parameters_weight_\"? ->", folded.source)
    assert "+1 param" in node_line(folded.source, "linear_0")
    shown = viz.step_view(t, 1, "before", viz.ViewOptions(fold_params=False))
    assert shown.folded == 0 and "l_self_modules_fc0_parameters_weight_" in shown.source


def test_pass_overview_gives_each_step_its_own_colour():
    t = five_linears_trace()
    after = viz.pass_view(t, "batch_linear", "after")
    assert f'fillcolor="{STANDARD.groups[0]}"' in node_line(after.source, "bmm")  # made by step 1
    assert f'fillcolor="{STANDARD.groups[1]}"' in node_line(after.source, "relu")  # made by step 2
    assert "step 1 (batch_linear)" in after.source and "step 2 (batch_linear)" in after.source
    with pytest.raises(KeyError):
        viz.pass_view(t, "batch_relu", "after")


def test_small_graph_is_drawn_whole():
    v = graph_view(chain_snapshot(50), viz.Marks(groups={"n25": 0}))
    assert v.shown == 50 and v.elided == 0 and v.hops is None and "__elided__" not in v.source


def test_big_graph_is_cut_to_the_k_hop_neighbourhood_with_the_elided_count():
    snap = chain_snapshot(1000)
    v = graph_view(snap, viz.Marks(groups={"n500": 0}), "", viz.ViewOptions(hops=2))
    names = set(re.findall(r'^\s*"?(n\d+)"? \[', v.source, re.M))
    assert names == {"n498", "n499", "n500", "n501", "n502"}
    assert v.elided == 995 and v.hops == 2
    assert "… 995 nodes not shown" in v.source
    wider = graph_view(snap, viz.Marks(groups={"n500": 0}), "", viz.ViewOptions(hops=4))
    assert wider.shown == 9 and "… 991 nodes not shown" in wider.source
    full = graph_view(snap, viz.Marks(groups={"n500": 0}), "", viz.ViewOptions(full=True))
    assert full.shown == 1000 and full.elided == 0


def test_neighbourhood_stops_before_a_hop_that_would_pass_the_node_limit():
    hub = [rec("x", "placeholder", "L_x_")] + [rec(f"u{i}", target="torch.relu", inputs=["x"]) for i in range(600)]
    snap = GraphSnapshot(hub)
    keep, used = neighbourhood(snap, {"u0"}, hops=2, max_nodes=300)
    assert keep == {"u0", "x"} and used == 1  # hop 2 would add all 599 siblings
    v = graph_view(snap, viz.Marks(groups={"u0": 0}), "", viz.ViewOptions(hops=2, max_nodes=300, fold=False))
    assert v.shown == 2 and v.hops == 1 and "… 599 nodes not shown" in v.source


def test_parallel_copies_fold_into_one_node_with_a_count_before_the_cut():
    hub = [rec("x", "placeholder", "L_x_")] + [rec(f"u{i}", target="torch.relu", inputs=["x"]) for i in range(600)]
    v = graph_view(
        GraphSnapshot(hub), viz.Marks(groups={"u0": 0}), "", viz.ViewOptions(hops=2, max_nodes=300)
    )  # 601 nodes: folds
    assert v.shown == 3 and v.elided == 0 and v.parallel == 599  # x, the marked u0, u1..u599 as one
    line = node_line(v.source, "u1")
    assert "u1 … ×599" in line and "peripheries=2" in line and "u599" in line  # members listed on hover


def test_big_graph_without_marks_shows_its_first_nodes():
    v = viz.snapshot_view(Trace("chain", chain_snapshot(700)), 0, viz.ViewOptions(max_nodes=300))
    assert v.shown == 300 and v.elided == 400 and "first nodes in graph order" in v.source


# --------------------------------------------------------------------------- rendering


def test_render_svg_keeps_the_highlight_colours():
    svg = viz.render_svg(viz.step_view(five_linears_trace(), 1, "before"))
    assert svg.lstrip().startswith("<?xml") or "<svg" in svg[:400]
    assert STANDARD.groups[0] in svg and STANDARD.erased_border in svg
    assert 'width="100%"' in viz.responsive_svg(svg)


def test_a_layout_past_its_budget_falls_back_to_a_layered_one_and_says_so():
    view = graph_view(chain_snapshot(3000), None, "", viz.ViewOptions(full=True, clusters=False))
    out = viz.render_view(view, budget_s=0.05)
    assert "did not lay out 3,000 nodes within 0.05 s" in out.note and "layered layout" in out.note
    assert out.svg.count('class="node"') >= 3000
    with pytest.raises(viz.RenderError, match="did not finish within"):  # bare DOT source has no fallback
        viz.render_svg(view.source, timeout_s=0.05)


def test_dot_limits_grow_tighter_with_the_view_size():
    assert viz.layout.dot_limits(50) == {}
    small, big = viz.layout.dot_limits(300), viz.layout.dot_limits(3000)
    assert float(small["nslimit"]) == 2.0 and float(big["nslimit"]) == 1.0
    assert float(big["mclimit"]) < float(small["mclimit"]) <= 1.0


def test_render_svg_reports_dot_syntax_errors():
    with pytest.raises(viz.RenderError, match="dot failed"):
        viz.render_svg("digraph { a -> }")


def test_viewer_page_embeds_the_svg_and_zooms_to_the_focus_nodes():
    page = viz.svg_viewer_html(
        viz.render_svg(viz.step_view(five_linears_trace(), 1, "before")), ["linear_0", "linear_4"]
    )
    assert '["linear_0", "linear_4"]' in page and "<svg" in page and "fit step" in page
    assert not re.search(r'<svg width="\d', page)


# --------------------------------------------------------------------------- figures and report


def bench() -> BenchResult:
    return BenchResult(
        "cpu",
        "wall-clock",
        [
            StageTiming("baseline", 20, 2.0, 1.8, 2.4, 10, 1.0, 4096, "estimate"),
            StageTiming("batch_linear", 23, 1.0, 0.9, 1.25, 10, 2.0, 3072, "estimate"),
        ],
    )


def test_node_count_figure_marks_failed_verification_steps():
    fig = viz.node_count_figure(five_linears_trace(failed_step=True), current=1)
    names = [t.name for t in fig.data]
    assert "verify failed" in names
    failed = fig.data[names.index("verify failed")]
    assert list(failed.x) == [2] and failed.marker.symbol == "x"
    assert list(fig.data[0].y) == [13, 16, 17]  # captured, then nodes_after of each step
    assert "verify failed" not in [t.name for t in viz.node_count_figure(five_linears_trace()).data]


def test_speedup_figure_has_p10_p90_spread_and_memory_figure_says_estimate():
    b = bench()
    sp = viz.speedup_figure(b)
    bar = sp.data[0]
    assert list(bar.y) == [1.0, 2.0]
    assert bar.error_y.array[1] == pytest.approx(2.0 / 0.9 - 2.0) and bar.error_y.arrayminus[1] == pytest.approx(
        2.0 - 1.6
    )
    assert "wall clock" in sp.layout.title.text
    mem = viz.memory_figure(b)
    assert list(mem.data[0].y) == pytest.approx([4096 / 2**20, 3072 / 2**20])
    assert "estimate" in mem.layout.title.text
    assert viz.bench_rows(b)[1]["speedup"] == 2.0


def test_step_facts_name_pattern_provenance_verify_and_times():
    t = five_linears_trace(failed_step=True)
    facts = dict(
        viz.step_facts(
            t.step(1),
            {"description": "fuse linears", "preconditions": ["2-D"], "source": "optimus/passes/batch.py:10"},
        )
    )
    assert facts["defined at"] == "optimus/passes/batch.py:10" and facts["what it does"] == "fuse linears"
    assert "linear_0 → getitem_0" in facts["replaced"]
    assert facts["time"] == "match 0.10 ms, rewrite 2.00 ms"
    assert viz.verify_text(t.step(2).verify).startswith("FAILED")


def test_html_report_stores_each_steps_before_after_and_diff_once_and_navigates_by_keys():
    html = viz.html_report(five_linears_trace(), catalogue=[], bench=bench())
    svgs = viz.report.embedded_svgs(html)
    assert sorted(svgs) == ["1", "2"] and all(sorted(d) == ["after", "before", "diff"] for d in svgs.values())
    assert STANDARD.groups[0] in svgs["1"]["before"] and "linear_0&#45;&gt;getitem_0" in svgs["1"]["diff"]
    assert "id='step-1'" in html and "id='step-2'" in html and "ArrowRight" in html and "ArrowLeft" in html
    assert html.count("function lensMount") == 1 and "<script src" not in html  # one copy, nothing fetched
    assert "Nodes after each step" in html and "Per-pass timing" in html
    assert 'href="#step-2"' in html  # chart points link to their step


def test_views_of_a_recorded_run_highlight_every_step_site():
    from optimus_lens.frontend.run import optimize

    trace = optimize("teach_split_cat", verify="off").trace
    assert trace.steps
    for step in trace.steps:
        before = viz.step_view(trace, step.index, "before", viz.ViewOptions(fold_params=False))
        for site in step.sites:
            assert f'fillcolor="{STANDARD.groups[0]}"' in node_line(before.source, site)
    viz.render_svg(viz.step_view(trace, 1, "after"))


def test_viz_does_not_import_streamlit_or_the_app():
    code = (
        "import sys, optimus_lens.viz, optimus_lens.viz.report, optimus_lens.viz.viewer; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'streamlit' or m.startswith('optimus_lens.app')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------- one geometry per step, diff view


def _node_boxes(svg: str) -> dict[str, str]:
    """node title -> the drawn outline of that node in an SVG."""
    pat = r'<title>([^<]*)</title>\s*(?:<g[^>]*><a[^>]*>\s*)?<(?:polygon|path)[^>]* (?:points|d)="([^"]*)"'
    return dict(re.findall(pat, svg))


def test_before_after_and_diff_share_one_layout_so_untouched_nodes_do_not_move():
    pic = viz.step_picture(five_linears_trace(), 1)
    svgs = {k: viz.render_view(v).svg for k, v in pic.views().items()}
    boxes = {k: _node_boxes(s) for k, s in svgs.items()}
    shared = set(boxes["before"]) & set(boxes["after"])
    assert {"l_x_", "cat", "output"} <= shared
    assert all(boxes["before"][n] == boxes["after"][n] == boxes["diff"][n] for n in shared)
    heights = {re.search(r'viewBox="[\d.]+ [\d.]+ [\d.]+ ([\d.]+)"', s).group(1) for s in svgs.values()}
    assert len(heights) == 1  # same box height: same vertical transform in every pane


def test_diff_view_ghosts_erased_nodes_marks_created_ones_and_draws_provenance_arrows():
    diff = viz.step_picture(five_linears_trace(), 1).diff.source
    assert STANDARD.ghost_fill in node_line(diff, "linear_0") and "dashed" in node_line(diff, "linear_0")
    assert STANDARD.created_border in node_line(diff, "bmm")
    arrows = re.findall(r'^\s*linear_(\d) -> getitem_\1 \[.*color="#6a1b9a".*dashed', diff, re.M)
    assert sorted(arrows) == ["0", "1", "2", "3", "4"]


def split_trace() -> Trace:
    """normalize_split's kind of step: split(x, 16) replaced by split_1(x, [16, 16])."""
    x = rec("l_x_", "placeholder", "L_x_", shape=(4, 32))
    split = rec(
        "split",
        target="torch.functional.split",
        args=[{"node": "l_x_"}, 16],
        inputs=["l_x_"],
        shape=[[4, 16], [4, 16]],
        kwargs={"dim": 1},
    )
    g = [
        rec(f"g{i}", target="_operator.getitem", args=[{"node": "split"}, i], inputs=["split"], shape=(4, 16))
        for i in range(2)
    ]
    out = rec("output", "output", "output", inputs=["g0", "g1"], shape=None)
    split1 = rec(
        "split_1",
        target="torch.functional.split",
        args=[{"node": "l_x_"}, [16, 16]],
        inputs=["l_x_"],
        shape=[[4, 16], [4, 16]],
        kwargs={"dim": 1},
    )
    g2 = [
        rec(f"g{i}", target="_operator.getitem", args=[{"node": "split_1"}, i], inputs=["split_1"], shape=(4, 16))
        for i in range(2)
    ]
    step = Step(
        1,
        "normalization_pass",
        "normalize_split",
        ["split"],
        ["split_1"],
        ["split"],
        {"split": "split_1"},
        Delta([split1, *g2], ["split"]),
        1e-4,
        1e-4,
        5,
    )
    return Trace("split", GraphSnapshot([x, split, *g, out]), [step])


def test_an_argument_changed_by_the_step_is_drawn_struck_through_beside_the_new_value():
    pic = viz.step_picture(split_trace(), 1)
    assert pic.changes == {"split_1": [("args[1]", "16", "[16, 16]")]}
    for view in (pic.after, pic.diff):
        line = node_line(view.source, "split_1")
        assert "<S>16</S>" in line and "[16, 16]" in line
    assert "<S>" not in pic.before.source  # the before pane shows the graph as it was
    assert any("arguments changed in place (1)" in e.text for e in pic.diff.legend)
    svg = viz.render_view(pic.after).svg
    assert 'text-decoration="line-through"' in svg


def test_a_node_that_cannot_be_labelled_is_drawn_with_the_reason_not_a_traceback(monkeypatch):
    from optimus_lens.viz import labels

    real = labels.label_lines

    def broken(rec_, *a, **k):
        if rec_.name == "bmm":
            raise IndexError("list index out of range")
        return real(rec_, *a, **k)

    monkeypatch.setattr(labels, "label_lines", broken)
    v = viz.step_view(five_linears_trace(), 1, "after")
    assert "cannot label this node: IndexError: list index out of range" in node_line(v.source, "bmm")
    assert "<svg" in viz.render_svg(v)


def test_small_traces_get_one_layout_for_every_step():
    t = five_linears_trace()
    shared = viz.trace_layout(t)
    assert shared is not None and {"linear_0", "bmm", "relu"} <= set(shared.nodes)
    one, two = viz.step_picture(t, 1, layout=shared), viz.step_picture(t, 2, layout=shared)
    assert one.layout is shared and two.layout is shared  # 'cat' sits at the same place in steps 1 and 2
    assert _node_boxes(viz.render_view(one.after).svg)["cat"] == _node_boxes(viz.render_view(two.before).svg)["cat"]


def test_optimus_report_writes_one_html_file_and_rejects_a_bad_trace(tmp_path):
    trace = tmp_path / "t.json"
    five_linears_trace().save(trace)
    out = tmp_path / "r.html"
    run = [sys.executable, "-m", "optimus_lens", "report", str(trace), "-o", str(out)]
    done = subprocess.run(run, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "2 steps" in done.stdout and sorted(viz.report.embedded_svgs(out.read_text())) == ["1", "2"]
    (tmp_path / "bad.json").write_text("{not json")
    bad = subprocess.run(
        [*run[:4], str(tmp_path / "bad.json"), "-o", str(tmp_path / "x.html")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert bad.returncode == 2 and "cannot read" in bad.stderr and not (tmp_path / "x.html").exists()


def towers_snapshot(k: int = 6) -> GraphSnapshot:
    """x -> k towers (linear -> relu -> linear, module towers.i) -> cat."""
    nodes = [rec("l_x_", "placeholder", "L_x_")]
    for i in range(k):
        m = f"towers.{i}"
        nodes += [
            rec(f"a{i}", inputs=["l_x_"], module=f"{m}.fc1"),
            rec(f"r{i}", "call_function", "torch.relu", inputs=[f"a{i}"], module=f"{m}.act"),
            rec(f"b{i}", inputs=[f"r{i}"], module=f"{m}.fc2"),
        ]
    nodes.append(rec("cat", target="torch.cat", inputs=[f"b{i}" for i in range(k)], shape=(4, 8 * k)))
    return GraphSnapshot(nodes)
