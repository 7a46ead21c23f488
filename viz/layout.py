"""Bounded graph layout: node positions from Graphviz ``dot`` within a time budget, or
from a cheap layered fallback, and drawing with those positions pinned.

Why: ``dot``'s network simplex (ranking, x-coordinates) and crossing minimisation have
no useful bound on adversarial graphs (a chain with long skip edges: >120 s for 300
nodes with the defaults). Every layout here

1. runs ``dot`` with iteration limits scaled to the graph's size (:func:`dot_limits`:
   ``nslimit``/``nslimit1`` cap network-simplex passes at a multiple of the node count,
   ``mclimit`` scales crossing-minimisation passes down as the graph grows), and
2. stops it after ``budget_s`` seconds, falling back to :func:`layered_layout` — longest-
   path ranks, graph order within a rank, straight edges; O(nodes + edges) — and says
   so in :attr:`Layout.note`, which every view shows.

Drawing (:func:`draw_pinned`) hands the positions to ``neato -n2``, which keeps nodes and
edge splines where they are given, so two drawings that share a :class:`Layout` (a
step's before and after) put every shared node at the same coordinates. Two invisible
anchor points at the layout's bounding-box corners give both drawings the same
``viewBox``, so one zoom/pan transform fits both.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass, field

#: seconds ``dot`` may spend on one layout before the layered fallback is used
LAYOUT_BUDGET_S = 1.2
#: points per inch (Graphviz sizes nodes in inches, positions in points)
PT = 72.0


class RenderError(RuntimeError):
    """Graphviz could not lay out or draw a graph: it ran past its time limit, failed, or is missing."""


@dataclass
class Layout:
    """Positions of one laid-out graph, in points (Graphviz's y axis: up).

    ``nodes`` maps a node id to ``(x, y, width_in, height_in)`` (centre in points, size in
    inches); ``edges`` maps ``(tail, head)`` to a Graphviz spline ``pos`` string;
    ``clusters`` maps a cluster subgraph name to its ``bb``; ``bb`` is the whole
    drawing's box ``(x0, y0, x1, y1)``. ``method`` is "dot", "dot (limited)" or
    "layered"; ``note`` is empty unless the layout is a fallback, then it says why;
    ``seconds`` is the wall time spent.
    """

    nodes: dict[str, tuple[float, float, float, float]] = field(default_factory=dict)
    edges: dict[tuple[str, str], str] = field(default_factory=dict)
    clusters: dict[str, str] = field(default_factory=dict)
    bb: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    method: str = "dot"
    note: str = ""
    seconds: float = 0.0


def dot_limits(n_nodes: int) -> dict[str, str]:
    """Graph attributes bounding ``dot``'s work for a graph of ``n_nodes`` nodes.

    Up to 100 nodes: none (Graphviz defaults). Above: ``nslimit = nslimit1 =
    max(1, 600 / n)`` (network-simplex iterations per node) and ``mclimit = max(0.05,
    min(1, 60 / n))`` (crossing-minimisation passes). On a 300-node skip-edge chain this
    is 0.22 s instead of 0.77 s; at 1,500 nodes, 1 s instead of 19 s on a quiet machine
    (5-10 s instead of > 60 s under load: :func:`bounded_layout` adds a time budget).
    """
    if n_nodes <= 100:
        return {}
    ns = max(1.0, 600.0 / n_nodes)
    mc = max(0.05, min(1.0, 60.0 / n_nodes))
    return {"nslimit": f"{ns:.3g}", "nslimit1": f"{ns:.3g}", "mclimit": f"{mc:.3g}", "searchsize": "30"}


def _run(cmd: list[str], source: str, timeout_s: float) -> str:
    try:
        out = subprocess.run(cmd, input=source.encode(), capture_output=True, timeout=timeout_s)
    except FileNotFoundError as e:
        raise RenderError("Graphviz is not installed (apt-get install graphviz)") from e
    if out.returncode != 0:
        raise RenderError(f"Graphviz {cmd[0]} failed: {out.stderr.decode(errors='replace').strip()[:500]}")
    return out.stdout.decode()


def _with_attrs(source: str, attrs: dict[str, str]) -> str:
    """DOT source with graph attributes added right after the opening brace."""
    if not attrs:
        return source
    at = source.index("{") + 1
    return source[:at] + "\n\t" + " ".join(f'{k}="{v}"' for k, v in attrs.items()) + source[at:]


def parse_json_layout(text: str) -> Layout:
    """A :class:`Layout` from Graphviz ``-Tjson0`` output."""
    d = json.loads(text)
    lay = Layout(bb=tuple(float(v) for v in d["bb"].split(",")))
    names = {}
    for o in d.get("objects", []):
        names[o["_gvid"]] = o["name"]
        if "pos" in o:
            x, y = (float(v) for v in o["pos"].split(","))
            lay.nodes[o["name"]] = (x, y, float(o["width"]), float(o["height"]))
        elif "bb" in o and o["name"].startswith("cluster"):
            lay.clusters[o["name"]] = o["bb"]
    for e in d.get("edges", []):
        if "pos" in e:
            lay.edges[(names[e["tail"]], names[e["head"]])] = e["pos"]
    return lay


def dot_layout(source: str, n_nodes: int, budget_s: float = LAYOUT_BUDGET_S) -> Layout:
    """Lay out DOT ``source`` (``n_nodes`` nodes) with size-scaled limits; raises
    RenderError when ``dot`` runs past ``budget_s`` seconds or fails."""
    limits = dot_limits(n_nodes)
    t0 = time.perf_counter()
    try:
        text = _run(["dot", "-Tjson0"], _with_attrs(source, limits), budget_s)
    except subprocess.TimeoutExpired as e:
        raise RenderError(f"Graphviz dot did not lay out {n_nodes:,} nodes within {budget_s:g} s") from e
    lay = parse_json_layout(text)
    lay.method = "dot (limited)" if limits else "dot"
    lay.seconds = time.perf_counter() - t0
    return lay


def layered_layout(
    order: list[str], inputs: dict[str, list[str]], sizes: dict[str, tuple[float, float]], note: str = ""
) -> Layout:
    """A cheap layered layout: a node's rank is its longest path from a source (inputs
    come before users, top to bottom), nodes in a rank sit left to right in ``order``
    (graph order), edges are straight. ``sizes`` gives each node's (width, height) in
    inches. O(nodes + edges); used when ``dot`` runs past its budget."""
    t0 = time.perf_counter()
    rank: dict[str, int] = {}
    for n in order:
        rank[n] = 1 + max((rank[i] for i in inputs.get(n, ()) if i in rank), default=-1)
    rows: dict[int, list[str]] = {}
    for n in order:
        rows.setdefault(rank[n], []).append(n)
    lay = Layout(method="layered", note=note)
    gap_x, gap_y = 18.0, 30.0
    row_h = {r: max(sizes[n][1] for n in ns) * PT for r, ns in rows.items()}
    y, width = 0.0, 0.0
    for r in sorted(rows, reverse=True):  # Graphviz y points up: the last rank at the bottom
        x = 0.0
        for n in rows[r]:
            w, h = sizes[n]
            lay.nodes[n] = (x + w * PT / 2, y + row_h[r] / 2, w, h)
            x += w * PT + gap_x
        width = max(width, x)
        y += row_h[r] + gap_y
    lay.bb = (0.0, 0.0, max(width - gap_x, 1.0), max(y - gap_y, 1.0))
    lay.seconds = time.perf_counter() - t0
    return lay


def bounded_layout(
    source: str,
    order: list[str],
    inputs: dict[str, list[str]],
    sizes: dict[str, tuple[float, float]],
    budget_s: float = LAYOUT_BUDGET_S,
) -> Layout:
    """``dot`` within ``budget_s`` seconds (:func:`dot_layout`); when it runs over, the
    :func:`layered_layout` of the same nodes, whose ``note`` says so. Raises RenderError
    only when Graphviz is missing or rejects the source."""
    try:
        return dot_layout(source, len(order), budget_s)
    except RenderError as e:
        if "within" not in str(e):
            raise
        return layered_layout(
            order,
            inputs,
            sizes,
            note=f"{e}; drawn with a simple layered layout instead (ranks by longest path, straight edges)",
        )


def anchors(bb: tuple[float, float, float, float]) -> list[str]:
    """DOT statements of two invisible points at the corners of ``bb``: a drawing with
    them has exactly this bounding box, whatever subset of nodes it shows."""
    x0, y0, x1, y1 = bb
    return [
        f'__bb0__ [pos="{x0:.2f},{y0:.2f}!" shape=point width=0.01 height=0.01 label="" style=invis]',
        f'__bb1__ [pos="{x1:.2f},{y1:.2f}!" shape=point width=0.01 height=0.01 label="" style=invis]',
    ]


def draw_pinned(source: str, timeout_s: float = 20.0) -> str:
    """SVG of DOT ``source`` whose nodes carry ``pos`` (points) and whose edges may carry
    spline ``pos``: ``neato -n2`` keeps both. Raises RenderError on failure or timeout."""
    try:
        return _run(["neato", "-n2", "-Tsvg"], source, timeout_s)
    except subprocess.TimeoutExpired as e:
        raise RenderError(f"Graphviz neato did not draw the pinned layout within {timeout_s:g} s") from e
