"""Pattern files: the three authoring forms load into patterns, preview where they match
without changing the graph, explain near misses through the match language, apply as a
pass with verified steps; bad files fail with the file's line."""

from __future__ import annotations

import operator
import textwrap

import pytest
import torch
import torch.nn as nn

from optimus_lens.core.pattern import why_not
from optimus_lens.core.pipeline import Pass, Pipeline
from optimus_lens.frontend.capture import capture
from optimus_lens.frontend.patternfile import PatternFileError, load_pattern_file, preview
from optimus_lens.frontend.run import optimize


class Swish(nn.Module):
    """Two x * sigmoid(x) sites, one sigmoid(x) * x (operands swapped) and one x * sigmoid(y)."""

    def forward(self, x, y):
        a = x * torch.sigmoid(x)
        t = a + 1
        b = t * torch.sigmoid(t)
        c = torch.sigmoid(b) * b
        d = x * torch.sigmoid(y)
        return a + b + c + d


SWISH_FUNCTIONS = '''
import torch
import torch.nn.functional as F

def pattern(x):
    """x * sigmoid(x) is SiLU."""
    return x * torch.sigmoid(x)

def replacement(x):
    return F.silu(x)
'''

SWISH_RULE = """
import operator
import torch
import torch.nn.functional as F
from optimus_lens.core.lang import Op, Rule, Var

PATTERNS = [Rule("swish_to_silu", Op(operator.mul, Var("x"), Op(torch.sigmoid, Var("x"))),
                 lambda rw, x: rw.call(F.silu, x), description="x * sigmoid(x) is SiLU")]
"""

RELU_BATCH = """
import torch
from optimus_lens.core.pattern import BatchPattern

class BatchSigmoidPreview(BatchPattern):
    name = "my_batch_sigmoid"
    description = "group sigmoids by shape"
    anchors = frozenset({torch.sigmoid})

    def key(self, node):
        v = node.meta.get("example_value")
        return None if v is None else tuple(v.shape)

    def fuse(self, rw, nodes):
        raise NotImplementedError

PATTERNS = [BatchSigmoidPreview]
"""


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def _inputs():
    return torch.randn(4, 8), torch.randn(4, 8)


@pytest.mark.parametrize("form", ["functions", "rule"])
def test_both_rewrite_forms_preview_the_same_sites_without_changing_the_graph(tmp_path, form):
    path = _write(tmp_path, "swish.py", SWISH_FUNCTIONS if form == "functions" else SWISH_RULE)
    pf = load_pattern_file(path)
    assert len(pf.patterns) == 1
    gm = capture(Swish(), _inputs()).gm
    before = str(gm.graph)
    found = preview(gm, pf.patterns)
    assert str(gm.graph) == before
    # a and b match; c has its operands swapped; d multiplies by sigmoid of another input
    assert len(found.matches) == 2
    assert all(any(s.startswith("sigmoid") for s in m.sites) for m in found.matches)
    assert {m.node for m in found.near_misses} == {"c", "d"}
    d = next(m for m in found.near_misses if m.node == "d")
    assert d.partial == ["d", "sigmoid_3"]  # the best partial match: root and the sigmoid of y


def test_functions_form_is_named_after_the_file_and_documented_by_the_pattern_docstring(tmp_path):
    pf = load_pattern_file(_write(tmp_path, "swish.py", SWISH_FUNCTIONS))
    p = pf.patterns[0]
    assert p.name == "swish" and p.description == "x * sigmoid(x) is SiLU."
    assert p.source.endswith("swish.py:5") and pf.pass_name == "swish"


def test_a_near_miss_names_the_sub_pattern_that_failed(tmp_path):
    pf = load_pattern_file(_write(tmp_path, "swish.py", SWISH_FUNCTIONS))
    gm = capture(Swish(), _inputs()).gm
    muls = [n for n in gm.graph.nodes if n.target is operator.mul]
    swapped, other_input = muls[2], muls[3]
    assert why_not(pf.patterns[0], swapped) == "c.b: b is call_function mul, not sigmoid"
    assert "x is l_y_ here but l_x_ before" in why_not(pf.patterns[0], other_input)


