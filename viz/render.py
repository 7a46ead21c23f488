"""Views to SVG: laid out within a time budget (:mod:`optimus_lens.viz.layout`), falling back to a
layered layout that the result names, and made to scale with its container."""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass

import graphviz

from optimus_lens.viz.dot import emit
from optimus_lens.viz.labels import box_sizes
from optimus_lens.viz.layout import LAYOUT_BUDGET_S, RenderError, dot_limits, draw_pinned, layered_layout
from optimus_lens.viz.marks import Marks
from optimus_lens.viz.options import ViewOptions
from optimus_lens.viz.views import GraphView


@dataclass
class Rendered:
    """An SVG and how it was laid out: ``note`` is empty unless a fallback layout was used."""

    svg: str
    note: str = ""
    seconds: float = 0.0


def render_view(
    view: GraphView | graphviz.Digraph | str, budget_s: float = LAYOUT_BUDGET_S, timeout_s: float = 20.0
) -> Rendered:
    """Lay out and draw a view. A pinned view (from :func:`optimus_lens.viz.picture.step_picture`) is
    drawn as laid out (``neato -n2``). Otherwise ``dot`` runs with
    :func:`optimus_lens.viz.layout.dot_limits` for the view's size; a view that ``dot`` does not finish
    within ``budget_s`` seconds is drawn with the layered fallback and ``note`` says so.
    DOT source (str or Digraph) has no fallback: past ``timeout_s`` it raises
    RenderError, as when Graphviz fails."""
    t0 = time.perf_counter()
    if isinstance(view, GraphView) and view.pinned:
        return Rendered(draw_pinned(view.source, timeout_s), "", time.perf_counter() - t0)
    source = view if isinstance(view, str) else view.source
    n = view.shown if isinstance(view, GraphView) else source.count("\n")
    limits = [f"-G{k}={v}" for k, v in dot_limits(n).items()]
    wait = budget_s if isinstance(view, GraphView) and view.drawn is not None else timeout_s
    try:
        out = subprocess.run(["dot", "-Tsvg", *limits], input=source.encode(), capture_output=True, timeout=wait)
    except subprocess.TimeoutExpired as e:
        if not (isinstance(view, GraphView) and view.drawn is not None):
            raise RenderError(f"Graphviz layout of this graph did not finish within {wait:g} s") from e
        d = view.drawn
        marks_note = f"Graphviz dot did not lay out {n:,} nodes within {wait:g} s"
        layout = layered_layout(
            d.order,
            d.inputs,
            box_sizes(d, {}),
            note=marks_note + "; drawn with a simple layered layout instead (ranks by longest path, straight edges)",
        )
        opts = ViewOptions(legend_in_graph=False, palette=view.palette)
        g, _, _ = emit(d, view.marks or Marks(), opts, layout=layout)
        return Rendered(draw_pinned(g.source, timeout_s), layout.note, time.perf_counter() - t0)
    except FileNotFoundError as e:
        raise RenderError("Graphviz `dot` is not installed (apt-get install graphviz)") from e
    if out.returncode != 0:
        raise RenderError(f"Graphviz dot failed: {out.stderr.decode(errors='replace').strip()[:500]}")
    return Rendered(out.stdout.decode(), "", time.perf_counter() - t0)


def render_svg(view: GraphView | graphviz.Digraph | str, timeout_s: float = 20.0) -> str:
    """The SVG text of :func:`render_view` (bounded layout; a fallback layout when ``dot``
    runs past its budget). Raises RenderError when Graphviz fails or is missing, or when
    plain DOT source takes longer than ``timeout_s`` seconds."""
    return render_view(view, timeout_s=timeout_s).svg


def responsive_svg(svg: str) -> str:
    """The SVG with its fixed width/height removed (its viewBox kept), so it scales to
    the width of its container; the XML prologue and DOCTYPE are dropped."""
    start = svg.find("<svg")
    svg = svg[start:] if start >= 0 else svg
    return re.sub(r'<svg width="[^"]*" height="[^"]*"', '<svg width="100%"', svg, count=1)
