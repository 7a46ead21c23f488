"""Why something does not apply: :class:`Miss`, the short reason a pattern (or an analysis
it calls) gives instead of a match, and :func:`need`, which ends a match at the first one.

The lowest module of the core: patterns, the match language, the layout rules and the
search all speak in Misses, so it imports nothing of the package.
"""

from __future__ import annotations

from typing import Any


class Miss(str):
    """Why a pattern does not apply at a node: a short reason, e.g. ``"input is not 2-D"``.

    A ``str`` subclass so patterns can ``return Miss("...")`` cheaply in the hot path.
    ``partial`` (set by :mod:`optimus_lens.core.lang`) lists the nodes matched before the failure.
    """

    partial: list


def is_miss(x: Any) -> bool:
    """True for a :class:`Miss` and for None (an answer that is no match either)."""
    return x is None or isinstance(x, Miss)


class Refused(Exception):
    """Raised by :func:`need` to end a match early; :meth:`optimus_lens.core.pattern.AnchoredPattern.match`
    returns its ``miss``."""

    def __init__(self, miss: Miss):
        super().__init__(miss)
        self.miss = miss


def need(value: Any) -> Any:
    """``value``, unless it is a :class:`Miss`: then the match in progress ends with it
    (raises :class:`Refused`, which :meth:`optimus_lens.core.pattern.AnchoredPattern.match`
    turns back into the Miss). ``p = need(parts_of(node))`` replaces ``p = parts_of(node);
    if isinstance(p, Miss): return p``."""
    if isinstance(value, Miss):
        raise Refused(value)
    return value
