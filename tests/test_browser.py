"""The app in a real browser: headless chromium (Debian's, driven by playwright) runs the
default model and shows a step whose pattern sites are highlighted in the graph, with the
before and after panes aligned (same node, same place, same zoom; pan/zoom moves both)
and the graphs starting above the fold at 1280x800."""

import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from optimus_lens.viz.palette import STANDARD

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
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamlit",
            "run",
            str(ROOT / "app" / "main.py"),
            "--server.headless",
            "true",
            "--server.port",
            str(port),
            "--server.address",
            "127.0.0.1",
            "--browser.gatherUsageStats",
            "false",
        ],
        stdout=open(tmp_path / "app.log", "w"),
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
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
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.goto(app_url, timeout=90_000)
        page.get_by_role("button", name="Run", exact=True).click(timeout=90_000)
        page.get_by_text("Step 1:", exact=False).first.wait_for(timeout=180_000)
        page.get_by_role("button", name="Next").click()
        page.get_by_text("Step 2:", exact=False).first.wait_for(timeout=60_000)
        # the before/after graphs are SVGs inside the viewer iframes; sites carry a group colour
        deadline = time.time() + 60
        fills = set()
        while time.time() < deadline and not fills & set(STANDARD.groups):
            for frame in page.frames:
                try:
                    fills |= set(
                        frame.eval_on_selector_all(
                            "svg polygon, svg path", "els => els.map(e => e.getAttribute('fill'))"
                        )
                    )
                except Exception:  # noqa: BLE001 - a frame may be detached mid-rerun; retried
                    pass
            page.wait_for_timeout(500)
        page.screenshot(path=str(tmp_path / "step2.png"), full_page=True)
        assert not page.locator('[data-testid="stException"]').count(), page.locator(
            '[data-testid="stException"]'
        ).first.inner_text()
        browser.close()
    assert fills & set(STANDARD.groups), (
        f"no highlighted site in the rendered graphs (fills seen: {sorted(f for f in fills if f)[:12]})"
    )


_PANE_GEOMETRY = """root => {
  const panes = Array.from(root.querySelectorAll('.pane'));
  return panes.map(p => {
    const svg = p.querySelector('svg'), r = svg.getBoundingClientRect(), out = {};
    svg.querySelectorAll('g.node').forEach(g => {
      const t = g.querySelector('title'), b = g.getBoundingClientRect();
      if (t && b.width > 0) out[t.textContent] = [b.left - r.left, b.top - r.top, b.width, b.height];
    });
    return {viewBox: svg.getAttribute('viewBox'), nodes: out};
  });
}"""


def _viewer(page, deadline_s: float = 60):
    """The step viewer's root (``.lens``, inside the clickable view component's shadow
    root: playwright's locators pierce it, document.querySelector does not)."""
    lens = page.locator(".lens").first
    end = time.time() + deadline_s
    while time.time() < end:
        try:
            if lens.locator(".pane svg g.node").count() > 0:
                return lens
        except Exception:  # noqa: BLE001 - the page may rerun meanwhile; retried
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
        lens = _viewer(page)
        before, after = lens.evaluate(_PANE_GEOMETRY)
        shared = set(before["nodes"]) & set(after["nodes"])
        assert len(shared) >= 10
        for name in shared:  # same place within its pane, same size: same coordinates and zoom
            assert before["nodes"][name] == pytest.approx(after["nodes"][name], abs=1.0), name
        lens.locator(".pane").first.hover()
        page.mouse.wheel(0, 300)
        lens.locator(".pane").first.dispatch_event("wheel", {"deltaY": 200, "clientX": 100, "clientY": 100})
        page.wait_for_timeout(300)
        zoomed = lens.evaluate(_PANE_GEOMETRY)
        assert zoomed[0]["viewBox"] == zoomed[1]["viewBox"] != before["viewBox"]  # the other pane followed
        top = lens.bounding_box()["y"] + page.evaluate("window.scrollY")
        page.evaluate("window.scrollTo(0, 0)")
        page.screenshot(path=str(tmp_path / "aligned.png"))
        browser.close()
    assert top < 600, f"the step's graphs start {top:.0f} px down a 800 px window"


def _visible_node(lens, pane: int, prefix: str):
    """(name, x, y): the page position of the centre of a node of pane ``pane`` whose
    name starts with ``prefix`` and that lies wholly inside the pane's drawing."""
    found = lens.evaluate(
        """(root, [pane, prefix]) => {
      const p = root.querySelectorAll('.pane')[pane], svg = p.querySelector('svg'), r = svg.getBoundingClientRect();
      for (const g of svg.querySelectorAll('g.node')) {
        const t = g.querySelector('title'), b = g.getBoundingClientRect();
        if (t && t.textContent.startsWith(prefix) && b.width > 0 && b.left >= r.left && b.right <= r.right
            && b.top >= r.top && b.bottom <= r.bottom && b.bottom <= window.innerHeight)
          return [t.textContent, b.left + b.width / 2, b.top + b.height / 2];
      }
      return null;
    }""",
        [pane, prefix],
    )
    assert found, f"no node named {prefix}* wholly visible in pane {pane}"
    return found


def test_clicking_a_node_in_the_step_viewer_selects_it_in_the_inspector_at_1280x800(app_url, tmp_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(app_url, timeout=90_000)
        page.get_by_role("button", name="Run", exact=True).click(timeout=90_000)
        page.get_by_text("Step 1:", exact=False).first.wait_for(timeout=180_000)
        page.wait_for_timeout(1500)
        lens = _viewer(page)
        page.evaluate("window.scrollTo(0, 0)")
        lens.scroll_into_view_if_needed()
        name, x, y = _visible_node(lens, 1, "piece")  # a node of the after pane, on screen
        box = lens.evaluate("root => root.querySelector('.pane svg').getAttribute('viewBox')")
        page.mouse.click(x, y)
        panel = page.locator(".st-key-inspector_panel")
        panel.get_by_text(f"{name} = ", exact=False).first.wait_for(timeout=60_000)
        panel.get_by_text("Provenance").first.wait_for(timeout=60_000)
        text = panel.inner_text()
        assert "graph after step 1" in text and "Provenance" in text
        assert lens.locator(".lens-picked").count() == 2  # outlined in both panes
        assert f"Selected: {name} = getitem" in lens.locator(".picked").inner_text()
        # the click selected, it did not remount the viewer: the zoom is where it was
        assert lens.evaluate("root => root.querySelector('.pane svg').getAttribute('viewBox')") == box
        page.screenshot(path=str(tmp_path / "clicked.png"))
        browser.close()
