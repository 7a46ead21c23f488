"""The tools around a failure see the graph that ran: program order kept where it matters
(nodes with side effects), custom ops resolved when a graph is rebuilt, DOT text bounded
and escaped, and an upstream pass that raises named with its message."""

import operator
import subprocess
import sys
import uuid

import pytest
import torch

from optimus_lens.cli import main
from optimus_lens.core.miss import Miss
from optimus_lens.core.pattern import Match, RewritePattern
from optimus_lens.core.pipeline import Pass, Pipeline
from optimus_lens.core.trace import GraphSnapshot, NodeRecord, Trace
from optimus_lens.debug.bisect import bisect_trace
from optimus_lens.debug.rebuild import RebuildError, graph_module, graph_order
from optimus_lens.frontend.run import optimize

# ---------------------------------------------------------------- program order


class HoistTimesThree(RewritePattern):
    """Deliberately wrong: recomputes ``x * 3`` at the top of the graph, before the
    in-place write into ``x`` that the original read follows."""

    name = "hoist_times_three"
    anchors = frozenset({operator.mul})

    def match(self, node):
        if node.args[1:] != (3,):
            return Miss("not a product by 3")
        if node.prev.op == "placeholder":
            return Miss("already first")
        return Match(node, [node])

    def rewrite(self, rw, m):
        first = next(n for n in m.anchor.graph.nodes if n.op != "placeholder")
        with rw.inserting_before(first):
            new = rw.call(operator.mul, m.anchor.args[0], 3)
        rw.carry_meta(m.anchor, new)
        rw.replace_all_uses(m.anchor, new)
        rw.erase(m.anchor)


class WritesThenReads(torch.nn.Module):
    def forward(self, x):
        a = x + 1
        x.mul_(2)
        b = x * 3  # reads the written x
        return a + b


HOIST = Pipeline([Pass("hoist", [HoistTimesThree()])])


@pytest.fixture(scope="module")
def hoisted():
    """The hoist run with the engine's step check off (core/stepcheck.py refuses a read moved
    across a write before it happens): the step the tools must see is one a check missed."""
    from optimus_lens.core.stepcheck import StepCheck

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(StepCheck, "verify", lambda self, *a, **k: None)
        verified = optimize(WritesThenReads(), (torch.randn(4),), pipeline=HOIST, verify="step").trace
        run = optimize(WritesThenReads(), (torch.randn(4),), pipeline=HOIST, verify="off")
    return verified, run


def test_the_trace_marks_nodes_with_side_effects_and_what_follows_them(hoisted):
    _, run = hoisted
    initial = run.trace.graph_at(0).nodes
    writes = [r for r in initial.values() if r.effects]
    assert [r.target for r in writes] == ["mul_"]
    assert initial["a"].after is None and initial["b"].after == writes[0].name
    (created,) = run.trace.steps[0].created
    assert run.trace.graph_at(1).nodes[created].after is None  # the new read runs before the write
    # kept through JSON
    again = Trace.loads(run.trace.dumps())
    assert again.graph_at(1).nodes[created].after is None and again.graph_at(0).nodes[writes[0].name].effects


def test_bisect_finds_a_step_that_moved_a_read_across_an_in_place_write(hoisted):
    verified, run = hoisted
    assert verified.steps[0].verify.ok is False  # the live graph was wrong
    b = bisect_trace(run.trace, run.captured.example_inputs)
    assert b.first_bad == 1, b.message
    # without the order marks the rebuilt graph reads after the write again and looks right:
    # what bisect reported before the trace kept program order
    stripped = Trace.loads(run.trace.dumps())
    for k in (0, 1):
        for r in stripped.graph_at(k).nodes.values():
            r.after, r.effects = None, False
    assert bisect_trace(stripped, run.captured.example_inputs).first_bad is None


def test_diff_shows_the_read_before_the_write_as_it_ran(hoisted, tmp_path, capsys):
    _, run = hoisted
    path = tmp_path / "t.json"
    run.trace.save(path)
    assert main(["diff", str(path), "--step", "1", "--color", "never"]) == 0
    out = capsys.readouterr().out
    (created,) = run.trace.steps[0].created
    assert out.index(f"{created} = l_x_ * 3") < out.index(".mul_(2)")


