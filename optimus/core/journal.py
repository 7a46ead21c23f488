"""A step's journal: what the Rewriter writes before each change, and :func:`undo`, which
restores exactly the graph before the step from it: the same Node objects, in the same list
order, with the same arguments, users (in the same order) and metadata.

Entries, oldest first: ``("create", node)``; ``("erase", node, prev, args, kwargs)``;
``("args", node, args, kwargs)`` and ``("args-each", [(node, args, kwargs), ...])`` (a node's
arguments before a change, FX's own tuples and immutable dicts, which it replaces and never
edits); ``("users", node, [users...])`` (its users in order before the step first changed
them); ``("meta", node, key, value or MISSING)``; ``("meta-all", node, meta)``.
"""

from __future__ import annotations

from torch.fx import Graph, Node
from torch.fx.node import map_arg

from optimus_lens.core import aliasing

MISSING = object()  # a meta key the node did not have


def undo(g: Graph, journal: list[tuple]) -> None:
    """Undo every entry of ``journal`` on graph ``g``, newest first; the effect analysis is told
    of every node the entries name."""
    aliasing.touch(g, [n for e in journal for n in ([u for u, _, _ in e[1]] if e[0] == "args-each" else [e[1]])])
    for entry in reversed(journal):
        kind = entry[0]
        if kind == "create":
            if not entry[1]._erased:
                _unlink(g, entry[1])
        elif kind == "erase":
            _, n, prev, args, kwargs = entry
            _relink(g, n, prev, args, kwargs)
        elif kind == "args":
            _, n, args, kwargs = entry
            n.args, n.kwargs = args, kwargs
        elif kind == "args-each":
            for n, args, kwargs in reversed(entry[1]):
                n.args, n.kwargs = args, kwargs
        elif kind == "users":
            _, n, order = entry
            users = n.users
            if set(users) == set(order):
                users.clear()
                users.update(dict.fromkeys(order))
        elif kind == "meta-all":
            _, n, saved = entry
            n.meta.clear()
            n.meta.update(saved)
        elif kind == "meta":
            _, n, key, old = entry
            if old is MISSING:
                n.meta.pop(key, None)
            else:
                n.meta[key] = old


def _unlink(g: Graph, n: Node) -> None:
    """Remove a node created by the step without calling the GraphModule's hooks."""
    g._find_nodes_lookup_table.remove(n)
    n._remove_from_list()
    n._erased = True
    g._len -= 1
    n.args, n.kwargs = map_arg(n.args, lambda _: None), map_arg(dict(n.kwargs), lambda _: None)


def _relink(g: Graph, n: Node, prev: Node, args: tuple, kwargs: dict) -> None:
    """Put an erased node back after ``prev`` with its arguments (and so its uses)."""
    n._prev = n._next = n
    n._erased = False
    prev._next._prepend(n)
    g._len += 1
    g._find_nodes_lookup_table.insert(n)
    n.args, n.kwargs = args, kwargs
