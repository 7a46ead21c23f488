"""Two runs' final graphs side by side, on one layout (``optimus compare A B --report``, the
app's compare panel).

The node pairing of the two final graphs (:func:`optimus_lens.core.graphmatch.match_nodes`)
names every node of B that is the same node as one of A by A's name; the two graphs are
then the before and after of one step (:func:`runs_trace`), so
:func:`optimus_lens.viz.picture.step_picture` lays out their union once and draws each
side on it: a node both runs have sits at the same place in both panes. Marks: nodes only
in A (red, dashed), only in B (green), and nodes paired only by name or provenance (the
same node computed from other inputs or arguments, in the group colour).
"""

from __future__ import annotations

import html
import json
from dataclasses import replace
from pathlib import Path

from optimus_lens.core.graphmatch import NodeMatch
from optimus_lens.core.trace import Delta, GraphSnapshot, NodeRecord, Step, Trace
from optimus_lens.viz.layout import draw_pinned
from optimus_lens.viz.options import DEFAULT, ViewOptions
from optimus_lens.viz.picture import StepPicture, step_picture
from optimus_lens.viz.viewer import VIEWER_CSS, VIEWER_JS, viewer_block

CHANGED = "the same node, other inputs or arguments"


def _renamer(match: NodeMatch, a_names: set[str], b_names: list[str]) -> dict[str, str]:
    back = {y: x for x, y in match.pairs.items()}
    out, used = {}, set(a_names)
    for y in b_names:
        if y in back:
            out[y] = back[y]
            continue
        name, k = y, 1
        while name in used:  # a node only B has, whose name A gives another node
            name, k = (f"{y}_in_B" if k == 1 else f"{y}_in_B{k}"), k + 1
        used.add(name)
        out[y] = name
    return out


def _ren_args(a, ren: dict[str, str]):
    if isinstance(a, dict):
        if len(a) == 1 and isinstance(a.get("node"), str):
            return {"node": ren.get(a["node"], a["node"])}
        return {k: _ren_args(v, ren) for k, v in a.items()}
    if isinstance(a, list):
        return [_ren_args(v, ren) for v in a]
    return a


def _same(r: NodeRecord, s: NodeRecord) -> bool:
    return (r.op, r.target, r.args, r.kwargs) == (s.op, s.target, s.args, s.kwargs)


def runs_trace(a: GraphSnapshot, b: GraphSnapshot, match: NodeMatch, label: str = "A vs B") -> Trace:
    """A trace of one step from graph ``a`` to graph ``b`` (B's nodes renamed as their A
    partners of ``match``, ``match`` being ``match_nodes(a, b)``): the step erases the nodes
    only A has, creates those only B has, and its sites are the pairs found by name or
    provenance only."""
    ren = _renamer(match, set(a.nodes), list(b.nodes))
    b2 = {
        ren[n]: NodeRecord(
            ren[n],
            r.op,
            r.target,
            _ren_args(r.args, ren),
            _ren_args(r.kwargs, ren),
            [ren.get(i, i) for i in r.inputs],
            r.shape,
            r.dtype,
            r.module,
            r.module_type,
            r.source,
            r.stride,
            r.device,
        )
        for n, r in b.nodes.items()
    }
    only_b = [ren[n] for n in match.only_b]
    loose = [x for x, h in match.how.items() if h != "structure"]
    upsert = [r for n, r in b2.items() if n not in a.nodes or not _same(a.nodes[n], r)]
    step = Step(
        index=1,
        pass_name="compare",
        pattern=label,
        sites=loose,
        created=only_b,
        erased=list(match.only_a),
        replaced={},
        delta=Delta(upsert, list(match.only_a)),
        match_s=0.0,
        rewrite_s=0.0,
        nodes_after=len(b2),
    )
    return Trace(model=label, initial_graph=a.copy(), steps=[step])


def runs_picture(
    a: GraphSnapshot,
    b: GraphSnapshot,
    match: NodeMatch,
    a_label: str = "A",
    b_label: str = "B",
    opts: ViewOptions = DEFAULT,
) -> StepPicture:
    """A's and B's graphs on one layout (:func:`runs_trace` drawn by
    :func:`optimus_lens.viz.picture.step_picture`), the legends saying what the marks mean
    here. Raises RenderError when Graphviz fails."""
    pic = step_picture(runs_trace(a, b, match, f"{a_label} vs {b_label}"), 1, replace(opts, modules=False))
    for v in (pic.before, pic.after, pic.diff):
        for e in v.legend:
            if e.text.startswith("pattern site"):
                e.text = CHANGED
            elif e.text.startswith("created"):
                e.text = f"only in {b_label}" + e.text[len("created") :]
            elif e.text.startswith("erased"):
                e.text = f"only in {a_label}" + e.text[len("erased") :]
            elif e.text.startswith("inputs rewired"):
                e.text = "other inputs" + e.text[len("inputs rewired") :]
    return pic


def runs_html(
    a: GraphSnapshot,
    b: GraphSnapshot,
    match: NodeMatch,
    report: str,
    a_label: str = "A",
    b_label: str = "B",
    opts: ViewOptions = DEFAULT,
) -> str:
    """One offline HTML page: the comparison's text ``report`` and both final graphs side
    by side on one layout, panned and zoomed together."""
    pic = runs_picture(a, b, match, a_label, b_label, opts)
    panes = [(f"A: {a_label}", draw_pinned(pic.before.source)), (f"B: {b_label}", draw_pinned(pic.after.source))]
    focus = list(dict.fromkeys(pic.before.focus + pic.after.focus))
    title = html.escape(f"{a_label} vs {b_label}")
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{title}</title><style>body{{margin:0;font-family:sans-serif}}"
        ".runs-head{padding:8px 14px}.runs-head pre{white-space:pre-wrap;font-size:12px;margin:6px 0}"
        f".runs-graphs{{height:85vh}}{VIEWER_CSS}</style></head><body>"
        f"<div class='runs-head'><h2>{title}</h2><pre>{html.escape(report)}</pre></div>"
        f"<div class='runs-graphs'>{viewer_block(panes, pic.diff.legend, pic.diff.notes)}</div>"
        f"<script>{VIEWER_JS}\nlensMount(document.querySelector('.lens'), {json.dumps(focus)}, 1.0, null);</script>"
        "</body></html>"
    )


def write_runs_html(path: str | Path, *args, **kw) -> int:
    """Write :func:`runs_html` to ``path``; returns the bytes written."""
    text = runs_html(*args, **kw)
    Path(path).write_text(text, encoding="utf-8")
    return len(text.encode())
