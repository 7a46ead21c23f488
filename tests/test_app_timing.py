"""The app's timing panel (app/timing.py): only passes with steps plotted, spread as error bars, noise warning."""

import json

from streamlit.testing.v1 import AppTest

SCRIPT = """
from optimus_lens.perf.timings import BenchResult, StageTiming
from optimus_lens.app.timing import show_result

b = BenchResult("cpu", "wall-clock", [
    StageTiming("baseline", 10, 1.0, 0.9, 1.1, 5, kind="baseline"),
    StageTiming("batch_relu", 9, 0.8, 0.5, 3.0, 5, speedup=1.25, steps=2),
    StageTiming("reference", 5, 0.5, 0.45, 0.55, 5, speedup=2.0, kind="reference")],
    unchanged=["batch_tanh", "batch_sigmoid"], threads=1)
show_result(b)
"""


def test_timing_view_plots_only_stages_with_steps_with_spread_and_noise_warning():
    at = AppTest.from_string(SCRIPT).run(timeout=60)
    assert not at.exception
    assert any("noisy: p90 > 2x p10 for 1 of 3 stages (batch_relu)" in w.value for w in at.warning)
    assert any("batch_tanh, batch_sigmoid" in c.value for c in at.caption)
    assert any("1 thread" in i.value for i in at.info)
    assert [m.label for m in at.metric] == ["ours vs reference"]
    speed = json.loads(at.get("plotly_chart")[0].proto.spec)
    bar = speed["data"][0]
    assert bar["x"] == ["baseline", "batch_relu", "reference"]  # no bar for the passes without a step
    assert bar["error_y"]["array"][1] > 0 and bar["error_y"]["arrayminus"][1] > 0  # p10..p90 spread
    assert "no change (not timed): batch_tanh, batch_sigmoid" in speed["layout"]["title"]["text"]


def test_a_speedup_whose_spread_includes_one_is_drawn_within_noise_never_as_a_gain():
    from optimus_lens.perf.timings import BenchResult, StageTiming
    from optimus_lens.viz.figures import NOISE_FILL, speedup_figure, within_noise

    b = BenchResult(
        "cpu",
        "thread-cpu-time",
        [
            StageTiming("baseline", 10, 1.0, 0.9, 1.1, 20, kind="baseline"),
            StageTiming("batch_relu", 9, 0.8, 0.5, 3.0, 20, speedup=1.25, steps=2),  # 0.33x..2x: spans 1.0
            StageTiming("batch_tanh", 8, 0.5, 0.45, 0.55, 20, speedup=2.0, steps=1),  # 1.8x..2.2x: a gain
        ],
        threads=1,
    )
    assert [within_noise(1.0, s.median_ms, s.p10_ms, s.p90_ms) for s in b.stages[1:]] == [True, False]
    fig = speedup_figure(b)
    bar = fig.data[0]
    assert list(bar.text) == ["", "within noise", "2.00x"]
    assert bar.marker.color[1] == NOISE_FILL and bar.marker.pattern.shape[1] == "/"
    assert bar.marker.color[2] != NOISE_FILL and bar.marker.pattern.shape[2] == ""
    assert "within noise" in fig.layout.title.text
