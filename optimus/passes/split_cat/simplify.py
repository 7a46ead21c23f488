"""Upstream's ``split_cat_pass`` and ``unbind_stack_pass`` in our form
(torch/_inductor/fx_passes/split_cat.py: ``SplitCatSimplifier``, ``merge_split_squeeze``,
``UnbindCatRemover``): runs of consecutive pieces that a cat or stack takes in order become
one piece of a coarser split, or one view of the split/unbind input (:func:`as_block`);
a split into size-1 pieces that are all squeezed becomes an unbind."""

from __future__ import annotations

import torch
from torch.fx import Node

from optimus_lens.core import meta
from optimus_lens.core.miss import Miss, need
from optimus_lens.core.pattern import AnchoredPattern, Match, register
from optimus_lens.core.rewriter import Rewriter
from optimus_lens.passes.common import SPLIT, STACK, UNBIND, arg, dim_of, is_call
from optimus_lens.passes.split_cat.analysis import (
    Parts,
    Run,
    block_ok,
    cat_stack_layouts,
    getitem_users,
    mutation_miss,
    split_parts,
    unbind_parts,
)
from optimus_lens.passes.split_cat.build import as_block, carry_meta, erase_if_unused, getitems_of, rebuild, swap


@register
class SimplifySplitCat(AnchoredPattern):
    """``SplitCatSimplifier`` in our form: wherever a cat or stack takes a run of consecutive
    pieces in order, that run becomes one piece of a coarser split (unused pieces between
    used ranges merge too), laid out as the user lays it out (:func:`as_block`: the piece
    itself in a cat on the split's dim, ``unflatten`` + ``movedim`` (+ ``flatten``) on other
    dims or in a stack). A user left with one part is dropped.

    Example: ``s = split(x, [4]*8, 1); y = cat([o, s1, s2, s3, o, s5, s6, s7, o], 1)`` ->
    ``t = split(x, [4, 12, 4, 12], 1); y = cat([o, t1, o, t3, o], 1)``. When every piece
    ends up in one range the split is removed (the range is ``x`` itself).
    """

    name = "simplify_split_cat"
    upstream = "split_cat_pass (simplify_split_cat, SplitCatSimplifier)"
    description = "Merge runs of consecutive split pieces that a cat/stack takes in order into one piece."
    preconditions = (
        "every user of the split is a getitem with a constant index",
        "a run is >= 2 consecutive pieces, in order, in a cat or stack (of one size unless "
        "in a cat on the split's dim)",
        "the piece ranges used anywhere do not overlap",
        "fewer sections result than the split has",
        "no value aliasing the input or a rewritten cat/stack is written in place",
    )
    anchors = frozenset(SPLIT[0]) | frozenset(SPLIT[1])

    def find(self, node: Node):
        p = need(split_parts(node))
        items = need(getitem_users(p))
        layouts = cat_stack_layouts(p, items)
        merged = {
            u: [s for s in segs if isinstance(s, Run) and s.n > 1 and block_ok(s, is_call(u, *STACK), e)]
            for u, (segs, e) in layouts.items()
        }
        merged = {u: runs for u, runs in merged.items() if runs}
        ranges = {(r.first, r.last) for runs in merged.values() for r in runs}
        ranges |= {(i, i) for g, i in items if any(u not in merged for u in g.users)}
        ranges |= {
            (i, i)
            for u in merged
            for s in layouts[u][0]
            if isinstance(s, Run) and s not in merged[u]
            for i in range(s.first, s.last + 1)
        }
        if not ranges:
            return Miss("no piece of the split is used")
        ordered = sorted(ranges)
        for (a0, a1), (b0, b1) in zip(ordered, ordered[1:]):
            if b0 <= a1:
                return Miss(f"piece ranges {a0}..{a1} and {b0}..{b1} overlap")
        sections, cur = [], 0
        for a, b in ordered:
            if cur < a:
                sections.append((cur, a - 1))
            sections.append((a, b))
            cur = b + 1
        if cur < len(p.sizes):
            sections.append((cur, len(p.sizes) - 1))
        if len(sections) == len(p.sizes):
            return Miss("no run of consecutive pieces to merge")
        users = list(merged)
        return mutation_miss(p.input, *users) or Match(
            node,
            [node, *(g for g, _ in items), *users],
            {
                "parts": p,
                "items": items,
                "sections": sections,
                "ranges": ranges,
                "layouts": {u: layouts[u] for u in users},
                "merged": merged,
            },
        )

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        p: Parts = m.info["parts"]
        sections, merged, needed = m.info["sections"], m.info["merged"], m.info["ranges"]
        with rw.inserting_before(p.node):  # erased last, so the insert point stays live
            if len(sections) == 1:
                new_of = {r: p.input for r in needed}
            else:
                sizes = [sum(p.sizes[a : b + 1]) for a, b in sections]
                get = getitems_of(rw, rw.call(torch.split, p.input, sizes, dim=p.dim))
                new_of = {r: get(sections.index(r)) for r in sorted(needed)}
        for user, (segs, e) in m.info["layouts"].items():
            chosen = {id(r) for r in merged[user]}
            stack = is_call(user, *STACK)
            rebuild(
                rw,
                user,
                segs,
                lambda r, stack=stack, e=e, chosen=chosen: (
                    as_block(rw, new_of[(r.first, r.last)], r, stack, e) if id(r) in chosen else None
                ),
                e,
            )
        for g, i in m.info["items"]:
            if g.users:
                new = new_of[(i, i)]
                if new is not p.input:
                    carry_meta(rw, g, new)
                rw.replace_all_uses(g, new)
            rw.erase(g)
        rw.erase(p.node)


