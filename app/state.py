"""The app's session logic, free of Streamlit so tests can drive it directly.

Every function takes the session state as a plain ``MutableMapping`` (Streamlit's
``st.session_state`` is one). :func:`init` is the one place every key gets its first value,
on every run of every page. Two kinds of keys:

**Data** (:data:`DEFAULTS`; set by the app's code, never by a widget):

* ``trace`` — the Trace on screen (None before the first run or upload)
* ``spec`` — the model spec that produced it ("sample:NAME", "pkg.mod:factory", "file.py:factory",
  "model.pt2", "hf:NAME"), or None for an uploaded trace of a model this build cannot rebuild
* ``pattern`` — the user pattern the step viewer carries, ``{"name", "source", "passes"}``, from the
  Pattern Lab's "Open in the step viewer" (kept until another one replaces it; ``passes``: the
  passes its file made, one per ``PatternMatcherPass`` of an Inductor file, else the file's own
  pass, :func:`pattern_passes`), or None: a pass toggle
  of its own; Run, why-not and timing include it where the trace on screen does
  (:func:`includes_pattern`); its code only ever runs in a child process
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
* ``lab_*`` / ``teach_*`` — the Pattern Lab's and the Teach page's (their modules say which)

**Settings** (:data:`SETTINGS`; a widget's key): what the user chose — the model source and
spec, the verify and capture settings, the pass source, the pass filter and view options, the
why-not and timing choices, the Lab's model and pattern name, the Teach page's pattern and
search. Streamlit drops a widget's value when its page is not drawn; every such widget is made
with ``persist_state=KEEP`` ("session") and no value of its own (its first value is here), so
what the user set survives every page switch and rerun (``tests/test_app_state.py`` checks the
source of every page). The pass toggles ``pass:NAME`` (one per pass of the pipeline on
screen, first value True) and ``upstream_passes`` (upstream's default options) are kept the
same way.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from optimus_lens.core.trace import Trace, TraceFormatError

DEFAULTS = {
    "trace": None,
    "spec": None,
    "pattern": None,
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


#: what every widget in :data:`SETTINGS` passes as ``persist_state``: its value is kept for the
#: whole session, across page switches (Streamlit >= 1.67)
KEEP = "session"
#: the step viewer's model sources (the ``source_kind`` radio)
SAMPLE, FACTORY, COMPILE_LOG, TRACE_FILE = "Sample model", "Python factory", "Compile log", "Trace file"
#: the Pattern Lab's first starter file (``optimus_lens/frontend/starters/``) and pattern name
LAB_STARTER, LAB_NAME = "functions.py", "swish"

#: widget key -> its first value (see the module docstring); :func:`init` adds the ones
#: computed from the environment (``sample``, ``factory``, ``source_kind`` from ``optimus app
#: --model``; ``hops``; ``lab_source``; ``teach_pattern``; ``bench_one_thread``)
SETTINGS: dict[str, Any] = {
    # the step viewer's sidebar: model, passes, checks
    "source_kind": SAMPLE,
    "factory": "",
    "log_path": "",
    "log_graph": None,  # the log's first dynamo_output_graph, set once a log is read
    "pass_source": "Optimus Lens passes",
    "verify": "end",
    "grads": False,
    "capture_method": "dynamo",
    "run_stage": "pre-grad",  # which graphs Run rewrites (optimize's stage): pre-grad, post-grad, all
    "run_mode": "inference",  # inference: the forward ATen graph; training: forward and backward
    # the graph on screen: the pre-grad graph, or one of the run's ATen graphs (forward, backward)
    "view_graph": "pre-grad",
    # navigator and view options
    "pass_filter": "all passes",
    "view_mode": "Step",
    "picture": "Side by side",
    "text_size": "normal",
    "fold_params": True,
    "fold_parallel": "auto",
    "clusters": True,
    "fold_modules": "auto",
    "keep_positions": True,
    "full": False,
    "graph_height": 560,
    # inspector, why-not, timing
    "bench_kernels": False,
    "inspect_side": "after",
    "inspect_query": "",
    "why_at": "before",
    "why_node": "",
    "repeats": 20,
    "bench_mode": "inference",
    "bench_compile": False,
    "bench_upstream": False,
    # the Pattern Lab (``lab_spec`` and ``lab_name`` are the Lab's model and pattern name)
    "lab_spec": "sample:swish_mlp",
    "lab_name": LAB_NAME,
    "lab_starter_kind": "pattern / replacement functions",  # the first of optimus_lens.app.lab.STARTERS
    "lab_stage": "auto",  # where the pattern runs: auto follows the file (a PatternMatcherPass: post-grad)
    "lab_mode": "inference",  # training: the post-grad stage previews the backward graph too
    # the Teach page
    "teach_search": "global",
    "teach_frame": 1,
    "teach_dep_frame": 1,
    # the Sweep page's filters
    "sweep_status": [],
    "sweep_config": [],
}
# ``sweep_dir`` first holds the directory ``optimus app --sweep DIR`` named (``_first_values``)
#: the Pattern Lab's and the Teach page's data (not widgets)
PAGE_DEFAULTS: dict[str, Any] = {
    "lab_result": None,
    "lab_action": None,
    "lab_ran": None,
    "lab_bench": None,
    "lab_loaded": None,
    "lab_rev": 0,  # bumped when code replaces the editor's text (a loaded file, a starter): a fresh editor
    "teach_slide": 0,
}


def _first_values() -> dict[str, Any]:
    """The first values :data:`SETTINGS` cannot hold as literals: the model ``optimus app
    --model`` named (``OPTIMUS_LENS_MODEL``: a sample, else a spec in the factory box), the
    Lab's starter, the Teach page's first pattern, and one CPU thread for timing where there is
    no CUDA device (one thread timed by its CPU time has the tight spread on CPU)."""
    import os
    from importlib import resources

    import torch

    from optimus_lens import sample_models
    from optimus_lens.app.lab_runner import TIME_LIMIT_S
    from optimus_lens.teach.lookup import predefined
    from optimus_lens.viz.options import HOPS

    out: dict[str, Any] = {"sample": sample_models.DEFAULT, "hops": HOPS}
    model = os.environ.get(MODEL_ENV, "").strip()
    if model:
        out.update(sidebar_model(model))
    out["lab_source"] = (resources.files("optimus_lens.frontend") / "starters" / LAB_STARTER).read_text(
        encoding="utf-8"
    )
    out["teach_pattern"] = predefined()[0]
    out["lab_time_limit"] = TIME_LIMIT_S
    out["bench_one_thread"] = not torch.cuda.is_available()
    out["sweep_dir"] = os.environ.get(SWEEP_ENV, "")
    return out


def init(state: MutableMapping) -> None:
    """Give every key of :data:`DEFAULTS`, :data:`SETTINGS` and the pages' data its first
    value where the state does not have it yet (a kept setting is never overwritten)."""
    if "_first_values_done" not in state:  # computed once a session; they win over the literals
        for k, v in _first_values().items():
            state.setdefault(k, v)
        state["_first_values_done"] = True
    for table in (DEFAULTS, SETTINGS, PAGE_DEFAULTS):
        for k, v in table.items():
            if k not in state:
                state[k] = list(v) if isinstance(v, list) else v
    state.setdefault("teach_revealed", set())


def sidebar_model(spec: str) -> dict[str, str]:
    """The step viewer sidebar's settings that name ``spec``: ``sample:NAME`` of a known sample
    as the sample picked, ``log:PATH#...`` as the compile log's path, any other spec in the
    factory box."""
    from optimus_lens import sample_models

    if spec.startswith("log:"):  # log:PATH#SELECTOR: the path in the Compile log field
        return {"source_kind": COMPILE_LOG, "log_path": spec.removeprefix("log:").split("#", 1)[0]}
    name = spec.removeprefix("sample:")
    if spec.startswith("sample:") or ":" not in spec:
        if name in sample_models.names():
            return {"source_kind": SAMPLE, "sample": name}
    return {"source_kind": FACTORY, "factory": spec}


def show_model(state: MutableMapping, spec: str) -> None:
    """Make the step viewer's sidebar name ``spec`` (see :func:`sidebar_model`): for a button
    callback on another page (the Lab, the Sweep page), before the sidebar is drawn."""
    for k, v in sidebar_model(spec).items():
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
    from optimus_lens.debug.why import WhyError

    if isinstance(exc, WhyError):
        return "Why-not cannot answer", str(exc)
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
    """Show ``trace``: go to its first step, forget the old timing and error. The graph picked
    (``view_graph``) stays when ``trace`` has it, else the trace's own (pre-grad) graph."""
    state["trace"], state["spec"], state["source"] = trace, spec, source
    if state.get("view_graph") not in trace.graph_names():
        state["view_graph"] = trace.graph
    state[GRAPH_SHOWN], state[GRAPH_STEPS] = state["view_graph"], {}
    state["cur_step"] = 1 if shown_trace(state).steps else 0
    state["bench"] = None
    state["error"] = None


