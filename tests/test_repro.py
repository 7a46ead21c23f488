"""Repro export (optimus/repro.py, optimus/rebuild.py, `optimus repro`): a standalone script replays one
step of a trace from its snapshot alone; round trips run the script in a fresh interpreter."""

import os
import random
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import HealthCheck, given, settings

from optimus_lens import sample_models
from optimus_lens.cli import main
from optimus_lens.core.engine import Engine, RunOptions
from optimus_lens.core.pattern import REGISTRY
from optimus_lens.core.pipeline import Pass, Pipeline
from optimus_lens.core.trace import Trace
from optimus_lens.core.verify import compare_outputs, run_graph
from optimus_lens.debug.rebuild import graph_module, random_inputs
from optimus_lens.debug.repro import run_repro, step_spec
from optimus_lens.frontend.capture import capture
from optimus_lens.frontend.run import optimize
from optimus_lens.sample_models.random_models import build, dtype_supported, random_spec

REPO = Path(__file__).resolve().parent.parent

BROKEN = textwrap.dedent('''
    import torch
    from optimus_lens.core.miss import Miss
    from optimus_lens.core.pattern import Match, RewritePattern, register


    @register
    class ReluAsSigmoid(RewritePattern):
        """Deliberately wrong: replaces relu by sigmoid."""

        name = "relu_as_sigmoid_broken"
        description = "relu -> sigmoid (wrong on purpose)"
        anchors = frozenset({torch.relu})

        def match(self, node):
            return Match(node, [node]) if node.target is torch.relu else Miss("not torch.relu")

        def rewrite(self, rw, m):
            with rw.inserting_before(m.anchor):
                new = rw.call(torch.sigmoid, m.anchor.args[0])
            rw.carry_meta(m.anchor, new)
            rw.replace_all_uses(m.anchor, new)
            rw.erase(m.anchor)
''')