def test_a_region_of_grad_mode_keeps_its_members_between_its_enter_and_exit():
    recs = [
        NodeRecord("x", "placeholder", "x"),
        NodeRecord("off", "call_function", "torch._C._set_grad_enabled", [False], effects=True),
        NodeRecord("inside", "call_function", "_operator.mul", [{"node": "x"}, 2], after="off"),
        NodeRecord("on", "call_function", "torch._C._set_grad_enabled", [True], effects=True, after="off"),
        NodeRecord("outside", "call_function", "_operator.mul", [{"node": "x"}, 3], after="on"),
        NodeRecord("output", "output", "output", [[{"node": "inside"}, {"node": "outside"}]], after="on"),
    ]
    for r in recs:
        r.inputs = [a["node"] for a in r.args if isinstance(a, dict)] or [
            a["node"] for a in (r.args[0] if r.args and isinstance(r.args[0], list) else []) if isinstance(a, dict)
        ]
    snap = GraphSnapshot(recs)
    # a step's new nodes are appended to the snapshot: move the region's member to the end
    snap.nodes["inside"] = snap.nodes.pop("inside")
    order = [r.name for r in graph_order(snap)]
    assert order.index("off") < order.index("inside") < order.index("on") < order.index("outside")
    with torch.enable_grad():
        x = torch.randn(3, requires_grad=True)
        inside, outside = graph_module(snap)(x)
    assert not inside.requires_grad and outside.requires_grad


# ---------------------------------------------------------------- custom ops


def _op_module(tmp_path, mutates: bool = False) -> tuple[str, str]:
    """A module file under ``tmp_path`` that registers a custom op when imported: (module name, namespace)."""
    tag = uuid.uuid4().hex[:8]
    mod, ns = f"lens_ops_{tag}", f"lenstest_{tag}"
    (tmp_path / f"{mod}.py").write_text(
        "import torch\n\n\n"
        f'@torch.library.custom_op("{ns}::twice", mutates_args=())\n'
        "def twice(x: torch.Tensor) -> torch.Tensor:\n    return x * 2\n\n\n"
        "@twice.register_fake\ndef _(x):\n    return torch.empty_like(x)\n"
    )
    return mod, ns


def _custom_op_snapshot(ns: str, module: str | None) -> GraphSnapshot:
    return GraphSnapshot(
        [
            NodeRecord("x", "placeholder", "x", shape=[3], dtype="float32", stride=[1]),
            NodeRecord(
                "t",
                "call_function",
                f"torch.ops.{ns}.twice.default",
                [{"node": "x"}],
                inputs=["x"],
                target_module=module,
            ),
            NodeRecord("output", "output", "output", [[{"node": "t"}]], inputs=["t"]),
        ]
    )


def test_a_custom_op_resolves_by_importing_the_module_that_registers_it(tmp_path, monkeypatch):
    mod, ns = _op_module(tmp_path)
    monkeypatch.chdir(tmp_path)  # importable from the current directory, as model specs are
    assert mod not in sys.modules
    gm = graph_module(_custom_op_snapshot(ns, mod))
    x = torch.randn(3)
    torch.testing.assert_close(gm(x)[0], x * 2)
    assert mod in sys.modules


def test_a_custom_op_whose_module_cannot_be_imported_says_which_module_to_import(tmp_path):
    with pytest.raises(RebuildError, match=r"registered by module 'lens_ops_not_here'; importing it failed"):
        graph_module(_custom_op_snapshot("lenstest_not_here", "lens_ops_not_here"))
    with pytest.raises(RebuildError, match="the trace does not name the module"):
        graph_module(_custom_op_snapshot("lenstest_not_here", None))


class LinearsAndACustomOp(torch.nn.Module):
    def __init__(self, op):
        super().__init__()
        self.fcs = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(5))
        self.op = op

    def forward(self, x):
        outs = [fc(x) for fc in self.fcs]
        return self.op(outs[0]) + sum(outs[1:])


