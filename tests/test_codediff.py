"""Code diff of a step (optimus/codediff.py, `optimus diff`): the GraphModule code before vs after,
sites and created nodes marked."""

import pytest

from optimus_lens.cli import main
from optimus_lens.debug.codediff import code_diff, diff_text, graph_code
from optimus_lens.frontend.run import optimize


@pytest.fixture(scope="module")
def towers():
    return optimize("sample:recsys_towers", verify="off").trace


def test_the_whole_diff_rebuilds_both_sides_exactly(towers):
    for step in towers.steps:
        lines = code_diff(towers, step.index, context=10_000)
        old = [d.text for d in lines if d.kind in ("context", "removed")]
        new = [d.text for d in lines if d.kind in ("context", "added")]
        assert old == graph_code(towers.before(step.index)).splitlines()
        assert new == graph_code(towers.after(step.index)).splitlines()


def test_site_lines_are_removed_and_created_lines_added_and_both_are_marked(towers):
    step = next(s for s in towers.steps if s.pattern == "batch_layernorm")
    lines = code_diff(towers, step.index)
    removed = {d.node for d in lines if d.kind == "removed" and d.site}
    added = {d.node for d in lines if d.kind == "added" and d.site}
    assert removed == set(step.sites)  # every fused layer_norm line goes
    assert added == set(step.created)  # every created node has its line
    assert not any(d.site for d in lines if d.node not in {*step.sites, *step.created})
    assert any("torch.nn.functional.layer_norm(stack" in d.text for d in lines if d.kind == "added")
    text = diff_text(lines, "step 4")
    assert text.startswith("--- before step 4\n+++ after step 4\n@@ -")
    assert any(row.startswith(">-    layer_norm = ") for row in text.splitlines())
    assert "= None" not in text  # FX's free-at-last-use trailers are dropped


def test_diff_cli_prints_a_marked_unified_diff_and_rejects_a_missing_step(tmp_path, capsys):
    trace = tmp_path / "t.json"
    assert main(["run", "sample:teach_batch_relu", "--trace", str(trace)]) == 0
    capsys.readouterr()
    assert main(["diff", str(trace), "--step", "1", "--color", "never"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("--- before step 1 (") and "\n@@ -" in out and "\n>+" in out and "\033[" not in out
    assert main(["diff", str(trace), "--step", "0"]) == 2
    assert "no step 0" in capsys.readouterr().err
