"""Every step's picture shows the step, in chromium at 1280x800: each site and created
node of the step inside its pane and the window, its label at least 9 px tall on screen
(tests/fitcheck.py reads this from the page's geometry). The first step and the widest (most
sites and created nodes) of the demo and realistic samples and the four widest teaching
samples in the HTML report (before | after and diff), and of the demo, realistic and widest
teaching sample in the app's step viewer (side by side); every step of the default model in the app in presentation mode, stacked
and as a diff. The sweep over every step of every sample: benchmarks/step_fit.py."""

from __future__ import annotations

import pytest
from fitcheck import app_fits, app_viewer, open_trace_in_app, report_fits
from test_browser import CHROMIUM, app_url  # noqa: F401 - app_url is a fixture
from test_viz_every_step import _trace  # one capture per sample for the whole session

from optimus_lens import sample_models
from optimus_lens.viz.report import write_report

pytestmark = pytest.mark.browser
ARGS = ["--no-sandbox", "--disable-gpu"]
#: models above this many captured nodes are left out: graphs too big for any fit list what is off-screen
LIMIT = 2000

try:  # the realistic samples need transformers
    import transformers  # noqa: F401

    HAS_TRANSFORMERS = True
except ImportError:
    HAS_TRANSFORMERS = False


def sampled(trace) -> list[int]:
    """The steps checked here: the first and the widest (most sites + created nodes)."""
    widest = max(trace.steps, key=lambda s: len(s.sites) + len(s.created)).index
    return sorted({1, widest})


@pytest.fixture(scope="module")
def traces():
    out = {}
    for name in sample_models.names():
        if sample_models.REGISTRY[name].kind == "realistic" and not HAS_TRANSFORMERS:
            continue
        trace = _trace(name)
        if trace.steps and len(trace.initial_graph) <= LIMIT:
            out[name] = trace
    return out


def _page(p):
    browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
    return browser, browser.new_page(viewport={"width": 1280, "height": 800})


def test_the_first_and_widest_step_of_the_demo_realistic_and_widest_teaching_samples_fit_in_the_report(
    traces, tmp_path
):
    from playwright.sync_api import sync_playwright

    bad = {}
    with sync_playwright() as p:
        browser, page = _page(p)
        for name in app_models(traces):
            trace = traces[name]
            path = tmp_path / f"{name}.html"
            write_report(trace, path, steps=sampled(trace))
            for (i, view), fails in report_fits(page, path, trace).items():
                if fails:
                    bad[f"{name} step {i} {view}"] = fails
        browser.close()
    assert len(app_models(traces)) >= 8
    assert not bad, bad


def app_models(traces) -> list[str]:
    """The models the app is checked on here: the demo and realistic samples, and the four
    teaching samples with the widest steps (every sample: benchmarks/step_fit.py)."""
    kind = {n: sample_models.REGISTRY[n].kind for n in traces}
    teaching = sorted(
        (n for n in traces if kind[n] == "teaching"),
        key=lambda n: max(len(s.sites) + len(s.created) for s in traces[n].steps),
    )
    return [n for n in traces if kind[n] != "teaching"] + teaching[-4:]


def app_only(traces) -> list[str]:
    """The app is checked on the demo and realistic samples and the widest teaching sample:
    the report test above covers four teaching samples with the same fit code."""
    models = app_models(traces)
    return [n for n in models if sample_models.REGISTRY[n].kind != "teaching"] + models[-1:]


def test_the_first_and_widest_step_of_the_demo_realistic_and_widest_teaching_samples_fit_in_the_app(
    app_url,  # noqa: F811
    traces,
    tmp_path,
):
    from playwright.sync_api import sync_playwright

    bad = {}
    with sync_playwright() as p:
        browser, page = _page(p)
        page.goto(app_url, timeout=90_000)
        page.get_by_role("button", name="Run", exact=True).wait_for(timeout=90_000)
        for name in app_only(traces):
            trace = traces[name]
            path = tmp_path / f"{name}.trace.json"
            path.write_text(trace.dumps())
            open_trace_in_app(page, path)
            for i, fails in app_fits(page, trace, sampled(trace)).items():
                if fails:
                    bad[f"{name} step {i}"] = fails
        assert not page.locator('[data-testid="stException"]').count()
        browser.close()
    assert not bad, bad


def test_every_step_of_the_default_model_fits_in_the_app_in_presentation_mode_stacked_and_as_a_diff(
    app_url,  # noqa: F811
    traces,
):
    from playwright.sync_api import sync_playwright

    trace = traces[sample_models.DEFAULT]
    n, bad = len(trace.steps), {}
    with sync_playwright() as p:
        browser, page = _page(p)
        page.goto(app_url, timeout=90_000)
        page.get_by_role("button", name="Run", exact=True).click(timeout=90_000)
        page.get_by_text("Step 1:", exact=False).first.wait_for(timeout=180_000)
        app_viewer(page, f"{trace.model}|1|Side by side")
        at = 1
        for how in ("Diff", "Stacked", "presentation"):  # forward, back, forward again
            order = list(range(1, n + 1)) if at == 1 else list(range(n, 0, -1))
            if how == "presentation":
                page.locator(".st-key-picture").get_by_text("Side by side", exact=True).click()
                page.get_by_text("Presentation", exact=True).first.click()
                page.locator(".st-key-presentation_nav").wait_for(timeout=60_000)
            else:
                page.locator(".st-key-picture").get_by_text(how, exact=True).click()
                page.locator(".lens .pane h4").filter(has_text="Diff" if how == "Diff" else "Before").first.wait_for(
                    timeout=60_000
                )
            picture = "Side by side" if how == "presentation" else how
            bad.update({f"{how} step {i}": f for i, f in app_fits(page, trace, order, at, picture).items() if f})
            at = order[-1]
        assert not page.locator('[data-testid="stException"]').count()
        browser.close()
    assert not bad, bad
