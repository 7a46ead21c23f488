"""What a view highlights, and the legend that says so.

Marks (what the colours mean, also drawn as a legend inside every graph):

* **pattern site** — the nodes the step matched, filled with their fused group's
  colour. A step is one group; a whole-pass overview gives each step's group its own
  colour (the palette's ``groups``, cycled).
* **created** — nodes the rewrite added: green border on a light-green fill (in a pass
  overview, the fill is the creating step's group colour).
* **erased** — nodes the rewrite removed, drawn red and dashed in the *before* view.
* **rewired** — existing nodes whose inputs the rewrite pointed at new nodes (blue border).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from optimus_lens.core.trace import GraphSnapshot, Step
from optimus_lens.viz.palette import STANDARD, Palette


@dataclass
class Marks:
    """What to highlight in one graph view.

    ``groups`` maps a node name to its group index (colour); ``group_labels[i]`` names
    group ``i`` in the legend (e.g. "step 3: batch_linear"). ``created``/``erased``/
    ``rewired`` are node-name sets.
    """

    groups: dict[str, int] = field(default_factory=dict)
    group_labels: list[str] = field(default_factory=list)
    created: set[str] = field(default_factory=set)
    erased: set[str] = field(default_factory=set)
    rewired: set[str] = field(default_factory=set)

    def names(self) -> set[str]:
        return set(self.groups) | self.created | self.erased | self.rewired


def mark_key(marks: Marks, n: str) -> tuple:
    """How node ``n`` is marked, as a hashable key: (group or None, created, erased,
    rewired). Nodes with different keys never fold together, and a node's DOT statement
    is cached under it."""
    return (marks.groups.get(n), n in marks.created, n in marks.erased, n in marks.rewired)


@dataclass
class LegendEntry:
    """One legend row: a swatch (fill colour, border colour, dashed border) and its text."""

    fill: str
    border: str
    text: str
    dashed: bool = False


def legend_entries(marks: Marks, shown: set[str], palette: Palette = STANDARD) -> list[LegendEntry]:
    """The legend rows for the marks that are present among the ``shown`` nodes."""
    rows = []
    groups = palette.groups
    for i in sorted({i for n, i in marks.groups.items() if n in shown}):
        label = marks.group_labels[i] if i < len(marks.group_labels) else f"group {i + 1}"
        rows.append(LegendEntry(groups[i % len(groups)], "#333333", f"pattern site: {label}"))
    if marks.created & shown:
        fill = palette.created_fill if not (marks.created & set(marks.groups)) else "#ffffff"
        rows.append(LegendEntry(fill, palette.created_border, f"created ({len(marks.created & shown)})"))
    if marks.erased & shown:
        rows.append(LegendEntry("#ffffff", palette.erased_border, f"erased ({len(marks.erased & shown)})", dashed=True))
    rewired = (marks.rewired - marks.created) & shown
    if rewired:
        rows.append(LegendEntry("#ffffff", palette.rewired_border, f"inputs rewired ({len(rewired)})"))
    return rows


def step_marks(
    step: Step, side: str, before: GraphSnapshot | None = None, group: int = 0, group_label: str | None = None
) -> Marks:
    """Marks of one step's ``side`` ("before" or "after"): its sites as group ``group``,
    erased nodes (before), created and rewired nodes (after). Raises ValueError for
    another ``side``."""
    if side not in ("before", "after"):
        raise ValueError(f"side must be 'before' or 'after', not {side!r}")
    labels = [""] * group + [group_label or f"step {step.index} ({step.pattern})"]
    m = Marks(groups={s: group for s in step.sites}, group_labels=labels)
    if side == "before":
        m.erased = set(step.erased)
    else:
        m.created = set(step.created)
        m.rewired = {r.name for r in step.delta.upsert} - set(step.created) if step.delta else set()
    return m
