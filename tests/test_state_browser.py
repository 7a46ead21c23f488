"""The app keeps what you set, in chromium at 1280x800 (headless, Debian's chromium driven by
playwright): a new user's walk — default model, their own factory, Teach, back, Run — runs
their model; the Pattern Lab walk with an uploaded file shows the file in the editor with its
name and previews exactly it on the user's model. Screenshots of each stage are written to the
test's tmp_path (``OPTIMUS_LENS_SHOTS=DIR`` keeps them in DIR)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from test_browser import CHROMIUM, app_url  # noqa: F401 - the app in a subprocess, as a fixture
from test_lab import DOUBLE_RELU, RELUS

pytestmark = pytest.mark.browser

FIVE_RELUS = """import torch


class FiveRelus(torch.nn.Module):
    def forward(self, a, b, c, d, e):
        return torch.cat([torch.relu(t) for t in (a, b, c, d, e)], dim=1)


def five_relus():
    return FiveRelus(), tuple(torch.randn(4, 8) for _ in range(5))
"""


def _settle(page, timeout_s: float = 240) -> None:
    """Until no script run is in progress and the main area stops changing."""
    page.wait_for_timeout(500)
    end, last, quiet = time.time() + timeout_s, None, 0
    while time.time() < end:
        running = page.locator('[data-testid="stStatusWidget"]').count() > 0
        try:
            text = page.locator('[data-testid="stMain"]').inner_text(timeout=2000)
        except Exception:  # noqa: BLE001 - mid-rerun
            text = None
        quiet = quiet + 1 if (not running and text and text == last) else 0
        if quiet >= 3:
            break
        last = text
        page.wait_for_timeout(400)
    err = page.locator('[data-testid="stException"]')
    assert not err.count(), err.first.inner_text()


def _shot(page, tmp_path: Path, name: str) -> None:
    out = Path(os.environ.get("OPTIMUS_LENS_SHOTS", tmp_path))
    out.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(out / f"{name}.png"), full_page=False)


def _browser(p):
    return p.chromium.launch(
        executable_path=CHROMIUM,
        args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync"],
    )


def _sidebar_text(page) -> str:
    return page.locator('[data-testid="stSidebar"]').inner_text(timeout=10_000)


def _page(page, title: str) -> None:
    page.locator('[data-testid="stSidebarNav"]').get_by_text(title, exact=True).click()
    _settle(page)


def test_a_new_users_walk_through_teach_and_back_runs_their_own_model(app_url, tmp_path):  # noqa: F811
    assert CHROMIUM, "chromium is not installed: run scripts/setup.sh --browser"
    from playwright.sync_api import sync_playwright

    (tmp_path / "mine.py").write_text(FIVE_RELUS)
    spec = f"{tmp_path / 'mine.py'}:five_relus"
    with sync_playwright() as p:
        browser = _browser(p)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(app_url, timeout=90_000)
        _settle(page)
        assert "Runs sample:recsys_towers" in _sidebar_text(page)
        side = page.locator('[data-testid="stSidebar"]')
        side.get_by_text("Python factory", exact=True).click()
        _settle(page)
        side.get_by_role("textbox", name="Factory").fill(spec)
        side.get_by_role("textbox", name="Factory").press("Enter")
        _settle(page)
        assert f"Runs {spec}" in _sidebar_text(page)
        _shot(page, tmp_path, "walk1-own-factory")
        _page(page, "Teach")
        page.get_by_text("what it looks for", exact=False).first.wait_for(timeout=240_000)
        _shot(page, tmp_path, "walk2-teach")
        _page(page, "Step viewer")
        assert side.get_by_role("textbox", name="Factory").input_value() == spec  # kept across the page switch
        assert f"Runs {spec}" in _sidebar_text(page)
        _shot(page, tmp_path, "walk3-back")
        side.get_by_role("button", name="Run", exact=True).click()
        page.get_by_text("Step 1:", exact=False).first.wait_for(timeout=240_000)
        _settle(page)
        main = page.locator('[data-testid="stMain"]').inner_text()
        assert f"run of {spec}" in main and "batch_relu" in main and "recsys_towers" not in main
        _shot(page, tmp_path, "walk4-ran-own-model")
        browser.close()


def _editor_text(page) -> str:
    """The Ace editor's text, read inside the component's frame."""
    for frame in page.frames:
        try:
            if frame.locator(".ace_editor").count():
                return frame.evaluate("() => ace.edit(document.querySelector('.ace_editor')).getValue()")
        except Exception:  # noqa: BLE001 - a frame may be detached mid-rerun
            continue
    return ""


def test_the_lab_walk_with_an_uploaded_file_previews_what_the_editor_shows(app_url, tmp_path):  # noqa: F811
    assert CHROMIUM, "chromium is not installed: run scripts/setup.sh --browser"
    from playwright.sync_api import sync_playwright

    (tmp_path / "relus.py").write_text(RELUS)
    (tmp_path / "double_relu.py").write_text(DOUBLE_RELU)
    spec = f"{tmp_path / 'relus.py'}:build"
    with sync_playwright() as p:
        browser = _browser(p)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(app_url, timeout=90_000)
        _settle(page)
        _page(page, "Pattern Lab")
        main = page.locator('[data-testid="stMain"]')
        main.get_by_role("textbox", name="Model", exact=True).fill(spec)
        main.get_by_role("textbox", name="Model", exact=True).press("Enter")
        _settle(page)
        main.get_by_role("button", name="Load .py", exact=True).click()  # the uploader lives in a popover
        page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(tmp_path / "double_relu.py"))
        page.get_by_text("loaded from double_relu.py", exact=False).first.wait_for(timeout=60_000)
        page.keyboard.press("Escape")
        _settle(page)
        deadline = time.time() + 30
        while time.time() < deadline and _editor_text(page) != DOUBLE_RELU:
            page.wait_for_timeout(500)
        assert _editor_text(page) == DOUBLE_RELU  # the editor shows the file
        assert main.get_by_role("textbox", name="Pattern name").input_value() == "double_relu"  # and its name
        _shot(page, tmp_path, "lab1-loaded")
        main.get_by_role("button", name="Preview", exact=True).click()
        page.get_by_text("5 match(es)", exact=False).first.wait_for(timeout=240_000)
        _settle(page)
        _shot(page, tmp_path, "lab2-preview")
        main.get_by_role("button", name="Apply as a pass", exact=True).click()
        page.get_by_text("5 step(s)", exact=False).first.wait_for(timeout=240_000)
        _settle(page)
        main.get_by_role("button", name="Open in the step viewer", exact=True).click()
        page.get_by_text("Step 1:", exact=False).first.wait_for(timeout=120_000)
        _settle(page)
        sidebar = _sidebar_text(page)
        assert f"Runs {spec} — 1 pass (the last: your pattern double_relu" in sidebar  # the model and the pattern
        assert page.locator('[data-testid="stSidebar"]').get_by_role("textbox", name="Factory").input_value() == spec
        _shot(page, tmp_path, "lab3-in-the-viewer")
        browser.close()
