"""After a step is checked: views of what it replaced get example values in the new storage.

A view's example value shares the storage of what it views (FakeTensors keep storages), and
which graph outputs overlap which inputs is read from those storages
(:mod:`optimus_lens.core.outputs`), so a view whose input a step replaced must be re-read.
"""

from __future__ import annotations

from collections import deque

from torch.fx import Node

from optimus_lens.core import aliasing, meta
from optimus_lens.core.effects import effect
from optimus_lens.core.rewriter import Rewriter


def refresh_views(rw: Rewriter) -> list[Node]:
    """Recompute the example value of every node the step of ``rw`` rewired that may share its
    storage with an input (a view: ``reshape``, ``getitem`` of a split, ...), and of the
    views taken of those, so a view's value lies in the storage of what it views now,
    not of the value it viewed before (which outputs overlap is read from those
    storages). Journaled; a value that cannot be recomputed is kept. Returns the nodes
    refreshed."""
    fresh = rw.created_ids
    todo = deque(n for n in rw.changed if not n._erased and id(n) not in fresh)
    seen: set[Node] = set()
    done: list[Node] = []
    while todo:
        n = todo.popleft()
        if n in seen or n.op not in ("call_function", "call_method"):
            continue
        seen.add(n)
        if not effect(n).aliases:
            continue
        key, old = meta.value_key(n), meta.value(n)
        try:
            with aliasing.state_before(rw.graph, n):
                got = meta.infer(n)
        except Exception:  # noqa: BLE001 - keep the old value: the op's own checks ran when it was made
            got = None
        if old is None:
            n.meta.pop(key, None)
        else:
            n.meta[key] = old
        if got is None:
            continue
        rw.set_meta(n, key, got)
        done.append(n)
        todo.extend(u for u in n.users if u not in seen)
    return done
