"""scripts/gpu_check.sh: its CPU-checkable parts (usage, the no-CUDA refusal, a CPU dry run of the plumbing)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu_check.sh"


def _run(args, **env):
    e = {**os.environ, "PYTHON": sys.executable, **env}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=e, timeout=300)


def test_usage_error_exits_2():
    r = _run([])
    assert r.returncode == 2 and "usage" in r.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_refuses_to_run_without_cuda(tmp_path):
    r = _run([str(tmp_path)], GPU_CHECK_TESTS="0")
    assert r.returncode == 2 and "no CUDA device" in r.stderr


def test_cpu_dry_run_writes_env_bench_json_and_summary(tmp_path):
    r = _run(
        [str(tmp_path / "out")],
        GPU_CHECK_DEVICE="cpu",
        GPU_CHECK_MODELS="sample:teach_batch_linear",
        GPU_CHECK_REPEATS="2",
        GPU_CHECK_COMPILE="0",
        GPU_CHECK_TESTS="0",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    out = tmp_path / "out"
    assert json.loads((out / "env.json").read_text())["device"] == "cpu"
    for mode in ("inference", "training"):
        d = json.loads((out / f"bench_teach_batch_linear_{mode}.json").read_text())
        assert d["mode"] == mode and [s["name"] for s in d["stages"]][-1] == "upstream"
    summary = (out / "summary.txt").read_text().splitlines()
    assert len(summary) == 2 and all("ours_vs_upstream" in line.replace(" ", "_") for line in summary)
