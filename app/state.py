"""The app's session logic, free of Streamlit so tests can drive it directly.

Every function takes the session state as a plain ``MutableMapping`` (Streamlit's
``st.session_state`` is one). Keys:

* ``trace`` — the Trace on screen (None before the first run or upload)
* ``spec`` — the model spec that produced it ("sample:NAME" / "pkg.mod:factory"), or
  None for an uploaded trace of a model this build cannot rebuild
* ``source`` — one line saying where the trace came from
* ``cur_step`` — the step on screen (1-based; 0 when the trace has no step)
* ``error`` — (title, message) of the last failed action, or None; the app shows it once
* ``bench`` — the BenchResult measured for this trace, or None
* ``upload_id`` — identity of the last upload handled, so a rerun does not reload it
* ``presentation`` — presentation mode on (:mod:`optimus_lens.app.presentation`), read by every page
* ``page_choice`` — the title of the page on screen (one of :data:`PAGES`), set by the
  router (``app/main.py``) on every run; set to another page (:func:`go_to`, from a button
  callback), the next run shows that page
* ``page_shown`` — the page the last run drew (the router's, to tell a page asked for from
  one the user picked in the navigation)

:func:`init` is the one place these are given their first values; each page keeps its own
keys (``lab_``, ``teach_``, ``sweep_`` prefixes) and fills them in itself.
"""

from __future__ import annotations

from collections.abc import MutableMapping

from optimus_lens.core.trace import Trace, TraceFormatError

DEFAULTS = {
    "trace": None,
    "spec": None,
    "source": "",
    "cur_step": 0,
    "error": None,
    "bench": None,
    "upload_id": None,
    "presentation": False,
}

#: the app's pages, by title (what ``page_choice`` holds and :func:`go_to` takes)
VIEWER, LAB, TEACH, SWEEP = "Step viewer", "Pattern Lab", "Teach", "Sweep"
PAGES = (VIEWER, LAB, TEACH, SWEEP)
PAGE, PAGE_SHOWN = "page_choice", "page_shown"
#: what ``optimus app --model X`` and ``--sweep DIR`` set: the sample the step viewer offers
#: first, and the sweep directory the Sweep page opens (Sweep is then the first page)
MODEL_ENV, SWEEP_ENV = "OPTIMUS_LENS_MODEL", "OPTIMUS_LENS_SWEEP"


def init(state: MutableMapping) -> None:
    """Fill in the keys above that the state does not have yet."""
    for k, v in DEFAULTS.items():
        if k not in state:
            state[k] = v


def go_to(state: MutableMapping, page: str) -> None:
    """Show ``page`` (a title of :data:`PAGES`) on the next run: for a button callback,
    which runs before the page is drawn. Raises ValueError for an unknown page."""
    if page not in PAGES:
        raise ValueError(f"no page {page!r}; the pages are {', '.join(PAGES)}")
    state[PAGE] = page


def error_message(exc: BaseException) -> tuple[str, str]:
    """(title, message) naming what failed: model spec, capture, a pattern (with its pass
    and site), a trace file, an unknown pass, or anything else (with its type)."""
    from optimus_lens.core.engine import PatternError
    from optimus_lens.frontend.capture import CaptureError
    from optimus_lens.frontend.run import ModelSpecError

    if isinstance(exc, ModelSpecError):
        return "Model spec error", str(exc)
    if isinstance(exc, CaptureError):
        return "The model could not be captured", str(exc)
    if isinstance(exc, PatternError):
        return (
            f"Pattern {exc.pattern} (pass {exc.pass_name}) raised",
            f"at {', '.join(exc.site[:8]) or 'no site'}: {type(exc.cause).__name__}: {exc.cause}",
        )
    if isinstance(exc, TraceFormatError):
        return "Not a usable trace file", str(exc)
    if isinstance(exc, KeyError):
        return "Unknown name", str(exc.args[0] if exc.args else exc)
    return f"Unexpected {type(exc).__name__}", str(exc)


def load_trace_bytes(data: bytes) -> Trace:
    """Parse an uploaded trace file. Raises TraceFormatError for anything that is not a
    UTF-8 JSON trace of a supported format version."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceFormatError(f"not UTF-8 text: {e}") from e
    return Trace.loads(text)


def set_trace(state: MutableMapping, trace: Trace, spec: str | None, source: str) -> None:
    """Show ``trace``: go to its first step, forget the old timing and error."""
    state["trace"], state["spec"], state["source"] = trace, spec, source
    state["cur_step"] = 1 if trace.steps else 0
    state["bench"] = None
    state["error"] = None


def accept_upload(state: MutableMapping, name: str, data: bytes, known_samples: list[str] = ()) -> bool:
    """Load an uploaded trace file into ``state``. On success the trace is shown (its
    spec is its model name when that is a known sample, so it can be re-run and timed)
    and True is returned; on failure ``state["error"]`` says why and everything else is
    left as it was."""
    try:
        trace = load_trace_bytes(data)
    except TraceFormatError as e:
        state["error"] = (f"Could not open {name}", str(e))
        return False
    spec = f"sample:{trace.model}" if trace.model in known_samples else None
    set_trace(state, trace, spec, f"trace file {name}")
    return True


def step_options(trace: Trace, pass_filter: str | None) -> list[int]:
    """The step indices the navigator moves over: all, or those of one pass."""
    if not pass_filter:
        return [s.index for s in trace.steps]
    return [s.index for s in trace.steps if s.pass_name == pass_filter]


def clamp_step(state: MutableMapping, options: list[int]) -> int:
    """Keep ``cur_step`` on one of ``options`` (the first one when it is not); returns it."""
    if not options:
        return state.get("cur_step", 0)
    if state.get("cur_step") not in options:
        state["cur_step"] = options[0]
    return state["cur_step"]


def move_step(state: MutableMapping, options: list[int], delta: int) -> None:
    """Move ``cur_step`` ``delta`` places along ``options``, stopping at either end."""
    if not options:
        return
    cur = clamp_step(state, options)
    i = min(max(options.index(cur) + delta, 0), len(options) - 1)
    state["cur_step"] = options[i]
