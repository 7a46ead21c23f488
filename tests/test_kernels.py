"""``optimus bench --kernels``: the kernels Inductor generates and the library (extern)
calls it makes for each stage, read from its output code."""

from __future__ import annotations

import json

import pytest
import torch

from optimus_lens.cli import main
from optimus_lens.perf.bench import bench_pipeline, make_call
from optimus_lens.perf.kernels import count_kernels, read_output_code

CODE = '''
cpp_fused_relu_0 = async_compile.cpp_pybinding(['const float*', 'float*'], r"""
extern "C" void kernel(const float* in_ptr0, float* out_ptr0) {}
""")
triton_poi_fused_add_1 = async_compile.triton('triton_poi_fused_add_1', """...""")
class Runner:
    def call(self, args):
        arg0_1, arg1_1 = args
        extern_kernels.addmm(arg1_1, arg0_1, arg0_1, alpha=1, beta=1, out=buf0)
        cpp_fused_relu_0(buf0, buf1)
        cpp_fused_relu_0(buf1, buf2)
        triton_poi_fused_add_1.run(buf2, buf3, 16, stream=stream0)
        buf4 = torch.ops.aten.index.Tensor(buf3, [arg1_1])
        buf5 = empty_strided_cpu((4, ), (1, ), torch.float32)
        return (buf4, )
runner = Runner(partitions=[])
'''


def test_the_output_code_gives_kernels_their_launches_and_the_extern_calls():
    k = read_output_code([CODE])
    assert k.kernels == ["cpp_fused_relu_0", "triton_poi_fused_add_1"] and k.launches == 3
    assert k.extern == {"extern_kernels.addmm": 1, "aten.index": 1} and k.extern_calls == 2


def test_inductor_generates_one_kernel_for_a_pointwise_chain_and_calls_mm():
    x, w = torch.randn(8, 16), torch.randn(16, 16)

    class M(torch.nn.Module):
        def forward(self, x, w):
            return torch.relu(x @ w) * 2 + 1

    k = count_kernels(make_call(torch.compile(M(), backend="inductor"), (x, w), "inference"))
    assert len(k.kernels) == 1 and k.launches == 1 and k.kernels[0].startswith("cpp_fused")
    assert k.extern == {"extern_kernels.mm": 1}


@pytest.fixture(scope="module")
def kernels_bench():
    return bench_pipeline("sample:teach_batch_linear", repeats=2, warmup=1, final_only=True, threads=1, kernels=True)


def test_bench_counts_kernels_per_stage_and_the_fusion_saves_extern_calls(kernels_bench):
    by = {s.stage: s.kernels for s in kernels_bench.stages}
    base, ours = by["baseline"], by["pipeline"]
    assert base["extern"] == {"extern_kernels.addmm": 6}  # six linears: six library calls
    assert ours["extern_calls"] < base["extern_calls"] and "extern_kernels.baddbmm" in ours["extern"]
    table = kernels_bench.table()
    assert "kernels+ext" in table and "baseline: " in table and "extern_kernels.addmm x6" in table
    assert kernels_bench.to_json()["stages"][0]["kernels"]["extern_calls"] == 6


def test_the_command_prints_and_writes_the_kernels(tmp_path, capsys):
    out = tmp_path / "b.json"
    code = main(
        [
            "bench",
            "sample:teach_batch_relu",
            "--kernels",
            "--final-only",
            "--repeats",
            "2",
            "--threads",
            "1",
            "--json",
            str(out),
        ]
    )
    assert code == 0 and "kernels+ext" in capsys.readouterr().out
    stages = json.loads(out.read_text())["stages"]
    assert all("kernels" in s and s["kernels"]["kernels"] >= 1 for s in stages)
