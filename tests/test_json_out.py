"""``--json [PATH]``: one versioned document per command, to a file or as the only thing on
stdout, each schema documented in docs/json.md."""

from __future__ import annotations

import json
import re
from pathlib import Path

from optimus_lens.cli import main
from optimus_lens.cli.jsonout import VERSIONS

MODEL = "sample:teach_batch_relu"


def _stdout_doc(capsys, argv: list[str]) -> tuple[int, dict, str]:
    code = main(argv)
    cap = capsys.readouterr()
    return code, json.loads(cap.out), cap.err  # fails unless stdout is the JSON alone


def test_run_json_on_stdout_is_the_only_stdout_and_the_table_goes_to_stderr(capsys):
    code, doc, err = _stdout_doc(capsys, ["run", MODEL, "--verify", "step", "--json"])
    assert code == 0 and doc["schema"] == {"name": "optimus.run", "version": 1}
    assert "pattern" in err and "verify (step)" in err
    assert doc["steps"] and all(s["verify"]["ok"] for s in doc["steps"])
    assert doc["passes"]["batch_relu"] == 1 and doc["exit_status"] == 0 and doc["failed_steps"] == []
    assert {"index", "pass", "pattern", "sites", "created", "erased", "verify", "rolled_back", "ms"} <= set(
        doc["steps"][0]
    )


def test_run_json_to_a_file_keeps_the_text_on_stdout(capsys, tmp_path):
    out = tmp_path / "run.json"
    assert main(["run", MODEL, "--json", str(out)]) == 0
    assert "nodes:" in capsys.readouterr().out
    assert json.loads(out.read_text())["schema"]["name"] == "optimus.run"


def test_the_catalogue_commands_write_their_lists(capsys):
    _, passes, _ = _stdout_doc(capsys, ["passes", "--json"])
    assert passes["schema"]["name"] == "optimus.passes"
    by_name = {p["name"]: p for p in passes["patterns"]}
    assert by_name["batch_linear"]["pass"] == "batch_linear" and by_name["batch_linear"]["preconditions"]
    _, samples, _ = _stdout_doc(capsys, ["samples", "--json"])
    assert {"spec": "sample:recsys_towers"}.items() <= samples["samples"][0].items() and samples["hf"]


def test_why_json_holds_every_verdict(capsys):
    _, doc, _ = _stdout_doc(capsys, ["why", "sample:teach_batch_linear", "linear_1", "--json"])
    assert doc["schema"]["name"] == "optimus.why" and doc["node"] == "linear_1"
    fires = [v for v in doc["verdicts"] if v["applies"]]
    assert [v["pattern"] for v in fires] == ["batch_linear"] and fires[0]["step"] is not None


def test_match_and_bench_json_paths_keep_working_and_gain_the_schema(tmp_path, capsys):
    pf = tmp_path / "relu.py"
    pf.write_text(
        "import torch\n\ndef pattern(x):\n    return torch.relu(x)\n\ndef replacement(x):\n    return x.clamp(min=0)\n"
    )
    out = tmp_path / "m.json"
    assert main(["match", MODEL, "--pattern-file", str(pf), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["schema"]["name"] == "optimus.match" and "matches" in doc and "near_misses" in doc
    b = tmp_path / "b.json"
    assert main(["bench", MODEL, "--repeats", "2", "--threads", "1", "--json", str(b)]) == 0
    doc = json.loads(b.read_text())
    assert doc["schema"]["name"] == "optimus.bench" and doc["stages"][0]["name"] == "baseline"


def test_sweep_json_holds_every_row(tmp_path, capsys):
    code, doc, _ = _stdout_doc(
        capsys, ["sweep", MODEL, "--out", str(tmp_path / "sw"), "--no-reports", "--quiet", "--json"]
    )
    assert code == 0 and doc["schema"]["name"] == "optimus.sweep"
    assert doc["status"] == {"ok": 1} and doc["rows"][0]["model"] == MODEL


def test_every_schema_is_documented_with_its_version():
    doc = (Path(__file__).resolve().parent.parent / "docs" / "json.md").read_text()
    for command, version in VERSIONS.items():
        assert re.search(rf"`optimus\.{command}`.*version {version}", doc), command


def test_a_command_that_fails_on_bad_input_still_writes_one_document_to_stdout(capsys):
    code, doc, err = _stdout_doc(capsys, ["why", MODEL, "no_such_node", "--json"])
    assert code == 2 and "no node 'no_such_node'" in err
    assert doc["schema"]["name"] == "optimus.why" and doc["error"]["kind"] == "bad-input"
    assert doc["error"]["exit_status"] == 2 and "no_such_node" in doc["error"]["message"]
