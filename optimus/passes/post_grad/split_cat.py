"""Post-grad split/cat patterns on ATen graphs (upstream: the ``*_aten_pass`` entries of
``POST_GRAD_PATTERNS``, torch/_inductor/fx_passes/split_cat.py).

Sizes and dims are read from ``meta["val"]`` and normalised here, so no pattern needs
``normalization_aten_pass`` to have run first (upstream's do). Where these differ from
upstream, on purpose:

* ``normalize_split_aten`` takes the section sizes from the pieces' values, so an uneven
  split (``split(x, 4)`` of 10 columns: 4, 4, 2) stays right; upstream writes ``n`` equal
  sections (4, 4, 4), and the rewritten ``split_with_sizes`` raises;
* already-normal nodes are left alone (upstream rewrites every ``cat`` and counts it);
* ``merge_unbind_stack_aten`` also checks each ``unsqueeze``'s dim and that the
  ``select``\\ s cover the whole dim (upstream checks neither: ``unsqueeze`` on another dim,
  or selects of the first ``n`` of more rows, give a different tensor than the parent),
  and accepts the ``select.int`` of any graph, not only the ``aten.select`` packet
  upstream's own fusions create;
* ``move_view_after_cat`` fires only where the result equals a reshape of the split input
  (every piece reshaped keeping its leading block, or every piece of size 1 squeezed);
  upstream swaps the split and cat dims with a ``permute``, which reorders elements for
  other reshapes and for dims two or more apart;
* a replacement by an existing value keeps the layout a use reads
  (:func:`optimus_lens.core.strides.replace_miss`) and refuses a value written in place.
"""

from __future__ import annotations

import copy
import math

from torch.fx import Node

from optimus_lens.core import meta
from optimus_lens.core.aliasing import is_written
from optimus_lens.core.miss import Miss, need
from optimus_lens.core.pattern import AnchoredPattern, Match, register
from optimus_lens.core.rewriter import Rewriter
from optimus_lens.core.strides import replace_miss
from optimus_lens.passes.post_grad.common import (
    CAT,
    CATS,
    PERMUTE,
    RESHAPE,
    SELECTS,
    SLICE,
    SPLIT,
    SPLIT_WITH_SIZES,
    UNSQUEEZES,
    VIEW,
    getitem_of,
    is_aten,
    norm_dim,
    schema_args,
    static_shape,
)

POST_GRAD = "post-grad"


def _written(*nodes: Node) -> Miss | None:
    for n in nodes:
        if is_written(n):
            return Miss(f"{n.name} (or a tensor sharing its storage) is written in place")
    return None


def _arg(node: Node, i: int, name: str):
    """Argument ``i`` (or keyword ``name``) of ``node``: select / unsqueeze nodes of either
    spelling (upstream's fusions create them with the packet and positional arguments)."""
    return node.args[i] if len(node.args) > i else node.kwargs.get(name)


def _erase_unused(rw: Rewriter, nodes: list[Node]) -> None:
    for n in nodes:
        if not n._erased and not n.users:
            rw.erase(n)


def cat_parts(node: Node) -> tuple[list, int] | Miss:
    """(tensors, normalised dim) of an ``aten.cat`` node, or a Miss."""
    if not is_aten(node, CATS):
        return Miss("not an aten.cat node")
    a = need(schema_args(node)) if node.target is CAT else {"tensors": node.args[0], "dim": node.kwargs.get("dim", 0)}
    tensors = a["tensors"]
    out = meta.tensor(node)
    if out is None or not isinstance(tensors, (list, tuple)):
        return Miss("cat has no tensor value or no list of tensors")
    d = norm_dim(a["dim"], out.dim())
    if d is None:
        return Miss(f"cat dim {a['dim']!r} is not a static int")
    return list(tensors), d


# ------------------------------------------------------------------ normalization


class _Replace(AnchoredPattern):
    """Replaces the anchor by a new node of ``target`` with ``args``/``kwargs`` (uses moved,
    the old node erased, its metas carried)."""

    stage = POST_GRAD

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        old = m.anchor
        with rw.inserting_before(old):
            new = rw.create("call_function", m.info["target"], m.info["args"], m.info["kwargs"])
        rw.carry_meta(old, new)
        rw.replace_all_uses(old, new)
        rw.erase(old)


