"""Building the replacements of the split/cat patterns, through the Rewriter: rewiring a
node to its replacement, getitems made on demand, a run of pieces as one view of the
split/unbind input (:func:`as_block`) and a cat/stack rebuilt around such views
(:func:`rebuild`)."""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch
from torch.fx import Node

from optimus_lens.core.rewriter import Rewriter
from optimus_lens.passes.common import STACK, is_call
from optimus_lens.passes.split_cat.analysis import Run


def carry_meta(rw: Rewriter, old: Node, new: Node) -> None:
    """Give a created node the source location and module path of the node it replaces."""
    rw.carry_meta(old, new)


def swap(rw: Rewriter, old: Node, new: Node) -> None:
    """Rewire every use of ``old`` to ``new`` and erase ``old``. A ``new`` without users yet
    (one the rewrite just created) takes over ``old``'s source location and module path."""
    if not new.users:
        carry_meta(rw, old, new)
    rw.replace_all_uses(old, new)
    rw.erase(old)


def erase_if_unused(rw: Rewriter, nodes: list[Node]) -> None:
    """Erase each of ``nodes`` that is still in the graph and has no users, in the given order."""
    for n in nodes:
        if not n._erased and not n.users:
            rw.erase(n)


def getitems_of(rw: Rewriter, node: Node) -> Callable[[int], Node]:
    """``get(i)``: the getitem ``node[i]``, created on first use at the insert point."""
    made: dict[int, Node] = {}

    def get(i: int) -> Node:
        if i not in made:
            made[i] = rw.call(operator.getitem, node, i)
        return made[i]

    return get


def movedim(rw: Rewriter, t: Node, src: int, dst: int) -> Node:
    """``movedim(t, src, dst)``, or ``t`` itself when ``src == dst``."""
    return t if src == dst else rw.call(torch.movedim, t, src, dst)


def as_block(rw: Rewriter, span: Node, run: Run, stack: bool, e: int) -> Node:
    """``cat(pieces, e)`` (or ``stack(pieces, e)``) of the ``run.n`` consecutive pieces, built
    from ``span``, the run's extent of the split/unbind input along its dim ``a``:

    * unbind: ``movedim(span, a, e)`` for a stack; flattened over ``(e, e+1)`` for a cat;
    * split, cat on ``a``: ``span`` itself;
    * split, otherwise (pieces of one size k): ``movedim(unflatten(span, a, (n, k)), a, e)``,
      flattened over ``(e, e+1)`` for a cat.

    Right for every pair of dims (upstream swaps the two dims with a permute, which is
    wrong when they are two or more apart)."""
    p = run.parts
    if not p.unbind and not stack and e == p.dim:
        return span
    t = span if p.unbind else rw.call(torch.unflatten, span, p.dim, (run.n, p.sizes[run.first]))
    t = movedim(rw, t, p.dim, e)
    return t if stack else rw.call(torch.flatten, t, e, e + 1)


def rebuild(rw: Rewriter, user: Node, segs: list, block_of: Callable[[Run], Node | None], e: int) -> None:
    """Replace the cat/stack ``user`` (its list grouped into ``segs``) by ``cat(parts, e)``:
    each Run that ``block_of`` turns into a block is that block; other entries stay as
    they are in a cat, and consecutive ones are stacked together in a stack. A single part
    replaces ``user`` directly. New nodes go before ``user``."""
    stack = is_call(user, *STACK)
    parts: list[Node] = []
    loose: list[Node] = []
    with rw.inserting_before(user):
        for s in segs:
            b = block_of(s) if isinstance(s, Run) else None
            if b is None:
                (loose if stack else parts).extend(s.items if isinstance(s, Run) else [s])
                continue
            if loose:
                parts.append(rw.call(torch.stack, loose, dim=e))
                loose = []
            parts.append(b)
        if loose:
            parts.append(rw.call(torch.stack, loose, dim=e))
        swap(rw, user, parts[0] if len(parts) == 1 else rw.call(torch.cat, parts, dim=e))
