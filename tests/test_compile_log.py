"""A compile log as a model source: a real ``TORCH_TRACE`` log of a training script whose
code is deleted before the log is read, opened with ``log:PATH``, stepped through our
passes and upstream's with every step verified.

One log for the module (a subprocess compiles the script with Inductor once), so the
rest of the tests read it in-process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from optimus_lens.cli import main
from optimus_lens.frontend.capture import capture
from optimus_lens.frontend.compile_log import LogError, load_entry, load_log, read_log
from optimus_lens.frontend.run import ModelSpecError, load_model, optimize
from optimus_lens.inductor.log_replay import check_replay
from optimus_lens.inductor.observe import observe

OPTIONS = {"batch_linear": {}, "batch_relu": {}, "unbind_stack_pass": {}}

TRAIN = textwrap.dedent(
    f"""
    import torch, torch.nn as nn
    import torch._inductor.config as cfg
    cfg.pre_grad_fusion_options = {OPTIONS!r}
    torch.manual_seed(0)

    class Towers(nn.Module):
        def __init__(s):
            super().__init__()
            s.emb = nn.Embedding(50, 16)
            s.bag = nn.EmbeddingBag(40, 16, mode="sum")
            s.towers = nn.ModuleList([nn.Linear(16, 8) for _ in range(5)])
            s.head = nn.Linear(40, 1)

        def forward(s, ids, bag_ids, offsets, x):
            e = s.emb(ids).sum(1) + s.bag(bag_ids, offsets) + x
            outs = [torch.nn.functional.relu(t(e)) for t in s.towers]
            y = torch.cat(outs, 1)
            if y.sum() > 0:  # a graph break: the log holds two frames
                y = y * 2
            return s.head(y).squeeze(1)

    m = Towers()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    step = torch.compile(m)
    loss = step(torch.randint(0, 50, (4, 3)), torch.randint(0, 40, (9,)), torch.tensor([0, 2, 5, 7]),
                torch.randn(4, 16)).pow(2).mean()
    loss.backward()
    opt.step()
    """
)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory) -> Path:
    """A TORCH_TRACE directory written by training the script once; the script is gone."""
    root = tmp_path_factory.mktemp("compile_log")
    script = root / "train.py"
    script.write_text(TRAIN)
    env = {
        **os.environ,
        "TORCH_TRACE": str(root / "trace"),
        "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1",
        "TORCHINDUCTOR_CACHE_DIR": str(root / "cache"),
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
    }
    subprocess.run([sys.executable, str(script)], env=env, cwd=root, check=True, capture_output=True, timeout=600)
    script.unlink()  # the log must be enough
    shutil.rmtree(root / "cache", ignore_errors=True)
    return root / "trace"


def test_the_log_lists_every_frames_graphs_its_break_and_the_logged_options(logdir):
    log = read_log(logdir)
    frames = log.graphs()
    assert [e.compile_id for e in frames] == ["0/0", "1/0"]  # the graph break splits the step in two
    arts = {e.artifact for e in log.entries if e.compile_id == "0/0"}
    assert {"before_pre_grad_graph", "after_pre_grad_graph", "aot_forward_graph", "aot_backward_graph"} <= arts
    assert any(e.artifact.startswith("optimus_") for e in log.entries)  # upstream's per-pass graphs
    assert "Data-dependent branching" in log.breaks["0/0"][0]
    assert "User code traceback" not in log.breaks["0/0"][0]
    assert log.pre_grad_options("0/0") == OPTIONS
    assert log.torch_version == torch.__version__


def test_the_default_graph_reads_back_as_the_code_pytorch_logged(logdir):
    loaded = load_log(f"log:{logdir}")
    e = loaded.entry
    assert (e.compile_id, e.artifact) == ("0/0", "dynamo_output_graph")
    gm = loaded.gm
    for n in gm.graph.nodes:  # print_readable reads "val"
        if "example_value" in n.meta:
            n.meta["val"] = n.meta["example_value"]
    text = gm.print_readable(print_output=False, include_stride=True, include_device=True)
    logged = [ln.rstrip() for ln in e.code.strip().splitlines() if ln.strip() and "# graph id" not in ln]
    assert [ln.rstrip() for ln in text.strip().splitlines() if ln.strip()] == logged
    linear = next(n for n in gm.graph.nodes if n.name == "linear")
    assert 'train.py", line' in linear.meta["stack_trace"]  # the source line, from the log alone
    assert linear.target is torch._C._nn.linear and "example_value" in linear.meta


def test_integer_inputs_hold_values_the_embeddings_accept(logdir):
    loaded = load_log(f"log:{logdir}")
    names = [n.name for n in loaded.gm.graph.nodes if n.op == "placeholder"]
    ins = dict(zip(names, loaded.example_inputs))
    ids, bag_ids, offsets = ins["l_ids_"], ins["l_bag_ids_"], ins["l_offsets_"]
    assert ids.dtype == torch.int64 and 0 <= int(ids.min()) and int(ids.max()) < 50
    assert 0 <= int(bag_ids.min()) and int(bag_ids.max()) < 40
    assert int(offsets[0]) == 0 and bool((offsets[1:] >= offsets[:-1]).all()) and int(offsets[-1]) <= bag_ids.numel()
    weight = next(v for k, v in ins.items() if "emb_parameters_weight" in k)
    assert isinstance(weight, torch.nn.Parameter) and weight.requires_grad
    assert any("below 50" in note for note in loaded.notes) and any("offsets" in note for note in loaded.notes)
    with torch.no_grad():
        loaded.gm(*loaded.example_inputs)  # eager PyTorch accepts them


def test_our_passes_on_the_log_verify_every_step(logdir, capsys):
    res = optimize(f"log:{logdir}", verify="step")
    t = res.trace
    assert t.capture["method"] == "log" and t.capture["log"]["compile_id"] == "0/0"
    assert "batch_linear_lhs" in {s.pattern for s in t.steps}  # the five towers read one input
    assert t.steps and all(s.verify is not None and s.verify.ok for s in t.steps)
    assert main(["run", f"log:{logdir}", "--verify", "step"]) == 0
    assert "read 0/0:dynamo_output_graph" in capsys.readouterr().err


def test_a_step_of_a_logged_graph_repros_on_inputs_its_embeddings_accept(logdir, tmp_path):
    trace = tmp_path / "t.json"
    optimize(f"log:{logdir}", verify="off").trace.save(trace)
    script = tmp_path / "repro.py"
    step = 2  # batch_linear_lhs: the graph it rebuilds reads the bag's indices and offsets
    assert main(["repro", str(trace), "--step", str(step), "-o", str(script)]) == 0
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "repro: OK" in r.stdout, r.stdout + r.stderr


def test_upstreams_passes_replayed_on_the_log_reproduce_its_after_pre_grad_graph(logdir, capsys):
    model, inputs, name = load_model(f"log:{logdir}")
    c = capture(model, inputs)
    res = observe(name, options=read_log(logdir).pre_grad_options("0/0"), verify=True, captured=c)
    assert res.trace.steps and all(s.verify is not None and s.verify.ok for s in res.trace.steps)
    check = check_replay(res.trace)
    assert check is not None and check.reproduced, check.text()
    other = observe(name, options={"batch_linear": {}}, verify=True, captured=c)
    differs = check_replay(other.trace)
    assert differs is not None and not differs.reproduced and "NOT reproduce" in differs.text()
    assert main(["observe", f"log:{logdir}"]) == 0  # the logged options by default
    out = capsys.readouterr().out
    assert "(the logged compile's)" in out and "node for node" in out


def test_a_graph_break_is_one_more_graph_of_the_log(logdir):
    second = load_log(f"log:{logdir}#1/0")
    assert second.entry.compile_id == "1/0" and second.entry.artifact == "dynamo_output_graph"
    model, inputs, _ = load_model(f"log:{logdir}")
    c = capture(model, inputs, graph_index=1)
    assert c.log["compile_id"] == "1/0" and c.info()["graphs"] == 2 and c.breaks
    assert [n.name for n in c.gm.graph.nodes] == [n.name for n in second.gm.graph.nodes]
    with pytest.raises(ValueError, match="outside 0..1"):
        capture(model, inputs, graph_index=2)


def test_the_aot_graphs_load_as_aten_graphs_that_run(logdir):
    log = read_log(logdir)
    for art in ("aot_forward_graph", "aot_backward_graph", "aot_joint_graph", "before_post_grad_graph"):
        loaded = load_entry(log, log.entry("0/0", art))
        gm = loaded.gm
        assert loaded.entry.ir == "aten"
        assert any(str(n.target).startswith("aten.") for n in gm.graph.nodes if n.op == "call_function")
        assert all("val" in n.meta for n in gm.graph.nodes if n.op == "call_function")
        with torch.no_grad():
            gm(*loaded.example_inputs)


def test_bad_selectors_and_paths_are_named(logdir, tmp_path, capsys):
    with pytest.raises(ModelSpecError, match="is no graph of the log"):
        load_model(f"log:{logdir}#nothing")
    with pytest.raises(ModelSpecError, match="no graph 999"):
        load_model(f"log:{logdir}#999")
    with pytest.raises(ModelSpecError, match="no such compile log"):
        load_model(f"log:{tmp_path}/missing")
    with pytest.raises(LogError, match="no compile log here"):
        read_log(tmp_path)
    assert main(["run", f"log:{logdir}#7/0"]) == 2
    assert "no graph 7/0:dynamo_output_graph" in capsys.readouterr().err


def test_a_torch_compile_debug_directory_is_read_through_its_tlparse_log(logdir, tmp_path):
    # TORCH_COMPILE_DEBUG=1 writes torch_compile_debug/tlparse/*.log beside run_*/ directories
    tl = tmp_path / "torch_compile_debug" / "tlparse"
    tl.mkdir(parents=True)
    for f in logdir.glob("*.log"):
        shutil.copy(f, tl / f.name)
    run_dir = tmp_path / "torch_compile_debug" / "run_2026_01_01-pid_1"
    run_dir.mkdir()
    for where in (tmp_path, tmp_path / "torch_compile_debug", run_dir):
        assert [e.compile_id for e in read_log(where).graphs()] == ["0/0", "1/0"]


def test_the_log_command_lists_specs_and_replays_each_compile(logdir, tmp_path):
    out = tmp_path / "log.json"
    assert main(["log", str(logdir), "--replay", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == {"name": "optimus.log", "version": 1}
    specs = [g["spec"] for g in doc["graphs"]]
    assert specs[0] == f"log:{logdir}" and f"log:{logdir}#1/0:dynamo_output_graph" in specs
    assert all(g["nodes"] > 0 for g in doc["graphs"])
    assert [r["reproduced"] for r in doc["replay"]] == [True, True]


def test_a_sweep_takes_every_graph_of_a_log(logdir, tmp_path):
    from optimus_lens.sweep.configs import expand_specs

    assert expand_specs([f"log:{logdir}#*"]) == [f"log:{logdir}#0/0", f"log:{logdir}#1/0"]
    models = tmp_path / "models.txt"
    models.write_text(f"# the second frame\nlog:{logdir}#1/0  # after the break\n")
    assert expand_specs([], str(models)) == [f"log:{logdir}#1/0"]


def test_the_eager_oracle_agrees_on_the_logs_graphs(logdir):
    """An oracle independent of our verification (tests/oracle.py: the logged model eagerly
    against our pipeline under a plain Dynamo backend, on identical fresh inputs; values,
    dtypes, aliasing, in-place writes, gradients) on both frames of the log."""
    import oracle

    from optimus_lens import RunOptions, run_pipeline

    def rewrite(gm, example_inputs) -> int:
        return len(run_pipeline(gm, example_inputs, None, RunOptions(verify="off")).steps)

    steps = {}
    for spec in (f"log:{logdir}", f"log:{logdir}#1/0"):
        why, steps[spec] = oracle.differs(lambda spec=spec: load_model(spec)[:2], rewrite, grads=True)
        assert why is None, (spec, why)
    assert steps[f"log:{logdir}"] > 0  # the pipeline did rewrite the first frame