@register
class NormalizeSplitAten(_Replace):
    """``aten.split.Tensor(x, s, d)`` -> ``aten.split_with_sizes(x, sizes, dim=d >= 0)``
    with ``sizes`` read from the pieces' values (4, 4, 2 for ``split(x, 4)`` of 10)."""

    name = "normalize_split_aten"
    anchors = frozenset({SPLIT})
    upstream = "normalize_split_default_aten (normalization_aten_pass)"
    description = "Rewrite aten.split(x, size, dim) as split_with_sizes(x, sizes, dim=d >= 0), sizes from the values."
    preconditions = (
        "aten.split.Tensor with a static split size and dim; the pieces have values (meta['val'])",
        "the sizes are the pieces' own sizes: uneven splits stay right (upstream repeats the first)",
    )

    def find(self, node: Node):
        a = need(schema_args(node))
        x = a["self"]
        xs = need(static_shape(x))
        d = norm_dim(a["dim"], len(xs))
        if d is None:
            return Miss(f"dim {a['dim']!r} is not a static int")
        pieces = meta.value(node)
        if not isinstance(pieces, (list, tuple)) or not pieces:
            return Miss("the split has no values for its pieces")
        sizes = [p.shape[d] for p in pieces]
        if not all(type(s) is int for s in sizes):
            return Miss("section sizes are symbolic")
        return Match(node, [node], {"target": SPLIT_WITH_SIZES, "args": (x, sizes), "kwargs": {"dim": d}})


@register
class NormalizeSplitWithSizesAten(_Replace):
    """``aten.split_with_sizes(x, sizes, d)`` with ``d`` negative or positional ->
    ``split_with_sizes(x, sizes, dim=d >= 0)``; a node already in that form is left alone."""

    name = "normalize_split_with_sizes_aten"
    anchors = frozenset({SPLIT_WITH_SIZES})
    upstream = "normalize_split_with_size_default_aten (normalization_aten_pass)"
    description = "Write split_with_sizes' dim as a keyword >= 0."
    preconditions = (
        "aten.split_with_sizes with static sizes and dim",
        "not already split_with_sizes(x, sizes, dim=d >= 0)",
    )

    def find(self, node: Node):
        a = need(schema_args(node))
        x, sizes = a["self"], a["split_sizes"]
        xs = need(static_shape(x))
        d = norm_dim(a["dim"], len(xs))
        if d is None:
            return Miss(f"dim {a['dim']!r} is not a static int")
        if not all(type(s) is int for s in sizes):
            return Miss("section sizes are not static ints")
        args, kwargs = (x, list(sizes)), {"dim": d}
        if tuple(node.args) == args and dict(node.kwargs) == kwargs:
            return Miss("already normal: split_with_sizes(x, sizes, dim=d >= 0)")
        return Match(node, [node], {"target": SPLIT_WITH_SIZES, "args": args, "kwargs": kwargs})


@register
class NormalizeCatAten(_Replace):
    """``aten.cat(tensors, d)`` with ``d`` negative or positional -> ``cat(tensors, dim=d >= 0)``;
    a node already in that form is left alone (upstream rewrites and counts every cat)."""

    name = "normalize_cat_aten"
    anchors = frozenset({CAT})
    upstream = "normalize_cat_default_aten (normalization_aten_pass)"
    description = "Write cat's dim as a keyword >= 0."
    preconditions = ("aten.cat with a static dim and a value", "not already cat(tensors, dim=d >= 0)")

    def find(self, node: Node):
        tensors, d = need(cat_parts(node))
        args, kwargs = (list(tensors),), {"dim": d}
        if tuple(node.args) == args and dict(node.kwargs) == kwargs:
            return Miss("already normal: cat(tensors, dim=d >= 0)")
        return Match(node, [node], {"target": CAT, "args": args, "kwargs": kwargs})


# ------------------------------------------------------------------ unbind / stack


