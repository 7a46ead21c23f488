"""The step viewer in headless chromium: transitions between steps in the HTML report and
in the app (positions kept across the app's reruns), and presentation mode at 1280x800."""

from __future__ import annotations

import json
import time

import pytest
from test_browser import CHROMIUM, _viewer, app_url  # noqa: F401 - app_url is a fixture

from optimus_lens.frontend.run import optimize
from optimus_lens.viz.report import write_report

pytestmark = pytest.mark.browser
ARGS = ["--no-sandbox", "--disable-gpu"]


@pytest.fixture(scope="module")
def report_file(tmp_path_factory):
    trace = optimize("sample:recsys_towers", verify="off").trace
    path = tmp_path_factory.mktemp("report") / "report.html"
    write_report(trace, path)
    return path, trace


def _anim(page, selector: str = "section.step:not([hidden]) .viewer.pair .lens") -> list[dict]:
    page.wait_for_function(
        f"() => {{ const e = document.querySelector({json.dumps(selector)}); return e && e.dataset.anim; }}",
        timeout=20_000,
    )
    return json.loads(page.eval_on_selector(selector, "e => e.dataset.anim"))


def _titles(page, pane: int) -> list[str]:
    return page.eval_on_selector_all(
        f"section.step:not([hidden]) .viewer.pair .pane:nth-child({pane + 1}) svg g.graph > g.node > title",
        "ts => ts.map(t => t.textContent)",
    )


def _fits(page) -> list[dict]:
    """Each step's fit as the report records it on its before | after viewer (``data-fit``)."""
    return page.eval_on_selector_all(
        "section.step", "ss => ss.map(s => JSON.parse(s.querySelector('.viewer.pair').dataset.fit || '{}'))"
    )


def test_moving_to_the_next_step_animates_only_what_changed_and_keeps_node_ids(report_file):
    from playwright.sync_api import sync_playwright

    path, trace = report_file
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(path.as_uri())
        assert _anim(page)[0]["skipped"] == "first"
        fits = _fits(page)
        # step 2 is redrawn to fit on its own layout: the transition slides the nodes from where they were
        assert fits[0]["how"] == "as asked" and fits[1]["how"] != "as asked"
        page.keyboard.press("ArrowRight")
        page.wait_for_selector("#step-2:not([hidden]) .viewer.pair .pane svg")
        res = _anim(page, "#step-2 .viewer.pair .lens")
        assert all(r["skipped"] == "" for r in res) and res[0]["moved"] > 0
        # two steps in a row drawn as asked, on the trace's one layout
        k = next(
            i
            for i in range(2, len(fits))
            if fits[i - 1]["how"] == fits[i]["how"] == "as asked"
            and fits[i - 1]["arrangement"] == fits[i]["arrangement"]
        )
        for i in range(3, k + 1):
            page.keyboard.press("ArrowRight")
            page.wait_for_selector(f"#step-{i}:not([hidden]) .viewer.pair .pane svg")
        page.wait_for_timeout(400)
        after_k = set(_titles(page, 1))
        page.keyboard.press("ArrowRight")
        page.wait_for_selector(f"#step-{k + 1}:not([hidden]) .viewer.pair .pane svg")
        before_next = set(_titles(page, 0))
        res = _anim(page, f"#step-{k + 1} .viewer.pair .lens")
        step = trace.step(k + 1)
        # the after-pane of step k and the before-pane of step k+1 draw the same graph: same node ids
        assert after_k == before_next
        assert all(r["skipped"] == "" for r in res)
        assert res[0]["moved"] == 0  # one layout for the whole trace: nothing the step did not touch moves
        assert res[1]["created"] == len(set(step.created) & set(_titles(page, 1)))  # new nodes fade in
        assert res[1]["erased"] > 0  # the step's erased nodes fade out of the after pane
        page.wait_for_timeout(600)
        assert page.eval_on_selector_all(".lens-leaving", "els => els.length") == 0  # faded out, then removed
        browser.close()


def test_reduced_motion_skips_the_transition(report_file):
    from playwright.sync_api import sync_playwright

    path, _ = report_file
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 800}, reduced_motion="reduce")
        page.goto(path.as_uri())
        _anim(page)
        page.keyboard.press("ArrowRight")
        page.wait_for_selector("#step-2:not([hidden]) .viewer.pair .pane svg")
        assert {r["skipped"] for r in _anim(page, "#step-2 .viewer.pair .lens")} == {"reduced motion"}
        browser.close()


