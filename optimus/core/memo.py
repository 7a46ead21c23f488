"""Memo tables for a block in which the graph does not change.

A pattern's ``key`` / ``match`` (and the effect queries they make,
:func:`optimus_lens.core.effects.is_written`) may memoise graph-wide facts while the graph
stands still: the engine keys every node of a pass inside one :func:`graph_unchanged`
block, and the tables are dropped when it ends, before any step changes the graph.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

_UNCHANGED: dict[str, dict] | None = None  # memo tables, only inside graph_unchanged()


@contextmanager
def graph_unchanged() -> Iterator[None]:
    """A block in which the graph is not changed, so a pattern's ``key``/``match`` may
    memoise graph-wide facts in :func:`unchanged_memo` tables (the engine keys every node
    of a pass inside one block). Nested blocks share the outer block's tables; all are
    dropped when the outermost block ends."""
    global _UNCHANGED
    if _UNCHANGED is not None:
        yield
        return
    _UNCHANGED = {}
    try:
        yield
    finally:
        _UNCHANGED = None


def unchanged_memo(name: str) -> dict | None:
    """The memo table ``name`` of the current :func:`graph_unchanged` block (created empty
    on first use), or None outside one: then nothing may be memoised."""
    if _UNCHANGED is None:
        return None
    return _UNCHANGED.setdefault(name, {})
