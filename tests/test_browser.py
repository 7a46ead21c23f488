"""The app in a real browser: headless chromium (Debian's, driven by playwright) runs the
default model and shows a step whose pattern sites are highlighted in the graph, with the
before and after panes aligned (same node, same place, same zoom; pan/zoom moves both)
and the graphs starting above the fold at 1280x800."""
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


_PANE_GEOMETRY = """() => {
  const panes = Array.from(document.querySelectorAll('.pane'));
  return panes.map(p => {
    const svg = p.querySelector('svg'), r = svg.getBoundingClientRect(), out = {};
    svg.querySelectorAll('g.node').forEach(g => {
      const t = g.querySelector('title'), b = g.getBoundingClientRect();
      if (t && b.width > 0) out[t.textContent] = [b.left - r.left, b.top - r.top, b.width, b.height];
    });
    return {viewBox: svg.getAttribute('viewBox'), nodes: out};
  });
}"""


def _viewer_frame(page, deadline_s: float = 60):
    end = time.time() + deadline_s
    while time.time() < end:
        for frame in page.frames:
            try:
                if frame.eval_on_selector_all(".pane svg g.node", "els => els.length") > 0:
                    return frame
            except Exception:  # noqa: BLE001 - a frame may be detached mid-rerun; retried
                pass
        page.wait_for_timeout(300)
    raise AssertionError("no viewer with drawn panes appeared")


def test_before_and_after_panes_line_up_and_move_together_at_1280x800(app_url, tmp_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(app_url, timeout=90_000)
        page.get_by_role("button", name="Run", exact=True).click(timeout=90_000)
        page.get_by_text("Step 1:", exact=False).first.wait_for(timeout=180_000)
        page.get_by_role("button", name="Next").click()
        page.get_by_text("Step 2:", exact=False).first.wait_for(timeout=60_000)
        page.wait_for_timeout(1500)
        frame = _viewer_frame(page)
        before, after = frame.evaluate(_PANE_GEOMETRY)
        shared = set(before["nodes"]) & set(after["nodes"])
        assert len(shared) >= 10
        for name in shared:  # same place within its pane, same size: same coordinates and zoom
            assert before["nodes"][name] == pytest.approx(after["nodes"][name], abs=1.0), name
        frame.locator(".pane").first.hover()
        page.mouse.wheel(0, 300)
        frame.locator(".pane").first.dispatch_event("wheel", {"deltaY": 200, "clientX": 100, "clientY": 100})
        page.wait_for_timeout(300)
        zoomed = frame.evaluate(_PANE_GEOMETRY)
        assert zoomed[0]["viewBox"] == zoomed[1]["viewBox"] != before["viewBox"]  # the other pane followed
        top = page.locator("iframe").first.bounding_box()["y"] + page.evaluate("window.scrollY")
        page.evaluate("window.scrollTo(0, 0)")
        page.screenshot(path=str(tmp_path / "aligned.png"))
        browser.close()
    assert top < 600, f"the step's graphs start {top:.0f} px down a 800 px window"