def pattern_passes(pattern: dict) -> list[str]:
    """The pass names a carried ``pattern`` runs as: its ``passes`` (an Inductor file's
    ``PatternMatcherPass`` names, ``addcmul_fusion``), else its file's pass, the name made an
    identifier (:func:`optimus_lens.app.lab_runner.pass_name`)."""
    from optimus_lens.app.lab_runner import pass_name

    return list(pattern.get("passes") or [pass_name(pattern["name"])])


def includes_pattern(state: MutableMapping, trace: Trace | None = None) -> dict | None:
    """The carried ``pattern`` when ``trace`` (default: the one on screen) ran one of its passes
    (:func:`pattern_passes`) on any of its graphs (the pre-grad graph, the ATen graphs of a
    post-grad run), else None."""
    trace = trace if trace is not None else state.get("trace")
    pattern = state.get("pattern")
    if trace is None or pattern is None:
        return None
    names = set(pattern_passes(pattern))
    ran = [p for t in trace.traces() for p in t.passes if p.get("enabled", True)]
    return pattern if any(p["name"] in names for p in ran) else None


def accept_upload(state: MutableMapping, name: str, data: bytes, known_samples: list[str] = ()) -> bool:
    """Load an uploaded trace file into ``state``. On success the trace is shown (its
    spec is its model name when that is a known sample, so it can be re-run and timed; the
    sidebar's Stage and Mode become the ones it was recorded with) and True is returned; on failure ``state["error"]`` says why and everything else is
    left as it was."""
    try:
        trace = load_trace_bytes(data)
    except TraceFormatError as e:
        state["error"] = (f"Could not open {name}", str(e))
        return False
    spec = f"sample:{trace.model}" if trace.model in known_samples else None
    if trace.capture.get("stage") in ("pre-grad", "post-grad", "all"):  # Run runs again what the file recorded
        state["run_stage"] = trace.capture["stage"]
        state["run_mode"] = trace.capture.get("mode", "inference")
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


