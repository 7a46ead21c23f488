"""Memo tables for a block in which the graph does not change, and per-graph state kept
on the graph itself.

A pattern's ``key`` / ``match`` (and the effect queries they make,
:func:`optimus_lens.core.effects.is_written`) may memoise graph-wide facts while the graph
stands still: the engine keys every node of a pass inside one :func:`graph_unchanged`
block, and the tables are dropped when it ends, before any step changes the graph.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

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


def kept(graph: Any, name: str) -> Any:
    """What :func:`keep` stored on ``graph`` under ``name``, or None. It lives in the graph's
    own ``__dict__``, so it is freed with the graph: a module-level table keyed by the graph,
    even a weak one, keeps every graph alive through a value that refers to it (its nodes).
    A shallow copy of the graph (``copy.copy``, which copies the ``__dict__``) does not read
    the original's."""
    hit = graph.__dict__.get(name)
    return hit[1] if hit is not None and hit[0] is graph else None


def keep(graph: Any, name: str, value: Any) -> Any:
    """Store ``value`` on ``graph`` under ``name`` (see :func:`kept`); returns it."""
    graph.__dict__[name] = (graph, value)
    return value
