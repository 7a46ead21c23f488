"""The Python code of a step's graphs, before vs after, as a unified diff.

Both graphs are rebuilt from the trace's snapshots (:func:`optimus_lens.debug.rebuild.graph_module`)
and printed by FX's code generator (``GraphModule.code``), so the diff shows exactly the
FX nodes the step changed. A node a step created is placed just before its first user,
so new code sits where it is used. Lines that assign a site of the step (a matched node)
or a node it created are marked.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from optimus_lens.core.trace import GraphSnapshot, Trace
from optimus_lens.debug.rebuild import graph_module

_ASSIGN = re.compile(r"^\s+(\w+) = ")
_FREE = re.compile(r";\s+\w+(?: = \w+)* = None$", re.MULTILINE)

KINDS = ("hunk", "context", "removed", "added")


@dataclass
class DiffLine:
    """One line of a code diff. ``kind`` is one of ``KINDS``; ``text`` the code (or the
    ``@@ -a,b +c,d @@`` header of a hunk); ``old_no``/``new_no`` the 1-based line numbers
    in the before/after code (None where the line is not in that side); ``node`` the FX
    node the line assigns, if any; ``site`` is True for a line assigning one of the
    step's sites (before) or a node the step created (after)."""

    kind: str
    text: str
    old_no: int | None = None
    new_no: int | None = None
    node: str | None = None
    site: bool = False


def graph_code(snap: GraphSnapshot, free: bool = False) -> str:
    """``snap`` as the Python code FX generates for it (``def forward(self, ...)``).

    FX ends a line with ``;  a = b = None`` where values die; those trailers are dropped
    unless ``free``, since a step changes where values die far from its sites and the
    diff would show those lines as changed. Raises
    :class:`optimus_lens.debug.rebuild.RebuildError` when the snapshot cannot be rebuilt."""
    code = graph_module(snap).code.strip("\n") + "\n"
    return code if free else _FREE.sub("", code)


def _assigned(line: str) -> str | None:
    m = _ASSIGN.match(line)
    return m.group(1) if m else None


def code_diff(trace: Trace, index: int, context: int = 3) -> list[DiffLine]:
    """The unified diff (``context`` lines around each change) between the code of the
    graph before and after step ``index`` (1-based) of ``trace``. Lines assigning the
    step's sites (before) or created nodes (after) have ``site`` set, also in context.
    Raises IndexError for no such step, RebuildError for a graph that cannot be rebuilt."""
    step = trace.step(index)
    old = graph_code(trace.before(index)).splitlines()
    new = graph_code(trace.after(index)).splitlines()
    sites, created = set(step.sites), set(step.created)
    out: list[DiffLine] = []
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    for group in matcher.get_grouped_opcodes(context):
        a0, a1, b0, b1 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        out.append(DiffLine("hunk", f"@@ -{a0 + 1},{a1 - a0} +{b0 + 1},{b1 - b0} @@"))
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                for k in range(i2 - i1):
                    name = _assigned(old[i1 + k])
                    out.append(DiffLine("context", old[i1 + k], i1 + k + 1, j1 + k + 1, name, name in sites))
                continue
            for i in range(i1, i2):
                name = _assigned(old[i])
                out.append(DiffLine("removed", old[i], i + 1, None, name, name in sites))
            for j in range(j1, j2):
                name = _assigned(new[j])
                out.append(DiffLine("added", new[j], None, j + 1, name, name in created))
    return out


_PREFIX = {"hunk": "", "context": " ", "removed": "-", "added": "+"}
_COLOR = {"hunk": "\033[36m", "removed": "\033[31m", "added": "\033[32m", "context": ""}


SITE_NOTE = {"removed": "  # <- site", "context": "  # <- site", "added": "  # <- created"}


def diff_text(lines: list[DiffLine], title: str = "", color: bool = False, gutter: bool = True) -> str:
    """A diff as text: a ``---``/``+++`` header naming ``title``, then one line per
    DiffLine with the unified diff prefix. Site / created-node lines are marked by a
    ``>`` gutter column, or with ``gutter=False`` (a plain unified diff, for diff syntax
    highlighters) by a trailing ``# <- site`` / ``# <- created`` comment. ANSI colours
    with ``color``."""
    head = [f"--- before {title}".rstrip(), f"+++ after {title}".rstrip()]
    rows = []
    for d in lines:
        if d.kind == "hunk":
            text = d.text
        elif gutter:
            text = f"{'>' if d.site else ' '}{_PREFIX[d.kind]}{d.text}"
        else:
            text = f"{_PREFIX[d.kind]}{d.text}{SITE_NOTE[d.kind] if d.site else ''}"
        if color and _COLOR[d.kind]:
            text = f"{_COLOR[d.kind]}{text}\033[0m"
        rows.append(text)
    return "\n".join(head + rows) + "\n"