@pytest.mark.parametrize("form", ["functions", "rule"])
def test_applying_a_user_pattern_as_a_pass_records_verified_steps(tmp_path, form):
    pf = load_pattern_file(_write(tmp_path, "swish.py", SWISH_FUNCTIONS if form == "functions" else SWISH_RULE))
    pipe = Pipeline([Pass(pf.pass_name, pf.patterns)])
    r = optimize(Swish(), _inputs(), pipeline=pipe, verify="step")
    assert len(r.trace.steps) == 2
    assert all(s.verify.ok for s in r.trace.steps)
    silus = [n for n in r.engine.gm.graph.nodes if n.target is torch.nn.functional.silu]
    assert len(silus) == 2
    assert not any(n.target is torch.sigmoid and not n.users for n in r.engine.gm.graph.nodes)


def test_batch_pattern_class_form_previews_groups_of_same_key(tmp_path):
    pf = load_pattern_file(_write(tmp_path, "grp.py", RELU_BATCH))
    gm = capture(Swish(), _inputs()).gm
    (group,) = preview(gm, pf.patterns).matches
    assert group.pattern == "my_batch_sigmoid" and len(group.sites) == 4


def test_a_syntax_error_is_reported_with_its_line(tmp_path):
    with pytest.raises(PatternFileError) as e:
        load_pattern_file(_write(tmp_path, "bad.py", "import torch\n\ndef pattern(x)\n    return x\n"))
    assert e.value.line == 3 and "syntax error" in str(e.value)


def test_an_exception_while_the_file_runs_is_reported_with_its_line(tmp_path):
    with pytest.raises(PatternFileError) as e:
        load_pattern_file(_write(tmp_path, "boom.py", "x = 1\nraise RuntimeError('no')\n"))
    assert e.value.line == 2 and "RuntimeError: no" in str(e.value)


def test_a_file_without_patterns_says_what_it_needs(tmp_path):
    with pytest.raises(PatternFileError, match="neither `pattern` and `replacement`"):
        load_pattern_file(_write(tmp_path, "empty.py", "X = 1\n"))
    with pytest.raises(PatternFileError, match=r"PATTERNS\[0\] is int"):
        load_pattern_file(_write(tmp_path, "odd.py", "PATTERNS = [3]\n"))


def test_a_pattern_that_does_not_trace_names_the_function(tmp_path):
    src = "def pattern(x):\n    if x.sum() > 0:\n        return x\n    return -x\n\ndef replacement(x):\n    return x\n"
    with pytest.raises(PatternFileError, match="cannot trace pattern 'pattern'"):
        load_pattern_file(_write(tmp_path, "dyn.py", src))


def test_cli_match_previews_and_run_applies_a_pattern_file(tmp_path, capsys):
    from optimus_lens.cli import main

    path = _write(tmp_path, "swish.py", SWISH_FUNCTIONS)
    out = tmp_path / "m.json"
    assert main(["match", "sample:swish_mlp", "--pattern-file", str(path), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "swish" in text and "3 match(es), 1 near miss(es)" in text and "the graph is unchanged" in text
    import json

    assert len(json.loads(out.read_text())["matches"]) == 3
    assert main(["run", "sample:swish_mlp", "--pattern-file", str(path), "--passes", "swish", "--verify", "step"]) == 0
    assert "swish: 3" in capsys.readouterr().out


def test_cli_reports_a_broken_pattern_file_as_bad_input(tmp_path, capsys):
    from optimus_lens.cli import main

    path = _write(tmp_path, "bad.py", "def pattern(x)\n")
    assert main(["match", "sample:swish_mlp", "--pattern-file", str(path)]) == 2
    assert "bad.py:1: syntax error" in capsys.readouterr().err