@register
class MergeUnbindStackAten(AnchoredPattern):
    """``cat([unsqueeze(select(p, d, i), d) for i in 0..n-1], d)`` with ``n = p.shape[d]``
    -> ``p``: the stack of every piece of one unbind, which upstream's post-grad fusions
    leave when one fused op feeds another; a stack of evenly spaced pieces ``a, a + s, ..,
    b`` (upstream: only every piece) -> ``slice(p, d, a, b + 1, s)``, when one fused op
    feeds two (the gates and the transforms of a highway layer, interleaved)."""

    stage = POST_GRAD
    name = "merge_unbind_stack_aten"
    anchors = frozenset(CATS)
    upstream = "merge_unbind_stack_aten (unbind_stack_aten_pass)"
    description = "Remove cat(unsqueeze(select(p, d, i), d) for consecutive i) along d: it is p, or a slice of it."
    preconditions = (
        "every cat input is unsqueeze(select(p, d, i), d) of one p, with the cat's dim d",
        "the indices are evenly spaced and in order: all of p along d gives p, a, a + s, .., b gives "
        "slice(p, d, a, b + 1, s) (upstream checks neither the unsqueeze dim nor that every piece is there)",
        "the cat's uses do not depend on a layout p does not have; p is not written in place",
    )

    def find(self, node: Node):
        tensors, d = need(cat_parts(node))
        parent, first, step = None, 0, 1
        for i, u in enumerate(tensors):
            if not is_aten(u, UNSQUEEZES):
                return Miss(f"input {i} of the cat is not an unsqueeze")
            s, ud = _arg(u, 0, "self"), _arg(u, 1, "dim")
            if not is_aten(s, SELECTS):
                return Miss(f"input {i} of the cat is an unsqueeze of {getattr(s, 'name', s)}, not of a select")
            p, sd, idx = _arg(s, 0, "self"), _arg(s, 1, "dim"), _arg(s, 2, "index")
            ps = need(static_shape(p))
            if parent is None:
                parent = p
            elif p is not parent:
                return Miss(f"input {i} selects from {p.name}, not from {parent.name}")
            if norm_dim(sd, len(ps)) != d or norm_dim(ud, len(ps)) != d:
                return Miss(f"input {i}: select dim {sd} and unsqueeze dim {ud} are not the cat's dim {d}")
            j = norm_dim(idx, ps[d])
            if j is None:
                return Miss(f"input {i} selects index {idx}, not a static index of {parent.name}")
            if i == 0:
                first = j
            elif i == 1:
                step = j - first
            want = first + i * (step if i else 0)
            if step < 1 or j != want:
                return Miss(f"input {i} selects index {idx}, not {want}: the pieces are not evenly spaced, in order")
        if parent is None:
            return Miss("the cat has no inputs")
        n = static_shape(parent)[d]  # type: ignore[index]
        whole = len(tensors) == n and step == 1
        if meta.tensor(parent).dtype != meta.tensor(node).dtype:
            return Miss("the cat's dtype differs from the parent's")
        miss = _written(parent) or (replace_miss(node, parent) if whole else None)
        if miss:
            return miss
        selects = [_arg(u, 0, "self") for u in tensors]
        span = None if whole else (d, first, first + (len(tensors) - 1) * step + 1, step)
        return Match(node, [node, *tensors, *dict.fromkeys(selects)], {"parent": parent, "span": span})

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        new = m.info["parent"]
        if m.info["span"] is not None:
            with rw.inserting_before(m.anchor):
                new = rw.call(SLICE, new, *m.info["span"])
            rw.carry_meta(m.anchor, new)
        rw.replace_all_uses(m.anchor, new)
        rw.erase(m.anchor)
        _erase_unused(rw, m.nodes[1:])


# ------------------------------------------------------------------ split / cat


class _Threshold(AnchoredPattern):
    """A pattern with upstream's per-pass ``threshold_to_cat`` option (default 10)."""

    stage = POST_GRAD
    threshold_to_cat = 10

    def configured(self, threshold_to_cat: int):
        """A copy with another threshold. Raises ValueError below 1."""
        if int(threshold_to_cat) < 1:
            raise ValueError(f"threshold_to_cat must be >= 1, not {threshold_to_cat!r}")
        c = copy.copy(self)
        c.threshold_to_cat = int(threshold_to_cat)
        return c


