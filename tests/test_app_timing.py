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


TRAINING = """
from optimus_lens.perf.timings import BenchResult, StageTiming
from optimus_lens.app.timing import show_result

b = BenchResult("cpu", "thread-cpu-time", [
    StageTiming("baseline", 391, 2.8, 2.7, 2.9, 20, kind="baseline"),
    StageTiming("pipeline", 220, 1.5, 1.4, 1.6, 20, speedup=1.87, steps=40),
    StageTiming("packed", 22, 0.71, 0.69, 0.73, 20, speedup=3.94, steps=6, kind="prepack"),
    StageTiming("reference", 22, 0.70, 0.68, 0.72, 20, speedup=4.0, kind="reference")],
    mode="training", threads=1, bytes_packed=1081344)
show_result(b)
"""


def test_training_timing_shows_the_packed_stage_beside_the_hand_fused_reference():
    at = AppTest.from_string(TRAINING).run(timeout=60)
    assert not at.exception
    speed = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert speed["data"][0]["x"] == ["baseline", "pipeline", "packed", "reference"]
    assert any("Packed parameters (stage `packed`): 1,081,344 bytes" in c.value for c in at.caption)
    assert [m.label for m in at.metric] == ["ours vs reference"]
    assert at.metric[0].value == f"{0.70 / 0.71:.2f}x"  # ours is the packed stage
