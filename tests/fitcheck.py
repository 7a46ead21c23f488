"""What the step-picture checks measure in chromium (tests/test_browser_fit.py and
benchmarks/step_fit.py): for a mounted viewer (``.lens``), whether each of the named nodes
is drawn wholly inside its pane and inside the window, with a label at least ``min_px``
tall on screen — read from the page's geometry (``getBoundingClientRect``), not from what
the viewer says of itself."""

from __future__ import annotations

#: the smallest label height on screen that counts as legible (px)
MIN_PX = 9.0
#: ms to wait for a step's transition (viz.viewer.ANIMATE_MS) to end before measuring
SETTLE_MS = 450

#: ``(root, [names, minPx])`` -> one entry per pane: {total, shown, outside: [..], small: [..]}
FIT_JS = r"""
(root, args) => {
  const names = new Set(args[0]), minPx = args[1], W = window.innerWidth, H = window.innerHeight;
  return Array.from(root.querySelectorAll('.pane')).map(function(p){
    const svg = p.querySelector('svg'); if (!svg) return {total: 0, shown: 0, outside: [], small: []};
    const r = svg.getBoundingClientRect(), out = {total: 0, shown: 0, outside: [], small: [], pane: [r.width, r.height]};
    svg.querySelectorAll('g.node').forEach(function(g){
      const t = g.querySelector('title'); if (!t || !names.has(t.textContent)) return;
      out.total++;
      const b = g.getBoundingClientRect();
      const inside = b.left >= Math.max(r.left, 0) - 2 && b.right <= Math.min(r.right, W) + 2 &&
                     b.top >= Math.max(r.top, 0) - 2 && b.bottom <= Math.min(r.bottom, H) + 2;
      const txt = g.querySelector('text'), th = txt ? txt.getBoundingClientRect().height : 0;
      if (!inside) out.outside.push(t.textContent);
      else if (th < minPx) out.small.push(t.textContent + ' ' + th.toFixed(1) + 'px');
      else out.shown++;
    });
    return out;
  });
}
"""


def failures(panes: list[dict]) -> list[str]:
    """One line per pane that does not show all of its named nodes legibly ([] when all do)."""
    return [
        f"pane {i}: {p['shown']}/{p['total']} shown; outside {p['outside'][:4]}; too small {p['small'][:3]}"
        for i, p in enumerate(panes)
        if p["shown"] < p["total"]
    ]


def drawn_names(pic, step) -> list[str]:
    """The drawn node ids that stand for ``step``'s sites and created nodes in ``pic`` (a
    :class:`optimus_lens.viz.StepPicture`): each node itself, or the "×k" node it was folded
    into. Raises AssertionError when one of them is not drawn at all."""
    out = []
    for view, names in ((pic.before, step.sites), (pic.after, step.created)):
        d = view.drawn
        rep = {m: n for n in d.order for m in d.members.get(n, [n])}
        missing = [n for n in names if n not in rep]
        assert not missing, f"step {step.index}: {missing[:5]} not drawn in the {view.title.split()[0]} pane"
        out += [rep[n] for n in names]
    return list(dict.fromkeys(out))


def step_names(step) -> list[str]:
    """The names a step's picture must show: its sites and created nodes (a folded "×k" node
    is drawn under its first member's name, so its other members are simply not found)."""
    return list(dict.fromkeys(list(step.sites) + list(step.created)))


def report_fits(page, path, trace, steps=None, views=("pair", "diff")) -> dict[tuple[int, str], list[str]]:
    """Open the report at ``path`` (of ``trace``) in ``page`` and check ``steps`` (step indices,
    default all; moved to with the right-arrow key) in each of ``views`` ("pair": before | after,
    "diff"); returns (step, view) -> failures (empty lists for the steps that fit)."""
    page.goto(path.resolve().as_uri())
    page.wait_for_selector("section.step:not([hidden]) .viewer.pair .pane svg", timeout=20_000)
    shown = [int(k) for k in page.eval_on_selector_all("section.step", "ss => ss.map(s => s.dataset.key)")]
    want = set(steps or shown)
    out = {}
    for j, i in enumerate(shown):
        if j:
            page.keyboard.press("ArrowRight")
            page.wait_for_selector(f"#step-{i}:not([hidden]) .viewer.pair .pane svg", timeout=20_000)
        if i not in want:
            continue
        for view in views:
            if view == "diff":
                page.check("input[name=mode][value=diff]")
                page.wait_for_selector(f"#step-{i} .viewer.diff:not([hidden]) .pane svg", timeout=20_000)
            page.wait_for_timeout(SETTLE_MS)  # the transition from the step before is over
            root = page.locator(f"#step-{i} .viewer.{view} .lens")
            out[(i, view)] = failures(root.evaluate(FIT_JS, [step_names(trace.step(i)), MIN_PX]))
            if view == "diff":
                page.check("input[name=mode][value=pair]")
                page.evaluate("document.activeElement.blur()")  # the arrow keys move between steps again
                page.wait_for_selector(f"#step-{i} .viewer.pair:not([hidden]) .pane svg", timeout=20_000)
    return out


def app_viewer(page, view: str | None = None, timeout_s: float = 60.0):
    """The app's step viewer root (``.lens``, in the click component's shadow root: playwright's
    locators pierce it) once it shows ``view`` (its ``data-view``: "model|step|picture") with
    drawn nodes, scrolled wholly into the window."""
    import time

    lens = page.locator(".lens").first
    end = time.time() + timeout_s
    while time.time() < end:
        try:
            if lens.locator(".pane svg g.node").count() > 0 and (
                view is None or lens.get_attribute("data-view", timeout=1_000) == view
            ):
                break
        except Exception:  # noqa: BLE001 - the page may rerun meanwhile; retried
            pass
        page.wait_for_timeout(200)
    else:
        raise AssertionError(f"no viewer with drawn panes of {view} appeared")
    page.locator(".st-key-lens_graph").evaluate("e => e.scrollIntoView({block: 'end'})")
    page.wait_for_timeout(SETTLE_MS)  # the transition from the step before is over
    return lens


def open_trace_in_app(page, path) -> None:
    """Open the trace file ``path`` (a unique file name) in the app's step viewer (sidebar:
    Trace file, then the upload); returns when the app names it as the trace on screen."""
    page.get_by_text("Trace file", exact=True).first.click()
    page.get_by_test_id("stSidebarUserContent").locator("[data-testid='stFileUploaderDropzoneInput']").set_input_files(
        str(path)
    )
    page.get_by_text(f"trace file {path.name}", exact=False).first.wait_for(timeout=120_000)


def app_fits(page, trace, steps=None, at: int = 1, picture: str = "Side by side") -> dict[int, list[str]]:
    """Check ``steps`` of ``trace`` (default all, in order) in the app, which shows step ``at``
    as ``picture``: each reached with Next or Previous, one press at a time; returns step ->
    failures."""
    out = {}
    for i in steps or range(1, len(trace.steps) + 1):
        while at != i:
            button = ".st-key-next button" if i > at else ".st-key-prev button"
            at += 1 if i > at else -1
            # a rerun can leave the old button on screen beside the new one for a moment
            page.wait_for_function(f"document.querySelectorAll({button!r}).length === 1", timeout=60_000)
            page.locator(button).click()
            page.get_by_text(f"{at}: {trace.step(at).pattern}", exact=False).first.wait_for(timeout=60_000)
        lens = app_viewer(page, f"{trace.model}|{i}|{picture}")
        out[i] = failures(lens.evaluate(FIT_JS, [step_names(trace.step(i)), MIN_PX]))
    return out
