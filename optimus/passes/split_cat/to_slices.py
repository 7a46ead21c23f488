"""The threshold split/cat passes (upstream: torch/_inductor/fx_passes/split_cat.py,
``split_cat_to_slices`` .. ``move_reshape_out_of_split_stack``).

Each "to slices" pattern scans a cat/stack list for runs of consecutive pieces, in
order, of one split/unbind. A run that is every piece, or has at least
``threshold_to_cat`` pieces (default 10, as upstream), becomes one view of the
split/unbind input; shorter runs stay as they are. The views are built so they are
right for every pair of dims: a run of unbind pieces cat'ed on ``c`` is
``flatten(movedim(y, u, c), c, c + 1)`` (upstream swaps the two dims with ``permute``,
which is wrong when they are two or more apart), and a run of split pieces stacked on
``t`` is ``movedim(unflatten(x, s, (n, k)), s, t)``. A split run only counts in a cat on
the split's own dim (upstream's ``split_cat_to_slices`` does not check the cat's dim).
"""

from __future__ import annotations

import copy

import torch
from torch.fx import Node

from optimus_lens.core import meta
from optimus_lens.core.miss import Miss, need
from optimus_lens.core.pattern import AnchoredPattern, Match, register
from optimus_lens.core.rewriter import Rewriter
from optimus_lens.passes.common import CAT, STACK, is_call, is_getitem
from optimus_lens.passes.split_cat.analysis import Run, block_ok, cat_args, getitem_piece, mutation_miss, segments
from optimus_lens.passes.split_cat.build import as_block, erase_if_unused, movedim, rebuild

#: reshapes of one piece (unsqueeze is a reshape to one more size-1 dim)
RESHAPE = (
    {torch.reshape, torch.Tensor.reshape, torch.Tensor.view, torch.unsqueeze},
    {"reshape", "view", "unsqueeze"},
)


class ToSlices(AnchoredPattern):
    """Base of the threshold patterns, anchored at a cat/stack. Subclasses give ``piece``
    (which list entries are pieces); a Run that is every piece, or has at least
    ``threshold_to_cat`` pieces, and that :func:`block_ok` accepts becomes
    ``view(rw, run, dim)`` (default: :func:`as_block` of the run's span of the input)."""

    threshold_to_cat = 10

    def configured(self, threshold_to_cat: int) -> ToSlices:
        """A copy of this pattern with another threshold (upstream's per-pass
        ``{"threshold_to_cat": n}`` option). Raises ValueError for a threshold below 1."""
        if int(threshold_to_cat) < 1:
            raise ValueError(f"threshold_to_cat must be >= 1, not {threshold_to_cat!r}")
        c = copy.copy(self)
        c.threshold_to_cat = int(threshold_to_cat)
        return c

    def piece(self, d: int):
        raise NotImplementedError

    def view(self, rw: Rewriter, run: Run, d: int, stack: bool) -> Node:
        return as_block(rw, _narrow(rw, run), run, stack, d)

    def find(self, node: Node):
        tensors, d = need(cat_args(node))
        stack = is_call(node, *STACK)
        segs = segments(tensors, self.piece(d))
        runs = [
            s for s in segs if isinstance(s, Run) and (s.full or s.n >= self.threshold_to_cat) and block_ok(s, stack, d)
        ]
        if not runs:
            return Miss(f"no whole split/unbind and no run of >= {self.threshold_to_cat} consecutive pieces")
        items = [t for r in runs for t in r.items]
        site = [node, *items, *(t.args[0] for t in items if not is_getitem(t)), *{r.parts.node: 0 for r in runs}]
        return mutation_miss(node, *{r.parts.input for r in runs}) or Match(
            node, site, {"segments": segs, "runs": runs, "dim": d, "stack": stack}
        )

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        d, stack = m.info["dim"], m.info["stack"]
        convert = {id(r) for r in m.info["runs"]}
        rebuild(rw, m.anchor, m.info["segments"], lambda r: self.view(rw, r, d, stack) if id(r) in convert else None, d)
        erase_if_unused(rw, m.nodes[1:])


def _narrow(rw: Rewriter, run: Run) -> Node:
    """The run's span of the split/unbind input: the input itself for a whole run."""
    p = run.parts
    return p.input if run.full else rw.call(torch.narrow, p.input, p.dim, run.offset, run.length)


@register
class SplitCatToSlices(ToSlices):
    """``cat([.., s_i, .., s_j, ..], d)`` over split pieces on dim ``d`` -> ``cat([.., narrow(x, d,
    off_i, len), ..], d)``; a whole split becomes ``x``; the cat goes when one entry is left."""

    name = "split_cat_to_slices"
    upstream = "split_cat_to_slices_pass (split_cat_to_slices)"
    description = "Replace long runs of consecutive split pieces in a cat by one slice of the split input."
    preconditions = (
        "a run of consecutive pieces, in order, of one split on the cat's dim (normalised)",
        "the run is every piece, or at least threshold_to_cat (default 10) pieces",
        "no value aliasing the split input or the cat is written in place",
    )
    anchors = frozenset(CAT[0])

    def piece(self, d: int):
        return getitem_piece(lambda p: not p.unbind and p.dim == d)


