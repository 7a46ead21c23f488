"""The `optimus` command: run prints the step table and writes a trace; bad input exits 2 with a message."""

import json
import subprocess
import sys
from pathlib import Path

from optimus_lens.cli import main
from optimus_lens.core.trace import Trace
from optimus_lens.passes import all_patterns

REPO = Path(__file__).resolve().parent.parent


def test_run_prints_the_step_table_and_writes_a_trace_that_loads(tmp_path, capsys):
    out = tmp_path / "t.json"
    assert main(["run", "sample:recsys_towers", "--verify", "step", "--trace", str(out)]) == 0
    text = capsys.readouterr().out
    assert "batch_linear" in text and "pattern" in text and "nodes: 108 ->" in text
    t = Trace.load(out)
    assert t.model == "recsys_towers" and len(t.steps) >= 2
    data = json.loads(out.read_text())
    for key in ("format_version", "model", "nodes_before", "nodes_after", "passes", "initial_graph", "steps"):
        assert key in data
    for key in ("index", "pass", "pattern", "sites", "created", "erased", "verify"):
        assert key in data["steps"][0]
    assert {"ok", "max_abs_err"} <= set(data["steps"][0]["verify"])


def test_run_on_the_bert_sample_works(capsys):
    assert main(["run", "sample:bert"]) == 0
    assert "nodes:" in capsys.readouterr().out


def test_unknown_model_and_unknown_pass_exit_2_with_a_message(capsys):
    assert main(["run", "sample:nope"]) == 2
    assert "unknown sample model" in capsys.readouterr().err
    assert main(["run", "sample:teach_batch_relu", "--passes", "batch_reluu"]) == 2
    assert "batch_reluu" in capsys.readouterr().err


def test_passes_lists_every_pattern_with_source_location(capsys):
    assert main(["passes"]) == 0
    text = capsys.readouterr().out
    for p in all_patterns():
        assert p.name in text and p.source in text


def test_show_reads_a_saved_trace_and_rejects_garbage(tmp_path, capsys):
    good = tmp_path / "t.json"
    main(["run", "sample:teach_batch_relu", "--trace", str(good)])
    capsys.readouterr()
    assert main(["show", str(good)]) == 0
    assert "batch_relu" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["show", str(bad)]) == 2
    assert "not JSON" in capsys.readouterr().err


def test_console_script_is_installed():
    # the `optimus` script pip wrote next to this interpreter, from pyproject's [project.scripts]
    script = Path(sys.executable).parent / "optimus"
    r = subprocess.run([str(script), "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "run" in r.stdout


def test_why_says_which_patterns_apply_at_a_node_and_why_the_others_do_not(capsys):
    assert main(["why", "sample:teach_batch_relu", "y1"]) == 0
    out = capsys.readouterr().out
    assert "batch_relu                      yes: fuses at step 2 with y0, y2, y3, y4, y5 (6 members)" in out
    assert "batch_layernorm                 no : not a layer_norm node" in out
    assert main(["why", "sample:recsys_towers", "linear_3"]) == 0  # each tower's linear reads its own piece
    assert (
        "batch_linear_lhs                no : 1 node(s) share its group key (no other); a group needs 2"
        in capsys.readouterr().out
    )
    assert main(["why", "sample:teach_batch_relu", "nope"]) == 2
    assert "no node 'nope'" in capsys.readouterr().err


def test_why_json_is_the_same_answer_as_the_text_and_alone_on_stdout(capsys, tmp_path):
    from optimus_lens.debug.why import WhyReport

    assert main(["why", "sample:teach_batch_relu", "y1"]) == 0
    text = capsys.readouterr().out
    assert main(["why", "sample:teach_batch_relu", "y1", "--json"]) == 0
    report = WhyReport.from_json(json.loads(capsys.readouterr().out))  # stdout holds the JSON and nothing else
    assert report.text().strip() == text.strip() and report.verdicts[0].pattern
    assert main(["why", "sample:teach_batch_relu", "y1", "--json", str(tmp_path / "why.json")]) == 0
    assert capsys.readouterr().out.strip() == text.strip()
    assert WhyReport.from_json(json.loads((tmp_path / "why.json").read_text())).to_json() == report.to_json()


def _listening_addresses(port: int) -> set[str]:
    """Local addresses with a socket in LISTEN state on ``port``, from /proc/net/tcp{,6}."""
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            addr, p = local.split(":")
            if state == "0A" and int(p, 16) == port:
                out.add(addr)
    return out


def test_app_listens_on_the_loopback_address_only_by_default(tmp_path):
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "optimus_lens", "app", "--headless", "--port", str(port)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not _listening_addresses(port):
            time.sleep(0.5)
        addrs = _listening_addresses(port)
        assert addrs == {"0100007F"}, f"listening on {addrs} (hex, /proc/net/tcp form), not only 127.0.0.1"
    finally:  # the streamlit server is a child of `optimus app`: stop the whole process group
        import os
        import signal

        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
