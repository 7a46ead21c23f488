"""The app's additions for compile logs, kernels and comparisons, driven with AppTest: the
"Compile log" model source (a path and a graph picker) runs the passes on a logged graph,
the timing panel shows the kernels Inductor generated, the compare panel draws both final
graphs side by side."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parent.parent / "app" / "main.py")
TIMEOUT = 240

#: a model with a graph break, compiled with the eager backend: the log holds two Dynamo
#: graphs (and nothing of Inductor's), in seconds
SCRIPT = textwrap.dedent(
    """
    import torch, torch.nn as nn

    class M(nn.Module):
        def __init__(s):
            super().__init__()
            s.emb = nn.Embedding(30, 8)
            s.towers = nn.ModuleList([nn.Linear(8, 8) for _ in range(5)])

        def forward(s, ids, x):
            h = s.emb(ids) + x
            y = torch.cat([torch.relu(t(h)) for t in s.towers], 1)
            torch._dynamo.graph_break()
            return y * 2

    torch.compile(M(), backend="eager")(torch.randint(0, 30, (4,)), torch.randn(4, 8))
    """
)


@pytest.fixture(scope="module")
def eager_log(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("eager_log")
    (root / "model.py").write_text(SCRIPT)
    env = {**os.environ, "TORCH_TRACE": str(root / "trace")}
    subprocess.run([sys.executable, "model.py"], cwd=root, env=env, check=True, capture_output=True, timeout=300)
    (root / "model.py").unlink()
    return root / "trace"


def test_the_compile_log_source_picks_a_graph_and_runs_it(eager_log):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.radio(key="source_kind").set_value("Compile log").run()
    at.text_input(key="log_path").input(str(eager_log)).run()
    assert not at.exception
    picker = at.selectbox(key="log_graph")
    # graph_break() restarts the frame's analysis: its graph is attempt 1 of compile 0/0
    assert [o.split()[0] for o in picker.options] == ["0/0_1", "1/0"]
    assert any("2 Dynamo graph(s), 1 graph break(s)" in c.value for c in at.sidebar.caption)
    at.selectbox(key="log_graph").set_value(1).run()
    run = next(b for b in at.button if b.label == "Run")
    run.click().run()
    assert not at.exception
    trace = at.session_state["trace"]
    assert trace.capture["method"] == "log" and trace.capture["log"]["compile_id"] == "1/0"
    assert at.session_state["spec"] == f"log:{eager_log}#1/0"


def test_a_path_without_a_log_says_so_and_keeps_run_disabled(tmp_path):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.radio(key="source_kind").set_value("Compile log").run()
    at.text_input(key="log_path").input(str(tmp_path)).run()
    assert not at.exception
    assert any("no compile log here" in c.value for c in at.sidebar.caption)
    assert next(b for b in at.button if b.label == "Run").disabled


TIMING = """
from optimus_lens.perf.timings import BenchResult, StageTiming
from optimus_lens.app.timing import show_result

k0 = {"kernels": 4, "kernel_names": ["cpp_fused_relu_0"], "launches": 18, "extern_calls": 18,
      "extern": {"extern_kernels.addmm": 18}, "modules": 1}
k1 = {"kernels": 5, "kernel_names": ["cpp_fused_stack_0"], "launches": 5, "extern_calls": 4,
      "extern": {"extern_kernels.baddbmm": 2, "extern_kernels.addmm": 2}, "modules": 1}
b = BenchResult("cpu", "wall-clock", [
    StageTiming("baseline", 10, 1.0, 0.9, 1.1, 5, kind="baseline", kernels=k0),
    StageTiming("batch_linear", 9, 0.8, 0.7, 0.9, 5, speedup=1.25, steps=2, kernels=k1)], threads=1)
show_result(b)
"""


def test_the_timing_panel_shows_the_kernels_column_and_their_names():
    at = AppTest.from_string(TIMING).run(timeout=60)
    assert not at.exception
    table = at.dataframe[0].value
    assert list(table["kernels"]) == [4, 5] and list(table["extern calls"]) == [18, 4]
    text = " ".join(c.value for c in at.caption)
    assert "Kernels Inductor generated" in text and "extern_kernels.addmm x18" in text


COMPARE = """
import streamlit as st
from optimus_lens.app.compare_view import final_graphs
from optimus_lens.debug.compare import compare_runs
from optimus_lens.frontend.run import optimize

a = optimize("sample:teach_batch_relu", verify="off").trace
b = optimize("sample:teach_batch_relu", verify="off", skip=["batch_relu"]).trace
final_graphs(compare_runs(a, b, "all", "no batch_relu"), key="t")
"""


def test_the_compare_panel_draws_both_final_graphs_side_by_side():
    at = AppTest.from_string(COMPARE).run(timeout=TIMEOUT)
    assert not at.exception
    assert any("Final graphs" in m.value for m in at.markdown)
    assert any("only in B" in c.value and "one layout for both" in c.value for c in at.caption)