@register
class MergeSplitCatAten(_Threshold):
    """In ``cat(tensors, d)``, a run of consecutive pieces ``i .. j`` (in order) of one
    ``split_with_sizes(x, sizes, d)`` -> ``slice(x, d, start, end)``, or ``x`` itself for
    every piece; runs shorter than ``threshold_to_cat`` are kept unless they are the whole
    split. Only a cat of at least ``threshold_to_cat`` inputs is looked at (upstream)."""

    name = "merge_split_cat_aten"
    anchors = frozenset({CAT})
    upstream = "merge_split_cat_aten (split_cat_aten_pass)"
    description = "Replace runs of consecutive split pieces in a cat by one slice of the split input."
    preconditions = (
        "aten.cat of at least threshold_to_cat (default 10) inputs",
        "a run of consecutive getitems of one split_with_sizes (or split) along the cat's dim, of at least "
        "threshold_to_cat pieces or every piece",
        "the split input is not written in place",
    )

    def find(self, node: Node):
        tensors, d = need(cat_parts(node))
        if len(tensors) < self.threshold_to_cat:
            return Miss(f"the cat has {len(tensors)} inputs, fewer than threshold_to_cat={self.threshold_to_cat}")
        runs, k = [], 0
        while k < len(tensors):
            g = getitem_of(tensors[k], {SPLIT_WITH_SIZES, SPLIT})
            sizes = self._sizes(g[0], d) if g else None
            if g is None or sizes is None:
                k += 1
                continue
            split, first = g
            j = k + 1
            while j < len(tensors):
                h = getitem_of(tensors[j], {SPLIT_WITH_SIZES, SPLIT})
                if h is None or h[0] is not split or h[1] != first + (j - k):
                    break
                j += 1
            n = j - k
            if n >= self.threshold_to_cat or (first == 0 and n == len(sizes)):
                runs.append((k, j, split, first, sizes))
            k = j
        if not runs:
            return Miss(
                f"no run of >= {self.threshold_to_cat} consecutive pieces of one split along dim {d}, "
                "and no whole split"
            )
        miss = _written(*{r[2].args[0]: 0 for r in runs})
        if miss:
            return miss
        items = [t for k, j, *_ in runs for t in tensors[k:j]]
        return Match(node, [node, *items, *{r[2]: 0 for r in runs}], {"runs": runs, "dim": d, "tensors": tensors})

    @staticmethod
    def _sizes(split: Node, d: int) -> list[int] | None:
        """The sections of ``split`` when it splits along ``d`` (from the pieces' values)."""
        x = split.args[0]
        xs = static_shape(x)
        if isinstance(xs, Miss):
            return None
        a = schema_args(split)
        if isinstance(a, Miss) or norm_dim(a["dim"], len(xs)) != d:
            return None
        pieces = meta.value(split)
        if not isinstance(pieces, (list, tuple)):
            return None
        sizes = [p.shape[d] for p in pieces]
        return sizes if all(type(s) is int for s in sizes) else None

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        tensors, d = m.info["tensors"], m.info["dim"]
        out: list = []
        k = 0
        for start, stop, split, first, sizes in m.info["runs"]:
            out += tensors[k:start]
            x = split.args[0]
            if first == 0 and stop - start == len(sizes):
                out.append(x)
            else:
                lo = sum(sizes[:first])
                hi = lo + sum(sizes[first : first + stop - start])
                with rw.inserting_before(m.anchor):
                    out.append(rw.call(SLICE, x, d, lo, hi))
            k = stop
        out += tensors[k:]
        rw.modify(m.anchor, (out, d), {})
        _erase_unused(rw, m.nodes[1:])


@register
class MergeSelectCatAten(AnchoredPattern):
    """``cat([select(x, d, i) for i in 0..n-1], d)`` with ``n = x.shape[d]`` ->
    ``reshape(x, cat shape)``: the dims ``d`` and ``d + 1`` of ``x`` merged."""

    stage = POST_GRAD
    name = "merge_select_cat_aten"
    anchors = frozenset({CAT})
    upstream = "merge_select_cat_aten (select_cat_aten_pass)"
    description = "Replace cat(select(x, d, i) for every i, d) by one reshape of x."
    preconditions = (
        "every cat input is select(x, d, i) of one x along the cat's dim d, i = 0 .. n-1 in order, n = x's size on d",
        "x is not written in place; the cat's uses get the cat's contiguous layout (a copy where the reshape "
        "would be a strided view they read)",
    )

    def find(self, node: Node):
        tensors, d = need(cat_parts(node))
        x = None
        for i, s in enumerate(tensors):
            if not is_aten(s, SELECTS):
                return Miss(f"input {i} of the cat is not a select")
            src, sd, idx = _arg(s, 0, "self"), _arg(s, 1, "dim"), _arg(s, 2, "index")
            xs = need(static_shape(src))
            if x is None:
                x = src
            elif src is not x:
                return Miss(f"input {i} selects from {src.name}, not from {x.name}")
            if norm_dim(sd, len(xs)) != d:
                return Miss(f"input {i} selects along dim {sd}, not the cat's dim {d}")
            if norm_dim(idx, xs[d]) != i:
                return Miss(f"input {i} selects index {idx}, not {i}")
        if x is None:
            return Miss("the cat has no inputs")
        xs = static_shape(x)
        if len(tensors) != xs[d]:  # type: ignore[index]
            return Miss(f"the cat has {len(tensors)} of the {xs[d]} rows of {x.name} along dim {d}")  # type: ignore[index]
        return _written(x) or Match(node, [node, *tensors], {"x": x, "shape": list(static_shape(node))})  # type: ignore[arg-type]

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        with rw.inserting_before(m.anchor):
            r = rw.call(RESHAPE, m.info["x"], m.info["shape"])
        rw.carry_meta(m.anchor, r)
        rw.replace_all_uses(m.anchor, r)
        rw.erase(m.anchor)
        _erase_unused(rw, m.nodes[1:])