def _squeeze_dim(node: Node) -> int | None:
    """The normalised dim of a ``torch.squeeze`` / ``x.squeeze`` node with one int dim, else None."""
    if not is_call(node, {torch.squeeze}, {"squeeze"}) or meta.tensor(node.args[0] if node.args else None) is None:
        return None
    return dim_of(arg(node, 1, "dim"), meta.tensor(node.args[0]).dim())


@register
class MergeSplitSqueeze(AnchoredPattern):
    """``s = split(x, 1, d); y_i = squeeze(s[i], d)`` for every use -> ``u = unbind(x, d); y_i = u[i]``."""

    name = "merge_split_squeeze"
    upstream = "split_cat_pass (merge_split_squeeze)"
    description = "A split into size-1 pieces that are all squeezed on the split dim is an unbind."
    preconditions = (
        "every section of the split has size 1",
        "every user of every piece is a squeeze on the split's dim (normalised; one int dim)",
        "every user of the split is a getitem with a constant index",
        "no value aliasing the input is written in place",
    )
    anchors = frozenset(SPLIT[0]) | frozenset(SPLIT[1])

    def find(self, node: Node):
        p = need(split_parts(node))
        if any(s != 1 for s in p.sizes):
            return Miss("not every section has size 1")
        items = need(getitem_users(p))
        squeezes = [(u, i) for g, i in items for u in g.users]
        if not squeezes:
            return Miss("no piece is used")
        bad = [u.name for u, _ in squeezes if _squeeze_dim(u) != p.dim]
        if bad:
            return Miss(f"{bad[0]} is not a squeeze on the split's dim {p.dim}")
        return mutation_miss(p.input) or Match(
            node,
            [node, *(g for g, _ in items), *(u for u, _ in squeezes)],
            {"parts": p, "items": items, "squeezes": squeezes},
        )

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        p: Parts = m.info["parts"]
        with rw.inserting_before(p.node):
            get = getitems_of(rw, rw.call(torch.unbind, p.input, dim=p.dim))
            for u, i in m.info["squeezes"]:
                swap(rw, u, get(i))
        for g, _ in m.info["items"]:
            rw.erase(g)
        rw.erase(p.node)


@register
class MergeUnbindStack(AnchoredPattern):
    """``UnbindCatRemover`` in our form: when every use of every piece of ``u = unbind(y, a)``
    is inside a run of all the pieces, in order, in a cat or stack, each such run becomes a
    view of ``y`` (``movedim(y, a, e)``, flattened for a cat); other entries of a stack are
    stacked, and the parts joined with a cat. The unbind goes."""

    name = "merge_unbind_stack"
    upstream = "unbind_stack_pass (merge_unbind_stack, UnbindCatRemover)"
    description = "Replace cats/stacks of all the pieces of an unbind, in order, by views of its input."
    preconditions = (
        "every piece of the unbind has a getitem, and every use of a piece is in a run of all "
        "the pieces, in order, in a cat or stack (any dims; other entries allowed)",
        "no value aliasing the input or a rewritten cat/stack is written in place",
    )
    anchors = frozenset(UNBIND[0]) | frozenset(UNBIND[1])

    def find(self, node: Node):
        p = need(unbind_parts(node))
        items = need(getitem_users(p))
        if {i for _, i in items} != set(range(len(p.sizes))):
            return Miss("not every piece of the unbind is used")
        layouts = cat_stack_layouts(p, items)
        if any(u not in layouts for g, _ in items for u in g.users) or any(
            isinstance(s, Run) and not s.full for segs, _ in layouts.values() for s in segs
        ):
            return Miss("a piece is used outside a run of all the pieces in a cat or stack")
        return mutation_miss(p.input, *layouts) or Match(
            node, [node, *(g for g, _ in items), *layouts], {"parts": p, "items": items, "layouts": layouts}
        )

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        p: Parts = m.info["parts"]
        for user, (segs, e) in m.info["layouts"].items():
            stack = is_call(user, *STACK)
            rebuild(
                rw, user, segs, lambda r, stack=stack, e=e: as_block(rw, p.input, r, stack, e) if r.full else None, e
            )
        erase_if_unused(rw, [*(g for g, _ in m.info["items"]), p.node])
