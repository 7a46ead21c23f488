"""The app in a real browser: headless chromium (Debian's, driven by playwright) runs the
default model and shows a step whose pattern sites are highlighted in the graph."""
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from viz.graph import GROUP_COLOURS

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = pytest.mark.browser


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def app_url(tmp_path):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(ROOT / "app" / "main.py"),
                             "--server.headless", "true", "--server.port", str(port),
                             "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false"],
                            stdout=open(tmp_path / "app.log", "w"), stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        else:
            raise AssertionError("the app did not answer its health check:\n" + (tmp_path / "app.log").read_text())
        yield f"http://127.0.0.1:{port}/"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_run_in_chromium_shows_a_step_with_its_sites_highlighted(app_url, tmp_path):
    assert CHROMIUM, "chromium is not installed: run scripts/setup.sh --browser (make test does)"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.goto(app_url, timeout=90_000)
        page.get_by_role("button", name="Run", exact=True).click(timeout=90_000)
        page.get_by_text("Step 1:", exact=False).first.wait_for(timeout=180_000)
        page.get_by_role("button", name="Next").click()
        page.get_by_text("Step 2:", exact=False).first.wait_for(timeout=60_000)
        # the before/after graphs are SVGs inside the viewer iframes; sites carry a group colour
        deadline = time.time() + 60
        fills = set()
        while time.time() < deadline and not fills & set(GROUP_COLOURS):
            for frame in page.frames:
                try:
                    fills |= set(frame.eval_on_selector_all("svg polygon, svg path", "els => els.map(e => e.getAttribute('fill'))"))
                except Exception:  # noqa: BLE001 - a frame may be detached mid-rerun; retried
                    pass
            page.wait_for_timeout(500)
        page.screenshot(path=str(tmp_path / "step2.png"), full_page=True)
        assert not page.locator('[data-testid="stException"]').count(), page.locator('[data-testid="stException"]').first.inner_text()
        browser.close()
    assert fills & set(GROUP_COLOURS), f"no highlighted site in the rendered graphs (fills seen: {sorted(f for f in fills if f)[:12]})"
