"""A sweep's summary.html in headless chromium: clicking a header sorts the runs, the box filters them."""

from __future__ import annotations

import shutil

import pytest

from optimus_lens.viz.sweep_summary import write_summary

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.browser


def _row(model: str, after: int | None, status: str = "ok") -> dict:
    return {
        "key": f"{model} @ default",
        "model": model,
        "config": "default",
        "status": status,
        "nodes_before": 200,
        "nodes_after": after,
        "steps": 3,
        "steps_per_pattern": {"batch_linear": 3},
        "trace": f"traces/{model}.json",
        "wall_s": 1.0,
    }


def test_clicking_a_header_sorts_numerically_and_the_filter_hides_rows(tmp_path):
    assert CHROMIUM, "chromium is not installed: run scripts/setup.sh --browser (make test does)"
    from playwright.sync_api import sync_playwright

    rows = [_row("sample:a", 30), _row("hf:bert", 5), _row("sample:c", 100), _row("sample:d", None, "error")]
    page_file = write_summary(tmp_path, rows)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page()
        page.goto(page_file.as_uri())
        models = lambda: page.eval_on_selector_all(  # noqa: E731
            "#runs tbody tr", "rs => rs.filter(r => r.style.display !== 'none').map(r => r.cells[0].textContent)"
        )
        page.click("th:text-is('nodes after')")
        # numbers sort as numbers (5 < 30 < 100, not "100" < "30"); an empty cell sorts last
        assert models() == ["hf:bert", "sample:a", "sample:c", "sample:d"]
        page.click("th:text-is('nodes after')")
        assert models() == ["sample:c", "sample:a", "hf:bert", "sample:d"]
        page.fill("#filter", "bert")
        assert models() == ["hf:bert"]
        browser.close()