def test_the_app_viewer_animates_next_from_the_positions_of_the_step_before(app_url):  # noqa: F811
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(app_url, timeout=90_000)
        page.get_by_role("button", name="Run", exact=True).click(timeout=90_000)
        page.get_by_text("Step 1:", exact=False).first.wait_for(timeout=180_000)
        _viewer(page)
        page.get_by_role("button", name="Next").click()
        page.get_by_text("Step 2:", exact=False).first.wait_for(timeout=60_000)
        end, res = time.time() + 60, None
        while time.time() < end and not res:
            try:  # the viewer (in the click component's shadow root) is remounted for the new step
                text = page.locator(".lens").first.get_attribute("data-anim", timeout=2_000) or ""
            except Exception:  # noqa: BLE001 - the page may rerun meanwhile; retried
                text = ""
            if text and "first" not in text:
                res = json.loads(text)
            page.wait_for_timeout(300)
        browser.close()
    assert res and all(r["skipped"] == "" for r in res), res  # the drawing was replaced; sessionStorage kept step 1
    # step 2 is redrawn to fit (compactly, on its own layout): its nodes slide from where step 1 drew them
    assert res[1]["created"] > 0 and res[0]["moved"] > 0


_TEXT_PX = """lens => Array.from(lens.querySelectorAll('.pane svg g.graph > g.node text')).filter(t => {
  const r = t.getBoundingClientRect(); return r.width > 0 && r.bottom > 0 && r.top < window.innerHeight; })
  .map(t => parseFloat(t.getAttribute('font-size')) * t.getScreenCTM().a)"""


def test_presentation_mode_at_1280x800_graphs_fill_the_window_text_is_large_and_arrow_keys_step(app_url, tmp_path):  # noqa: F811
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(app_url, timeout=90_000)
        page.get_by_role("button", name="Run", exact=True).click(timeout=90_000)
        page.get_by_text("Step 1:", exact=False).first.wait_for(timeout=180_000)
        page.get_by_text("Presentation", exact=True).first.click()
        page.locator(".st-key-presentation_nav").wait_for(timeout=60_000)
        page.wait_for_timeout(1500)
        assert not page.locator("section[data-testid='stSidebar']").is_visible()
        lens = _viewer(page)
        box = page.locator(".st-key-lens_graph").bounding_box()
        assert box["y"] < 250 and box["y"] + box["height"] <= 800, box  # graphs first, the whole window's height
        px = lens.evaluate(_TEXT_PX)
        page.screenshot(path=str(tmp_path / "presentation.png"))
        assert px and min(px) >= 14, sorted(px)[:5]
        lens.locator(".pane").first.click()  # keys pressed in the graph reach the page
        page.keyboard.press("ArrowRight")
        page.get_by_text("2: batch_linear").first.wait_for(timeout=60_000)
        page.get_by_text("recsys_towers:", exact=False).first.click()
        page.keyboard.press("ArrowLeft")
        page.get_by_text("1: normalize_split").first.wait_for(timeout=60_000)
        assert not page.locator('[data-testid="stException"]').count()
        browser.close()


def test_viewers_mounted_at_every_step_share_one_pair_of_window_listeners_and_each_pans(report_file):
    from playwright.sync_api import sync_playwright

    path, _ = report_file
    svg = "section.step:not([hidden]) .viewer.pair .pane:nth-child(1) svg"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(path.as_uri())
        for step in (2, 3, 4):  # each step's viewer is mounted when it is shown
            page.keyboard.press("ArrowRight")
            page.wait_for_selector(f"#step-{step}:not([hidden]) .viewer.pair .pane svg")
        cdp = page.context.new_cdp_session(page)
        win = cdp.send("Runtime.evaluate", {"expression": "window"})["result"]["objectId"]
        listeners = cdp.send("DOMDebugger.getEventListeners", {"objectId": win})["listeners"]
        page_script = {x["scriptId"] for x in listeners if x["type"] == "hashchange"}  # the report's own script
        ours = [x["type"] for x in listeners if x["scriptId"] in page_script]  # not playwright's injected ones
        assert ours.count("mousemove") == 1 and ours.count("mouseup") == 1, listeners
        box = page.locator(svg).bounding_box()
        before = page.get_attribute(svg, "viewBox")
        x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
        page.mouse.move(x, y)
        page.mouse.down()
        page.mouse.move(x + 60, y + 40, steps=4)
        page.mouse.up()
        assert page.get_attribute(svg, "viewBox") != before  # the viewer on screen pans
        browser.close()