@register
class UnbindCatToView(ToSlices):
    """``cat([u_i .. u_j], c)`` of pieces of ``u = unbind(y, a)`` ->
    ``flatten(movedim(narrow(y, a, i, n), a, c), c, c + 1)`` (``y`` itself for every piece)."""

    name = "unbind_cat_to_view"
    upstream = "unbind_cat_to_view_pass (unbind_cat_to_view)"
    description = "Replace long runs of consecutive unbind pieces in a cat by a view (movedim + flatten) of the input."
    preconditions = (
        "a run of consecutive pieces, in order, of one unbind (any dim)",
        "the run is every piece, or at least threshold_to_cat (default 10) pieces",
        "no value aliasing the unbind input or the cat is written in place",
    )
    anchors = frozenset(CAT[0])

    def piece(self, d: int):
        return getitem_piece(lambda p: p.unbind)


@register
class SplitStackToCats(ToSlices):
    """``stack([s_i .. s_j], t)`` of equal pieces (size k on dim a) of ``s = split(x, .., a)`` ->
    ``movedim(unflatten(narrow(x, a, off_i, n*k), a, (n, k)), a, t)``; other entries are
    stacked and the parts joined with ``cat(.., t)``."""

    name = "split_stack_to_cats"
    upstream = "split_stack_to_cats_pass (split_stack_to_cats)"
    description = "Replace long runs of consecutive split pieces in a stack by one view of the split input."
    preconditions = (
        "a run of consecutive pieces, in order, of one split (any dim), all of one size",
        "the run is every piece, or at least threshold_to_cat (default 10) pieces",
        "no value aliasing the split input or the stack is written in place",
    )
    anchors = frozenset(STACK[0])

    def piece(self, d: int):
        return getitem_piece(lambda p: not p.unbind)


@register
class UnbindStackToSlices(ToSlices):
    """``stack([u_i .. u_j], t)`` of pieces of ``u = unbind(y, a)`` -> ``movedim(narrow(y, a, i, n), a, t)``
    (``y`` itself for every piece on ``t == a``); other entries stacked, parts joined by ``cat``."""

    name = "unbind_stack_to_slices"
    upstream = "unbind_stack_to_slices_pass (unbind_stack_to_slices)"
    description = "Replace long runs of consecutive unbind pieces in a stack by a slice (+ movedim) of the input."
    preconditions = (
        "a run of consecutive pieces, in order, of one unbind (any dim)",
        "the run is every piece, or at least threshold_to_cat (default 10) pieces",
        "no value aliasing the unbind input or the stack is written in place",
    )
    anchors = frozenset(STACK[0])

    def piece(self, d: int):
        return getitem_piece(lambda p: p.unbind)


@register
class MoveReshapeOutOfSplitStack(ToSlices):
    """``stack([reshape(s_i, R) .. reshape(s_j, R)], t)`` of equal pieces (size k on dim a) of
    ``s = split(x, .., a)`` -> ``movedim(reshape(movedim(unflatten(narrow(x, ..), a, (n, k)), a, 0),
    (n, *R)), 0, t)``: one reshape of the span instead of one per piece.

    Beyond upstream (``docs/parity.md``): the pieces may also be an unbind's, and
    ``unsqueeze`` counts as a reshape (``stack([u_i.unsqueeze(-1) for u_i in y.unbind()])``
    is ``y.unsqueeze(-1)``, the shape batch fusions leave between two stacked ops)."""

    name = "move_reshape_out_of_split_stack"
    upstream = "move_reshape_out_of_split_stack_pass (move_reshape_out_of_split_stack)"
    description = "Replace a stack of reshaped consecutive split pieces by one reshape of the split input's span."
    preconditions = (
        "stack entries are reshape/view (static shape) or unsqueeze of consecutive split or unbind pieces, in order",
        "the pieces in the run are all of one size",
        "the run is every piece, or at least threshold_to_cat (default 10) pieces",
        "no value aliasing the split input or the stack is written in place",
    )
    anchors = frozenset(STACK[0])

    def piece(self, d: int):
        inner = getitem_piece(lambda p: True)

        def piece(t: Node):
            if not is_call(t, *RESHAPE) or not t.args or meta.tensor(t) is None:
                return None
            return inner(t.args[0]) if isinstance(t.args[0], Node) else None

        return piece

    def view(self, rw: Rewriter, run: Run, d: int, stack: bool) -> Node:
        t = as_block(rw, _narrow(rw, run), run, True, 0)  # (n, *piece shape)
        t = rw.call(torch.reshape, t, (run.n, *meta.shape(run.items[0])))
        return movedim(rw, t, 0, d)