def test_diff_and_repro_of_a_trace_with_a_custom_op_run_in_a_fresh_process(tmp_path, monkeypatch):
    import importlib

    mod, ns = _op_module(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module(mod)
    op = getattr(torch.ops, ns).twice
    trace = optimize(LinearsAndACustomOp(op), (torch.randn(2, 4),), verify="off").trace
    recs = [r for r in trace.graph_at(0).nodes.values() if f"{ns}.twice" in r.target]
    assert recs and recs[0].target_module == mod
    step = next(s.index for s in trace.steps if s.pattern.startswith("batch_linear"))
    path = tmp_path / "t.json"
    trace.save(path)
    repro = tmp_path / "repro.py"
    script = (
        "import sys\nfrom optimus_lens.cli import main\n"
        f"sys.exit(main(['diff', {str(path)!r}, '--step', '{step}', '--color', 'never']) "
        f"or main(['repro', {str(path)!r}, '--step', '{step}', '-o', {str(repro)!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"{ns}.twice" in done.stdout
    ran = subprocess.run([sys.executable, str(repro)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]


# ---------------------------------------------------------------- DOT text


ODD = 'say "hi" \\ back\\slash <b>&amp;</b> \t tab \x1b[31m escape \x00 nul \u2603 ' + "\ud800"


def test_a_twenty_thousand_character_source_line_and_odd_characters_do_not_break_the_report(tmp_path):
    from optimus_lens.viz.dot import MAX_VALUE, bounded

    model_file = tmp_path / "generated.py"
    long_literal = "x" * 20_000
    model_file.write_text(
        "import torch\n\n\nclass Gen(torch.nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n"
        "        self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)\n\n"
        "    def forward(self, x):\n"
        f'        return torch.relu(self.a(x)) + self.b(x) * len("{long_literal}" \'"<&>\\\\\')\n\n\n'
        "def build():\n    return Gen(), (torch.randn(2, 4),)\n"
    )
    trace = optimize(f"{model_file}:build", verify="off").trace
    long = [r for r in trace.graph_at(0).nodes.values() if r.source and len(r.source) > 20_000]
    assert long, "the capture recorded the long source line"
    long[0].source = long[0].source + ODD  # and every kind of character a label may carry
    path, out = tmp_path / "t.json", tmp_path / "r.html"
    assert trace.save(path) > 20_000
    assert main(["report", str(path), "-o", str(out)]) == 0
    html = out.read_text()
    assert "could not be drawn" not in html and "cannot label this node" not in html
    cut = bounded('a"' * MAX_VALUE + "\\\\")
    assert len(cut) <= MAX_VALUE and cut.endswith("…") and (len(cut) - len(cut.rstrip("\\"))) % 2 == 0
    assert "\x1b" not in bounded(ODD) and "\ud800" not in bounded(ODD) and "\\n" not in bounded("a\tb")


# ---------------------------------------------------------------- observe


def test_an_upstream_rule_that_raises_with_no_message_is_named_with_its_pass(monkeypatch):
    from torch._inductor.fx_passes import group_batch_fusion as gbf

    from optimus_lens.inductor.observe import observe

    def broken(self, graph, subset):
        raise AssertionError()  # a bare assert, as upstream's own (pytest would add a message to an assert here)

    monkeypatch.setattr(gbf.PreGradBatchLinearFusion, "fuse", broken)
    t = observe("sample:recsys_towers", options={"batch_linear": {}}).trace
    msg = t.final_verify.message
    assert t.final_verify.checked == "raised"
    assert (
        msg.startswith("pass batch_linear (PreGradBatchLinearFusion)") and "raised AssertionError: (no message)" in msg
    )
    assert "raise AssertionError()" in msg


def test_observe_names_the_upstream_function_when_a_pass_outside_any_rule_raises(monkeypatch, capsys):
    from torch._inductor.fx_passes import pre_grad

    def broken(graph):
        raise AssertionError

    monkeypatch.setattr(pre_grad, "numpy_compat_normalization", broken)
    assert main(["observe", "sample:teach_batch_linear", "--options", '{"batch_linear": {}}']) == 3
    err = capsys.readouterr().err
    assert "pre_grad_passes at pre_grad.py:" in err and "raised AssertionError: (no message)" in err
    assert "raise AssertionError" in err


def test_fx_purity_is_read_once_per_target_and_per_node_for_a_higher_order_op():
    from torch.fx import Graph

    from optimus_lens.core.record import ProgramOrder, has_side_effects

    g = Graph()
    x = g.placeholder("x")
    x.meta["example_value"] = torch.randn(3)
    check = torch.ops.aten._assert_async.msg  # pure by its schema, a side effect to FX
    checks = [g.call_function(check, (x, "ok")) for _ in range(2)]
    adds = [g.call_function(torch.add, (x, 1)) for _ in range(2)]
    order = ProgramOrder()
    assert [order.is_effect(n) for n in (*checks, *adds)] == [True, True, False, False]
    assert order.impure == {check: True, torch.add: False}
    assert all(has_side_effects(n, {}) == has_side_effects(n) for n in (*checks, *adds))
    hop = torch.ops.higher_order.auto_functionalized
    n = g.call_function(hop, (torch.ops.aten.add.Tensor,), {})
    order.is_effect(n)
    assert hop not in order.impure  # its answer reads its operands, so it is not kept per target