@register
class MoveViewAfterCat(AnchoredPattern):
    """``cat([reshape(getitem(split_with_sizes(x, sizes, s), i), shape_i) for every i], c)``
    -> ``reshape(x, cat shape)`` where that is the same tensor: every piece keeps its
    leading block (``shape_i[:c]`` is one shape for all, with as many elements as
    ``x.shape[:s]``), or every section has size 1 and each reshape drops it (then
    ``reshape(movedim(x, s, c), cat shape)``)."""

    stage = POST_GRAD
    name = "move_view_after_cat"
    anchors = frozenset({CAT})
    upstream = "move_view_after_cat (move_view_after_cat_aten_pass)"
    description = "Replace a cat of reshaped split pieces by one reshape of the split input, where that is equal."
    preconditions = (
        "every cat input is a reshape of a getitem of one split_with_sizes / split, every piece once, in order",
        "each reshape keeps the piece's leading block before the cat dim, or every section is 1 and each reshape "
        "drops the split dim (upstream's permute reorders elements in other cases)",
        "x is not written in place",
    )

    def find(self, node: Node):
        tensors, c = need(cat_parts(node))
        split = None
        shapes = []
        for i, r in enumerate(tensors):
            if not is_aten(r, {RESHAPE, VIEW}):
                return Miss(f"input {i} of the cat is not a reshape or view")
            g = getitem_of(r.args[0], {SPLIT_WITH_SIZES, SPLIT})
            if g is None:
                return Miss(f"input {i} reshapes {getattr(r.args[0], 'name', '?')}, not a split piece")
            if split is None:
                split = g[0]
            elif g[0] is not split:
                return Miss(f"input {i} is a piece of {g[0].name}, not of {split.name}")
            if g[1] != i:
                return Miss(f"input {i} is piece {g[1]}: the pieces are not every piece in order")
            shapes.append(need(static_shape(r)))
        if split is None:
            return Miss("the cat has no inputs")
        x = split.args[0]
        xs = need(static_shape(x))
        a = need(schema_args(split))
        s = norm_dim(a["dim"], len(xs))
        pieces = meta.value(split)
        if s is None or not isinstance(pieces, (list, tuple)) or len(pieces) != len(tensors):
            return Miss("the cat does not hold every piece of the split")
        out = list(need(static_shape(node)))
        lead = [sh[:c] for sh in shapes]
        flat = all(ld == lead[0] for ld in lead) and math.prod(lead[0]) == math.prod(xs[:s])
        squeeze = all(p.shape[s] == 1 for p in pieces) and all(
            list(sh) == [v for k, v in enumerate(xs) if k != s] for sh in shapes
        )
        if not (flat or squeeze):
            return Miss(
                "the reshapes do not keep each piece's leading block, nor drop a size-1 split dim: "
                "no single reshape of the split input gives this cat (upstream's permute would reorder elements)"
            )
        return _written(x) or Match(
            node,
            [node, *tensors, *(t.args[0] for t in tensors), split],
            {"x": x, "s": s, "c": c, "flat": flat, "shape": out},
        )

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        x, s, c = m.info["x"], m.info["s"], m.info["c"]
        with rw.inserting_before(m.anchor):
            if not m.info["flat"] and s != c:
                order = list(range(len(static_shape(x))))  # type: ignore[arg-type]
                order.insert(c, order.pop(s))
                x = rw.call(PERMUTE, x, order)
            r = rw.call(RESHAPE, x, m.info["shape"])
        rw.carry_meta(m.anchor, r)
        rw.replace_all_uses(m.anchor, r)
        rw.erase(m.anchor)
        _erase_unused(rw, m.nodes[1:])
