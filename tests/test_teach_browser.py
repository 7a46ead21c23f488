"""A lesson file in a real browser (headless chromium): it loads from disk with the
network cut, the arrow keys and buttons move between slides, the slider scrubs the
search frames, and the exercise's answer is revealed by its button."""

import shutil

import pytest

from optimus_lens.teach.walk import walkthrough
from optimus_lens.viz.lesson import write_lesson

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = pytest.mark.browser


def test_lesson_file_works_offline_with_keys_slider_and_reveal(tmp_path):
    assert CHROMIUM, "chromium is not installed: run scripts/setup.sh --browser (make test does)"
    from playwright.sync_api import sync_playwright

    w = walkthrough("batch_relu", repeats=2, warmup=1)
    path = tmp_path / "batch_relu.html"
    write_lesson(w, path)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        errors, remote = [], []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.route(
            "**/*",
            lambda route: (
                route.continue_()
                if route.request.url.startswith("file:")
                else (remote.append(route.request.url), route.abort())
            ),
        )
        page.goto(path.as_uri())
        visible = "section.slide:not([hidden])"
        assert page.locator(visible).get_attribute("data-kind") == "before"
        assert page.locator(f"{visible} svg g.node").count() > 0  # the drawing is mounted
        page.keyboard.press("ArrowRight")
        assert page.locator(visible).get_attribute("data-kind") == "search"
        assert page.locator(f"{visible} .ftext:not([hidden])").inner_text().startswith("Candidates")
        page.locator(f"{visible} input[type=range]").fill("2")
        assert page.locator(f"{visible} .ftext:not([hidden])").inner_text().startswith("Independent layers")
        assert page.locator(f"{visible} .fview:not([hidden]) svg g.node").count() > 0
        page.keyboard.press("ArrowRight")  # the slider has the focus: the key moves the frame, not the slide
        assert page.locator(visible).get_attribute("data-kind") == "search"
        page.evaluate("document.activeElement.blur()")
        page.keyboard.press("ArrowLeft")
        assert page.locator(visible).get_attribute("data-kind") == "before"
        for _ in range(len(w.slides)):
            page.click("#next")
        assert page.locator(visible).get_attribute("data-kind") == "exercise"
        assert not page.locator(f"{visible} .answer").is_visible()
        page.click(f"{visible} button.reveal")
        assert w.exercise.answer[:30] in page.locator(f"{visible} .answer").inner_text()
        assert page.locator("#count").inner_text() == f"slide {len(w.slides)} / {len(w.slides)}"
        browser.close()
    assert not errors and not remote
