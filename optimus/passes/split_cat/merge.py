"""Upstream's merging split/cat passes in our form (torch/_inductor/fx_passes/split_cat.py):
``merge_splits_pass``, ``merge_getitem_cat_pass`` and ``mutate_cat_pass``. Each turns
consecutive split pieces that are put back together into one coarser piece (a wider
section of a split, or a ``narrow`` of its input). Unlike upstream they read sizes and dims
from example values and refuse any site whose values (or values aliasing them) are written
in place."""

from __future__ import annotations

import torch
from torch.fx import Node

from optimus_lens.core.miss import Miss, need
from optimus_lens.core.pattern import AnchoredPattern, Match, register
from optimus_lens.core.rewriter import Rewriter
from optimus_lens.passes.common import CAT, SPLIT, is_getitem
from optimus_lens.passes.split_cat.analysis import (
    Parts,
    Run,
    getitem_users,
    mutation_miss,
    piece_index,
    single_run,
    split_parts,
)
from optimus_lens.passes.split_cat.build import erase_if_unused, getitems_of, swap


@register
class MergeSplits(AnchoredPattern):
    """``a = split(x, A, d); b = split(a[i], B, d)`` -> ``split(x, A[:i] + B + A[i+1:], d)``,
    the getitems of both renumbered (``a[j]`` -> ``new[j]`` for j < i, ``new[j+len(B)-1]``
    for j > i; ``b[k]`` -> ``new[i+k]``)."""

    name = "merge_splits"
    upstream = "merge_splits_pass (merge_splits)"
    description = "A split of a split piece on the same dim becomes one split with the sections spliced in."
    preconditions = (
        "the split's input is getitem i of another split, used only by this split",
        "same dim (after normalising negative dims); sizes read from example values",
        "every user of both splits is a getitem with a constant index",
        "no value aliasing the input is written in place",
    )
    anchors = frozenset(SPLIT[0]) | frozenset(SPLIT[1])

    def find(self, node: Node):
        inner = need(split_parts(node))
        g = inner.input
        outer = split_parts(g.args[0]) if is_getitem(g) and isinstance(g.args[0], Node) else None
        if not isinstance(outer, Parts):
            return Miss("the split's input is not a piece of another split")
        i = piece_index(g, outer)
        if i is None:
            return Miss("the split's input is not a constant piece of another split")
        if outer.dim != inner.dim:
            return Miss(f"outer split dim {outer.dim} != inner split dim {inner.dim}")
        if list(g.users) != [node]:
            return Miss(f"piece {i} of the outer split has other users")
        a_items, b_items = need(getitem_users(outer)), need(getitem_users(inner))
        if not b_items:
            return Miss("the inner split has no users")
        return mutation_miss(outer.input) or Match(
            node,
            [node, *(h for h, _ in b_items), outer.node, *(h for h, _ in a_items)],
            {"outer": outer, "inner": inner, "index": i, "a": a_items, "b": b_items},
        )

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        outer, inner, i = m.info["outer"], m.info["inner"], m.info["index"]
        sizes = outer.sizes[:i] + inner.sizes + outer.sizes[i + 1 :]
        with rw.inserting_before(outer.node):  # erased last, so the insert point stays live
            new = rw.call(torch.split, outer.input, sizes, dim=outer.dim)
            get = getitems_of(rw, new)
            for h, k in m.info["b"]:
                swap(rw, h, get(i + k))
            rw.erase(inner.node)
            for h, j in m.info["a"]:
                if j == i:
                    rw.erase(h)
                else:
                    swap(rw, h, get(j if j < i else j + len(inner.sizes) - 1))
        rw.erase(outer.node)


@register
class MergeGetitemCat(AnchoredPattern):
    """``s = split(x, [a, b, c], d); y = cat([s0, s1], d)`` -> ``s = split(x, [a+b, c], d);
    y = s[0]``, the other getitems renumbered."""

    name = "merge_getitem_cat"
    upstream = "merge_getitem_cat_pass (merge_getitem_cat)"
    description = "A cat of consecutive split pieces used nowhere else becomes one piece of a coarser split."
    preconditions = (
        "the cat's inputs are >= 2 consecutive pieces, in order, of one split, on the split's dim",
        "each of those getitems is used only by the cat",
        "every user of the split is a getitem with a constant index",
        "no value aliasing the input or the cat is written in place",
    )
    anchors = frozenset(CAT[0])

    def find(self, node: Node):
        run, _ = need(single_run(node))
        if run.n < 2:
            return Miss("the cat takes a single piece")
        if any(len(g.users) != 1 for g in run.items):
            return Miss("a piece in the cat has other users")
        items = need(getitem_users(run.parts))
        return mutation_miss(run.parts.input, node) or Match(
            node, [node, *(g for g, _ in items), run.parts.node], {"run": run, "items": items}
        )

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        run: Run = m.info["run"]
        p = run.parts
        sizes = p.sizes[: run.first] + [run.length] + p.sizes[run.last + 1 :]
        with rw.inserting_before(p.node):  # erased last, so the insert point stays live
            get = getitems_of(rw, rw.call(torch.split, p.input, sizes, dim=p.dim))
            swap(rw, m.anchor, get(run.first))
            for g, j in m.info["items"]:
                if run.first <= j <= run.last:
                    rw.erase(g)
                else:
                    swap(rw, g, get(j if j < run.first else j - run.n + 1))
        rw.erase(p.node)


@register
class MutateCat(AnchoredPattern):
    """``y = cat([s_i .. s_j], d)`` of consecutive pieces of ``s = split(x, sizes, d)`` ->
    ``y = narrow(x, d, offset_i, size_i + .. + size_j)``; ``y = x`` when they are all the pieces."""

    name = "mutate_cat"
    upstream = "mutate_cat_pass (mutate_cat_node)"
    description = "A cat of consecutive split pieces on the split's dim is a slice of the split's input."
    preconditions = (
        "the cat's inputs are consecutive pieces, in order, of one split, on the split's dim",
        "(the getitems may have other users)",
        "no value aliasing the input or the cat is written in place",
    )
    anchors = frozenset(CAT[0])

    def find(self, node: Node):
        run, _ = need(single_run(node))
        return mutation_miss(run.parts.input, node) or Match(node, [node, *run.items, run.parts.node], {"run": run})

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        run: Run = m.info["run"]
        cat, *rest = m.nodes
        if run.full:
            rw.replace_all_uses(cat, run.parts.input)
            rw.erase(cat)
        else:
            with rw.inserting_before(cat):
                swap(rw, cat, rw.call(torch.narrow, run.parts.input, run.parts.dim, run.offset, run.length))
        erase_if_unused(rw, rest)
