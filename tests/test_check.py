"""``optimus check MODEL --expect ...`` and the pytest helpers of ``optimus_lens.testing``:
counts of steps per pattern compared with expectations, one line per failure, exit
0 / 1 / 2, JUnit XML, and a run that fires but breaks the model failing the check."""

from __future__ import annotations

import json
import textwrap
from xml.etree import ElementTree as ET

import pytest

from optimus_lens.cli import main
from optimus_lens.core.trace import GraphSnapshot, Step, Trace, VerifyResult
from optimus_lens.debug.expect import ExpectationError, check_trace, junit_xml, parse_expectation
from optimus_lens.frontend.patternfile import load_pattern_file, pipeline_with
from optimus_lens.testing import assert_fires, assert_verified

MODEL = "sample:teach_batch_linear"  # 6 Linear(16, 16) on 6 split pieces: one batch_linear step

#: a wrong rewrite: x * sigmoid(x) "is" relu(x) — it matches swish_mlp and breaks it
WRONG = textwrap.dedent(
    """
    import torch

    def pattern(x):
        return x * torch.sigmoid(x)

    def replacement(x):
        return torch.relu(x)
    """
)


def _trace(*steps: tuple[str, str, bool | None]) -> Trace:
    t = Trace(model="m", initial_graph=GraphSnapshot(), passes=[{"name": "p", "patterns": ["a", "b"]}])
    for i, (pass_name, pattern, ok) in enumerate(steps, 1):
        t.steps.append(
            Step(
                i,
                pass_name,
                pattern,
                [f"n{i}"],
                [],
                [],
                {},
                None,
                0.0,
                0.0,
                1,
                VerifyResult(ok) if ok is not None else None,
            )
        )
    return t


def test_expectations_read_every_comparison_and_reject_the_rest():
    assert parse_expectation("batch_linear>=2").op == ">="
    assert parse_expectation(" remove_split_cat = 0 ").op == "=="
    assert [parse_expectation(f"a{op}1").holds(1) for op in (">=", "<=", "=", "==", "!=", ">", "<")] == [
        True,
        True,
        True,
        True,
        False,
        False,
        False,
    ]
    for bad in ("batch_linear", "batch_linear>=x", ">=2", "a>=-1"):
        with pytest.raises(ExpectationError, match="cannot read expectation"):
            parse_expectation(bad)


def test_a_check_counts_patterns_then_passes_and_refuses_unknown_names():
    t = _trace(("p", "a", True), ("p", "a", True), ("p", "b", None))
    r = check_trace(t, [parse_expectation("a=2"), parse_expectation("b>=2"), parse_expectation("p=3")])
    assert [(o.count, o.ok, o.counted) for o in r.outcomes] == [
        (2, True, "pattern"),
        (1, False, "pattern"),
        (3, True, "pass"),
    ]
    assert r.failure_lines() == ["b>=2 failed: b made 1 step(s) (steps 3)"]
    with pytest.raises(ExpectationError, match=r"did you mean a\b|is no pattern or pass"):
        check_trace(t, [parse_expectation("aa=0")])


def test_a_step_that_fails_verification_fails_the_check_and_the_junit_case():
    t = _trace(("p", "a", True), ("p", "a", False))
    t.steps[1].verify = VerifyResult(False, 0.5, checked="outputs", message="outputs differ by 0.5")
    r = check_trace(t, [parse_expectation("a=2")], verify="step")
    assert r.outcomes[0].ok and not r.ok
    assert r.failure_lines() == ["step 2 (a) fails verification: outputs differ by 0.5"]
    suite = ET.fromstring(junit_xml(r).split("\n", 1)[1])
    assert suite.get("tests") == "2" and suite.get("failures") == "1"
    failed = [c for c in suite if c.find("failure") is not None]
    assert [c.get("name") for c in failed] == ["verify (step)"]


def test_the_command_exits_0_when_every_expectation_holds(capsys, tmp_path):
    out = tmp_path / "check.json"
    assert (
        main(["check", MODEL, "--expect", "batch_linear=1", "--expect", "remove_split_cat=0", "--json", str(out)]) == 0
    )
    assert "ok   batch_linear=1" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["schema"] == {"name": "optimus.check", "version": 1} and doc["ok"] is True
    assert [e["count"] for e in doc["expectations"]] == [1, 0]


def test_the_command_exits_1_with_one_line_per_failed_expectation_and_writes_junit(capsys, tmp_path):
    xml = tmp_path / "check.xml"
    code = main(
        [
            "check",
            MODEL,
            "--expect",
            "batch_linear>=2",
            "--expect",
            "batch_relu>0",
            "--expect",
            "batch_linear=1",
            "--junit",
            str(xml),
        ]
    )
    assert code == 1
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("optimus check:")]
    assert err == [
        "optimus check: batch_linear>=2 failed: batch_linear made 1 step(s) (steps 2)",
        "optimus check: batch_relu>0 failed: batch_relu made 0 step(s)",
    ]
    suite = ET.parse(xml).getroot()
    assert (suite.get("tests"), suite.get("failures")) == ("4", "2")


def test_the_command_exits_2_for_bad_input(capsys):
    assert main(["check", MODEL, "--expect", "batch_linears=1"]) == 2
    assert "did you mean batch_linear" in capsys.readouterr().err
    assert main(["check", MODEL]) == 2
    assert main(["check", MODEL, "--expect", "batch_linear"]) == 2
    assert main(["check", "sample:nope", "--expect", "batch_linear=1"]) == 2


def test_the_command_checks_upstreams_passes_too(capsys):
    assert main(["check", MODEL, "--upstream", "--options", '{"batch_linear": {}}', "--expect", "batch_linear=1"]) == 0
    assert (
        main(
            [
                "check",
                MODEL,
                "--upstream",
                "--options",
                '{"batch_linear": {}}',
                "--expect",
                "PreGradBatchLinearFusion=0",
            ]
        )
        == 1
    )


def test_assert_fires_passes_and_fails_with_what_the_run_made():
    t = assert_fires(MODEL, None, "batch_linear", 1)
    assert t.steps
    assert_fires(MODEL, None, "batch_linear", ">=1")
    assert_fires(MODEL, None, "remove_split_cat", 0)
    with pytest.raises(
        AssertionError, match=r"batch_linear=2 failed: batch_linear made 1 step.*the run made: .*batch_linear x1"
    ):
        assert_fires(MODEL, None, "batch_linear", 2)


def test_assert_verified_fails_on_a_pattern_that_breaks_the_model(tmp_path):
    assert_verified(MODEL)
    wrong = tmp_path / "wrong.py"
    wrong.write_text(WRONG)
    pipe = pipeline_with(load_pattern_file(str(wrong)))
    with pytest.raises(AssertionError, match="fails verification"):
        assert_verified("sample:swish_mlp", pipeline=pipe)
    assert_fires("sample:swish_mlp", None, "wrong", ">=1", verify="off", pipeline=pipe)  # it does fire
