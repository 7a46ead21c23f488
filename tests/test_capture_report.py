"""Capture reports graph breaks as Dynamo does, never changes the caller's objects, and
turns every failure into a CaptureError (CLI exit status 2)."""

from __future__ import annotations

import torch
from torch import nn

from optimus_lens.frontend.capture import CaptureError, capture
from optimus_lens.frontend.run import optimize


class TwoExperts(nn.Module):
    """Mixtral-style routing written out: ``nonzero`` (a data-dependent shape) breaks the graph."""

    def __init__(self):
        super().__init__()
        self.router = nn.Linear(16, 2)
        self.e0, self.e1 = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x):
        r = self.router(x).argmax(-1)
        out = torch.zeros_like(x)
        i0 = torch.nonzero(r == 0).squeeze(-1)
        out[i0] = self.e0(x[i0])
        i1 = torch.nonzero(r == 1).squeeze(-1)
        out[i1] = self.e1(x[i1])
        return out


class LoopOverExperts(TwoExperts):
    def forward(self, x):
        r = self.router(x).argmax(-1)
        out = torch.zeros_like(x)
        for i, e in enumerate((self.e0, self.e1)):
            idx = torch.nonzero(r == i).squeeze(-1)
            out[idx] = e(x[idx])
        return out


def test_graph_breaks_are_counted_as_explain_counts_them_with_the_op_the_line_and_the_hint():
    torch.manual_seed(0)
    m, x = TwoExperts().eval(), torch.randn(32, 16)
    c = capture(m, (x,))
    ex = torch._dynamo.explain(m)(x)
    torch._dynamo.reset()
    assert c.dynamo_graphs == ex.graph_count and len(c.breaks) == ex.graph_break_count >= 2
    text = c.summary()
    assert "aten.nonzero" in text and "Hint:" in text and "test_capture_report.py:" in text
    assert f"{ex.graph_count} graph(s), {ex.graph_break_count} graph break(s)" in text


def test_a_frame_dynamo_runs_eagerly_is_reported_and_no_graph_is_a_capture_error():
    torch.manual_seed(0)
    try:
        capture(LoopOverExperts().eval(), (torch.randn(32, 16),))
    except CaptureError as e:
        assert "outside any graph" in str(e) and "aten.nonzero" in str(e)
    else:
        raise AssertionError("expected a CaptureError")


class Cached:
    """An input that caches a value derived from its tensor (as KeyedJaggedTensor.to_dict)."""

    def __init__(self, t):
        self.t = t
        self._doubled = None

    def doubled(self):
        if self._doubled is None:
            self._doubled = self.t * 2
        return self._doubled


class UsesCache(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, c):
        d = c.doubled()
        return self.a(d) + self.b(d)


def test_symbolic_capture_leaves_the_callers_inputs_as_they_were_and_the_run_verifies():
    c = Cached(torch.randn(3, 4))
    capture(UsesCache().eval(), (c,), method="symbolic")
    assert c._doubled is None
    res = optimize(UsesCache().eval(), (c,), capture_method="symbolic", verify="step")
    assert res.trace.final_verify.ok and c._doubled is None


def test_cli_capture_failure_is_exit_status_2(capsys, tmp_path, monkeypatch):
    from optimus_lens.cli import main

    (tmp_path / "loopy.py").write_text(
        "import torch\nfrom tests.test_capture_report import LoopOverExperts\n"
        "def build():\n    return LoopOverExperts().eval(), (torch.randn(8, 16),)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["run", "loopy:build"]) == 2
    assert "outside any graph" in capsys.readouterr().err


def test_cli_bench_times_the_graph_it_is_asked_for_and_says_which(capsys):
    import sys
    import types

    from optimus_lens.cli import main
    from tests.test_capture import Breaks  # two graphs, one graph break

    mod = types.ModuleType("breaks_model")
    mod.build = lambda: (Breaks().eval(), (torch.randn(2, 4),))
    sys.modules["breaks_model"] = mod
    try:
        assert main(["bench", "breaks_model:build", "--graph", "0", "--repeats", "3", "--passes", "batch_relu"]) == 0
        assert "graph timed: graph 0 (0-based)" in capsys.readouterr().out
        assert main(["bench", "breaks_model:build", "--graph", "7", "--repeats", "3"]) == 2
    finally:
        del sys.modules["breaks_model"]
