"""``optimus sweep`` (optimus/sweep/): every model x config in its own process, rows in
DIR/results.jsonl, resumable, the same rows locally and as Ray tasks, and a run that is
killed, times out or runs out of memory loses only itself."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from optimus_lens import cli
from optimus_lens.sweep.configs import DEFAULT_CONFIG, SweepConfig, SweepError, expand_specs, load_configs
from optimus_lens.sweep.driver import sweep
from optimus_lens.sweep.results import Results, comparable
from optimus_lens.sweep.task import SweepOptions
from optimus_lens.viz.sweep_summary import write_summary

MODELS = ["sample:teach_batch_relu", "sample:teach_split_cat", "hf:bert?layers=1"]
FUSIONS_ONLY = SweepConfig("fusions-only", passes=("normalization_pass", "batch_linear_lhs", "batch_relu"))
CONFIGS = [DEFAULT_CONFIG, FUSIONS_ONLY]
FAST = SweepOptions(reports=False, time_limit_s=300)

FACTORIES = '''
import os, signal, sys, time
import torch


def killed_by_test():
    """Writes its pid next to this file, then waits to be killed."""
    open(os.path.join(os.path.dirname(__file__), "pid"), "w").write(str(os.getpid()))
    time.sleep(120)


def kills_itself():
    os.kill(os.getpid(), signal.SIGKILL)


def sleeps():
    time.sleep(60)


def hog():
    torch.ones(int(1.5 * 2**30), dtype=torch.float32)  # 6 GiB
    return torch.nn.Linear(2, 2), (torch.randn(1, 2),)


def raises():
    raise RuntimeError("this factory raises")
'''


@pytest.fixture(scope="module")
def factories(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("factories")
    (d / "bad_models.py").write_text(FACTORIES)
    return d / "bad_models.py"


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "local"
    res = sweep(MODELS, CONFIGS, FAST, out, workers=2, progress=False, on_rows=write_summary)
    return out, res


def test_every_model_x_config_is_one_row_with_its_trace(local_sweep):
    out, res = local_sweep
    assert res.skipped == 0 and len(res.rows) == 6
    assert [(r["model"], r["config"]) for r in res.rows] == [(m, c.name) for m in MODELS for c in CONFIGS]
    assert all(r["status"] == "ok" and r["verify"] == "ok" for r in res.rows), [r["error"] for r in res.rows]
    lines = (out / "results.jsonl").read_text().splitlines()
    assert sorted(json.loads(x)["key"] for x in lines) == sorted(r["key"] for r in res.rows)
    from optimus_lens.core.trace import Trace

    for r in res.rows:
        t = Trace.load(out / r["trace"])
        assert (t.nodes_before, t.nodes_after, len(t.steps)) == (r["nodes_before"], r["nodes_after"], r["steps"])
        assert sum(r["steps_per_pattern"].values()) == r["steps"] - r["rolled_back"]


def test_configs_change_what_runs(local_sweep):
    _, res = local_sweep
    rows = {(r["model"], r["config"]): r for r in res.rows}
    full, fusions = rows[("sample:teach_split_cat", "default")], rows[("sample:teach_split_cat", "fusions-only")]
    assert full["steps"] > fusions["steps"]
    allowed = {"normalize_split", "normalize_cat", "normalize_stack", "batch_linear_lhs", "batch_relu"}
    assert all(set(r["steps_per_pattern"]) <= allowed for r in res.rows if r["config"] == "fusions-only")


def test_summary_html_is_a_sortable_table_linking_every_trace(local_sweep):
    out, res = local_sweep
    page = (out / "summary.html").read_text()
    assert page.count("<tr class=") == 6 and "addEventListener('click'" in page
    assert all(f'href="{r["trace"]}"' in page for r in res.rows)
    assert "optimus report traces/" in page  # no report written: the command that writes one
    assert {c["name"] for c in json.loads((out / "configs.json").read_text())} == {"default", "fusions-only"}


def test_a_restarted_sweep_skips_the_runs_already_in_results(local_sweep, tmp_path):
    out, first = local_sweep
    again = sweep(MODELS, CONFIGS, FAST, out, workers=2, progress=False)
    assert again.skipped == 6 and [r["key"] for r in again.rows] == [r["key"] for r in first.rows]
    assert len((out / "results.jsonl").read_text().splitlines()) == 6
    # a sweep cut short: one row lost, and a line cut off mid-write
    copy = tmp_path / "cut"
    copy.mkdir()
    lines = (out / "results.jsonl").read_text().splitlines()
    (copy / "results.jsonl").write_text("\n".join(lines[:-1]) + '\n{"key": "sample:teach')
    lost = json.loads(lines[-1])["key"]
    resumed = sweep(MODELS, CONFIGS, FAST, copy, workers=1, progress=False)
    assert resumed.skipped == 5
    rows = Results(copy).rows()
    assert len(rows) == 6 and rows[lost]["status"] == "ok"


def test_the_same_sweep_as_ray_tasks_gives_identical_rows(local_sweep, tmp_path):
    pytest.importorskip("ray")
    _, local = local_sweep
    remote = sweep(MODELS, CONFIGS, FAST, tmp_path / "ray", workers=2, ray_address="local", progress=False)
    assert [comparable(r) for r in remote.rows] == [comparable(r) for r in local.rows]


def test_a_run_killed_mid_run_is_a_failed_row_and_the_others_finish(factories, tmp_path):
    pid_file = factories.parent / "pid"
    pid_file.unlink(missing_ok=True)

    def kill_when_started():
        for _ in range(600):
            if pid_file.exists() and pid_file.read_text():
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
                return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_when_started)
    killer.start()
    res = sweep(
        [f"{factories}:killed_by_test", "sample:teach_batch_relu", f"{factories}:kills_itself"],
        [DEFAULT_CONFIG],
        FAST,
        tmp_path / "s",
        workers=2,
        progress=False,
    )
    killer.join()
    killed, ok, itself = res.rows
    assert killed["status"] == "failed" and "killed by SIGKILL" in killed["error"]
    assert itself["status"] == "failed" and "killed by SIGKILL" in itself["error"]
    assert ok["status"] == "ok"
    assert len(Results(tmp_path / "s").rows()) == 3


def test_time_and_memory_limits_fail_only_their_run(factories, tmp_path):
    opts = SweepOptions(reports=False, time_limit_s=20, memory_limit_bytes=4 << 30)
    t0 = time.monotonic()
    res = sweep(
        [f"{factories}:sleeps", f"{factories}:hog", f"{factories}:raises", "sample:teach_batch_tanh"],
        [DEFAULT_CONFIG],
        opts,
        tmp_path / "s",
        workers=2,
        progress=False,
    )
    assert time.monotonic() - t0 < 55  # the 60 s sleeper was stopped at its limit
    sleeps, hog, raises, ok = res.rows
    assert sleeps["status"] == "failed" and "time limit of 20 s" in sleeps["error"]
    assert hog["status"] == "failed" and hog["error"].startswith("memory limit (4 GiB) reached")
    assert raises["status"] == "error" and "this factory raises" in raises["error"]
    assert ok["status"] == "ok"
    retried = sweep([f"{factories}:raises"], [DEFAULT_CONFIG], opts, tmp_path / "s", retry_failed=True, progress=False)
    assert retried.skipped == 0 and len((tmp_path / "s" / "results.jsonl").read_text().splitlines()) == 5


def test_reports_upstream_and_bench_fill_their_fields(tmp_path):
    opts = SweepOptions(observe_upstream=True, bench=True, bench_repeats=2, verify="step", time_limit_s=300)
    (row,) = sweep(
        ["sample:recsys_towers"], [DEFAULT_CONFIG], opts, tmp_path / "s", progress=False, on_rows=write_summary
    ).rows
    assert row["status"] == "ok", row["error"]
    assert (tmp_path / "s" / row["report"]).read_text().lstrip().lower().startswith("<!doctype html")
    up = row["upstream"]
    assert up["steps"] > 0 and up["defects"] == 0 and (tmp_path / "s" / row["upstream_trace"]).is_file()
    assert set(row["latency"]) >= {"baseline_ms", "ours_ms", "speedup", "ours_vs_upstream"}
    assert f'href="{row["report"]}"' in (tmp_path / "s" / "summary.html").read_text()


def test_a_failing_graph_names_its_first_failing_step(tmp_path):
    pf = tmp_path / "wrong.py"
    pf.write_text(
        "import torch\n\n\ndef pattern(x):\n    return torch.relu(x)\n\n\n"
        "def replacement(x):\n    return torch.sigmoid(x)\n"
    )
    cfg = SweepConfig("wrong", passes=("wrong",), pattern_files=(str(pf),))
    for verify in ("end", "step"):
        (row,) = sweep(
            ["sample:teach_batch_relu"],
            [cfg],
            SweepOptions(reports=False, verify=verify),
            tmp_path / verify,
            progress=False,
        ).rows
        assert row["status"] == "verify_failed", row["error"]
        assert row["first_failing"]["index"] == 1 and row["first_failing"]["pass"] == "wrong"


def test_specs_expand_and_bad_input_is_refused(tmp_path):
    from optimus_lens.frontend.hf import hf_list
    from optimus_lens.frontend.run import sample_list

    mf = tmp_path / "models.txt"
    mf.write_text("# models\nsample:recsys_towers  # twice, kept once\n\nhf:*\n")
    specs = expand_specs(["sample:*", "sample:recsys_towers"], str(mf))
    assert specs[: len(sample_list())] == [f"sample:{n}" for n, _, _ in sample_list()]
    assert len(specs) == len(sample_list()) + len(hf_list())
    for bad, msg in ((["sample:nope"], "unknown sample"), (["hf:bert?layers=x"], "not an integer"), ([], "no model")):
        with pytest.raises(SweepError, match=msg):
            expand_specs(bad)
    cf = tmp_path / "c.json"
    for text, msg in (
        ('[{"name": "a", "pases": []}]', "unknown key"),
        ('[{"name": "a"}, {"name": "a"}]', "unique"),
        ('{"name": "a"}', "non-empty JSON list"),
        ("[", "cannot read"),
    ):
        cf.write_text(text)
        with pytest.raises(SweepError, match=msg):
            load_configs(cf)


def test_cli_exit_status_bad_input_2_a_failed_run_1(factories, tmp_path, capsys):
    cf = tmp_path / "c.json"
    cf.write_text('[{"name": "x", "skip": ["no_such_pass"]}]')
    assert cli.main(["sweep", "sample:teach_batch_relu", "--configs", str(cf), "--out", str(tmp_path / "a")]) == 2
    assert "unknown pass(es) no_such_pass" in capsys.readouterr().err
    out = str(tmp_path / "b")
    assert (
        cli.main(
            ["sweep", "sample:teach_batch_relu", f"{factories}:kills_itself", "--out", out, "--no-reports", "--quiet"]
        )
        == 1
    )
    text = capsys.readouterr().out
    assert "1 ok, 1 not ok" in text and "failed" in text and "kills_itself" in text
    assert cli.main(["sweep", "sample:teach_batch_relu", "--out", out, "--quiet"]) == 0
    assert "(1 already done, skipped)" in capsys.readouterr().out


def test_a_wheel_reaches_ray_workers_as_its_package_folders(tmp_path):
    import zipfile

    from optimus_lens.sweep.executors import ray_runtime_env

    whl = tmp_path / "optimus_lens-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("optimus_lens/__init__.py", "")
        z.writestr("optimus_lens/viz/__init__.py", "")
        z.writestr("optimus_lens-0.1.0.dist-info/METADATA", "Name: optimus-lens\n")
    (mod,) = ray_runtime_env(str(whl))["py_modules"]
    assert Path(mod).name == "optimus_lens" and (Path(mod) / "viz" / "__init__.py").is_file()
    with pytest.raises(SweepError, match="cannot unpack wheel"):
        ray_runtime_env(str(tmp_path / "missing.whl"))
    here = ray_runtime_env()["py_modules"]
    assert [Path(p).name for p in here] == ["optimus_lens"]  # the one package, viz and samples inside


def test_a_run_reports_when_the_callers_main_is_a_script_that_cannot_run_again(tmp_path, monkeypatch):
    """Streamlit's script runner and AppTest leave ``__main__`` a script that raises when
    re-run; multiprocessing would re-run it in every child, so the child died before
    reporting. Children start without it (``sweep.isolate._without_main``)."""
    import sys
    import types

    script = tmp_path / "app_script.py"
    script.write_text("raise SystemExit('re-running the caller script')\n")
    fake = types.ModuleType("__main__")
    fake.__file__ = str(script)
    monkeypatch.setitem(sys.modules, "__main__", fake)
    res = sweep(["sample:teach_batch_relu"], [DEFAULT_CONFIG], FAST, tmp_path / "sw", workers=1, progress=False)
    assert [r["status"] for r in res.rows] == ["ok"], res.rows