#: data keys of the graph picker: the graph the last run of the page drew, and the step each
#: graph of the trace on screen was left on (graph name -> step index)
GRAPH_SHOWN, GRAPH_STEPS = "graph_shown", "graph_steps"


def shown_trace(state: MutableMapping) -> Trace | None:
    """The Trace of the graph on screen: the graph ``view_graph`` names among the graphs of the
    trace on screen (:meth:`optimus_lens.core.trace.Trace.graph_named`), else the trace itself
    (pre-grad); None before the first run or upload."""
    trace = state.get("trace")
    if trace is None:
        return None
    name = state.get("view_graph")
    return trace.graph_named(name) if name in trace.graph_names() else trace


def graph_label(trace: Trace, name: str) -> str:
    """The graph picker's label for graph ``name`` of ``trace``: "forward (ATen, 5 steps)"."""
    t = trace.graph_named(name)
    kind = "Dynamo" if t is trace else "ATen"
    failed = len(t.failed_steps())
    return f"{name} ({kind}, {len(t.steps)} step{'s' if len(t.steps) != 1 else ''}" + (
        f", {failed} failed)" if failed else ")"
    )


def pick_graph(state: MutableMapping) -> None:
    """The graph picker's callback (``view_graph`` already holds the new graph): remember the
    step the old graph was on, go to the step the new one was left on (its first step the
    first time); the pass filter goes back to all passes, since each graph has its own."""
    trace = state.get("trace")
    if trace is None:
        return
    steps = state.setdefault(GRAPH_STEPS, {})
    old = state.get(GRAPH_SHOWN)
    if old is not None:
        steps[old] = state.get("cur_step", 0)
    new = shown_trace(state)
    state[GRAPH_SHOWN] = new.graph
    state["cur_step"] = steps.get(new.graph, 1 if new.steps else 0)
    state["pass_filter"] = "all passes"