def run_script(path: Path, extra_path: str = "") -> subprocess.CompletedProcess:
    """The script in a fresh interpreter that sees only the package (and ``extra_path``)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), extra_path) if p),
    }
    return subprocess.run(
        [sys.executable, "-P", str(path)], capture_output=True, text=True, env=env, cwd=path.parent, timeout=300
    )


def test_snapshots_rebuild_to_graphs_that_compute_what_the_captured_and_optimised_graphs_do():
    res = optimize("sample:recsys_towers", verify="off")
    t, ins = res.trace, res.captured.example_inputs
    for k, gm in ((0, res.captured.gm), (len(t.steps), res.engine.gm)):
        ref, _ = run_graph(gm, ins)
        out, _ = run_graph(graph_module(t.graph_at(k)), ins)
        assert compare_outputs(ref, out).ok
    x = random_inputs(t.graph_at(0))
    assert [tuple(v.shape) for v in x] == [tuple(v.shape) for v in ins]
    assert [v.stride() for v in x] == [v.stride() for v in ins]


def test_the_recorded_stride_survives_json_and_old_traces_without_it_load(tmp_path):
    def fn(x):
        return x.t().relu()

    c = capture(fn, (torch.randn(3, 4),))
    t = Engine(c.gm, c.example_inputs, Pipeline([]), RunOptions(verify="off")).run()
    path = tmp_path / "t.json"
    t.save(path)
    recs = Trace.load(path).initial_graph.nodes
    assert recs["l_x_"].stride == [4, 1]
    (t_node,) = [r for r in recs.values() if r.target == "t"]
    assert t_node.stride == [1, 4] and t_node.shape == [4, 3]
    old = re.sub(r',"stride":\[[^\]]*\]', "", path.read_text())  # as written before strides were recorded
    assert '"stride"' not in old
    assert Trace.loads(old).initial_graph.nodes["l_x_"].stride is None


def test_repro_of_a_good_step_passes_in_a_fresh_interpreter(tmp_path, capsys):
    trace = tmp_path / "t.json"
    assert main(["run", "sample:recsys_towers", "--trace", str(trace)]) == 0
    t = Trace.load(trace)
    index = next(s.index for s in t.steps if s.pattern == "batch_layernorm")
    script = tmp_path / "repro.py"
    assert main(["repro", str(trace), "--step", str(index), "-o", str(script)]) == 0
    imports = {line for line in script.read_text().splitlines() if line.startswith(("import ", "from "))}
    assert imports == {"import json", "import sys", "from optimus_lens.debug.repro import run_repro"}  # no model code
    r = run_script(script)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "OK: the rewritten graph matches" in r.stdout


@pytest.fixture
def broken_pattern(tmp_path):
    (tmp_path / "broken_patterns.py").write_text(BROKEN)
    sys.path.insert(0, str(tmp_path))
    import broken_patterns  # noqa: F401  (registers relu_as_sigmoid_broken)

    yield REGISTRY["relu_as_sigmoid_broken"]
    REGISTRY.pop("relu_as_sigmoid_broken", None)
    sys.modules.pop("broken_patterns", None)
    sys.path.remove(str(tmp_path))


def test_repro_of_a_deliberately_broken_pattern_fails_in_a_fresh_interpreter(tmp_path, broken_pattern, capsys):
    c = capture(*sample_models.get("teach_batch_relu"))
    pipe = Pipeline([Pass("broken", [broken_pattern])])
    t = Engine(c.gm, c.example_inputs, pipe, RunOptions(verify="step")).run()
    assert t.failed_steps()
    trace = tmp_path / "t.json"
    t.save(trace)
    script = tmp_path / "repro.py"
    assert main(["repro", str(trace), "-o", str(script)]) == 0  # default: the first failing step
    r = run_script(script, extra_path=str(tmp_path))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAILED: outputs" in r.stdout and "elements off" in r.stdout


def test_repro_refuses_a_missing_step_and_a_garbage_trace(tmp_path, capsys):
    trace = tmp_path / "t.json"
    main(["run", "sample:teach_batch_relu", "--trace", str(trace)])
    capsys.readouterr()
    assert main(["repro", str(trace), "--step", "99"]) == 2
    assert "no step 99" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("[]")
    assert main(["repro", str(tmp_path / "bad.json")]) == 2


def test_rebuild_reads_dtypes_devices_slices_and_never_evaluates_strings():
    from optimus_lens.core.trace import GraphSnapshot, NodeRecord

    x = {"node": "x"}
    snap = GraphSnapshot(
        [
            NodeRecord("x", "placeholder", "x", shape=[4, 6], dtype="float32", stride=[1, 4]),
            NodeRecord("half", "call_method", "to", [x, "float64"], inputs=["x"]),
            NodeRecord(
                "z", "call_function", "torch.zeros", [[2]], {"device": "device(type='cpu')", "dtype": "float16"}
            ),
            NodeRecord(
                "cut",
                "call_function",
                "_operator.getitem",
                [{"node": "half"}, [{"slice": [None, None, None]}, {"slice": [1, 5, 2]}]],
                inputs=["half"],
            ),
            NodeRecord("output", "output", "output", [[{"node": "cut"}, {"node": "z"}]], inputs=["cut", "z"]),
        ]
    )
    gm = graph_module(snap)
    (inp,) = random_inputs(snap)
    assert inp.stride() == (1, 4) and inp.dtype == torch.float32
    cut, z = gm(inp)
    assert cut.dtype == torch.float64 and torch.equal(cut, inp.double()[:, 1:5:2])
    assert z.dtype == torch.float16 and z.device == torch.device("cpu")
    evil = GraphSnapshot(
        [
            NodeRecord(
                "z", "call_function", "torch.zeros", [[2]], {"device": "device(type=__import__('os').getpid())"}
            ),
            NodeRecord("output", "output", "output", [{"node": "z"}], inputs=["z"]),
        ]
    )
    with pytest.raises(RuntimeError, match="device"):  # the string reaches torch as a string
        graph_module(evil)()


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), dtype=st.sampled_from([d for d in ("float32", "bfloat16") if dtype_supported(d)]))
def test_the_repro_of_every_step_of_a_random_model_passes(seed, dtype):
    model, inputs = build(random_spec(random.Random(seed), dtype))
    t = optimize(model, inputs, verify="off").trace
    for s in t.steps:
        out = []
        assert run_repro(t.before(s.index).to_json(), step_spec(t, s.index), out=out.append) == 0, out
