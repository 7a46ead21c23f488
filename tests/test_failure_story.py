"""One story per failure: ``Trace.failure_runs`` is the one source of which failing steps are
defects and which only inherit one, and the Compare panel, the upstream banner, the step list
(``steps_table``), the step details and ``optimus compare`` all say the same. The held-in input:
with upstream's default options, upstream's batch_layernorm (step 3) breaks the graph and its
split/cat step 4 fails the same way only because the graph is still broken."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest
from test_observe import HELD_IN

from optimus_lens.cli.text import steps_table
from optimus_lens.debug.compare import compare_model, comparison_text


@pytest.fixture(scope="module")
def held_in(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("held_in")
    (d / "held_in.py").write_text(HELD_IN)
    return f"{d / 'held_in.py'}:build"


@pytest.fixture(scope="module")
def comparison(held_in):
    return compare_model(held_in)  # upstream's default options: steps 3 and 4 fail


def test_the_comparison_counts_one_upstream_defect_and_the_step_that_inherits_it(comparison):
    """What ``optimus compare`` prints (``comparison_text``) and counts (exit 1 on a defect)."""
    c = comparison
    ((defect, inherited),) = c.upstream.failure_runs()
    assert [s.index for s in c.upstream_defects] == [defect.index] and defect.pattern == "BatchLayernormFusion"
    assert c.upstream_inherited == {s.index: defect.index for s in inherited} and inherited
    assert not c.ours_failed and not c.ours_inherited
    text = comparison_text(c)
    assert text.count("UPSTREAM DEFECT") == 1
    later = inherited[0].index
    assert f"step {later} fails the same way only because the graph is still broken from step {defect.index}" in text


def test_the_step_list_marks_the_inherited_failure_with_its_origin(comparison):
    t = comparison.upstream
    ((defect, inherited),) = t.failure_runs()
    rows = {int(r.split()[0]): r for r in steps_table(t).splitlines()[2:]}
    assert f"FAIL (from {defect.index})" in rows[inherited[0].index]
    assert "FAIL (from" not in rows[defect.index] and "FAIL" in rows[defect.index]


def _panels(c) -> AppTest:
    def script():
        import streamlit as st

        from optimus_lens.app.compare_view import show_comparison
        from optimus_lens.app.upstream import defects

        c = st.session_state["c"]
        with st.container(key="banner"):
            defects(c.upstream)
        with st.container(key="compare"):
            show_comparison(c)

    at = AppTest.from_function(script, default_timeout=60)
    at.session_state["c"] = c
    return at.run()


def test_compare_panel_and_banner_tell_the_same_story(comparison):
    c = comparison
    at = _panels(c)
    assert not at.exception, [e.value for e in at.exception]
    errors = [e.value for e in at.error]
    ((defect, inherited),) = c.upstream.failure_runs()
    later = inherited[0].index
    sentence = f"fails the same way only because the graph is still broken from step {defect.index}"
    assert len(errors) == 2  # one banner, one compare panel entry: the same one defect
    assert all(f"step {defect.index} (batch_layernorm / BatchLayernormFusion)" in e for e in errors)
    assert all(f"Step {later} {sentence}" in e for e in errors)
    only_up = at.dataframe[-1].value  # "Only in PyTorch Inductor"
    assert only_up[only_up["step"] == later].iloc[0]["verify"] == f"fails: inherits step {defect.index}"
