"""Split / cat / stack / unbind cleanups: remove the identity pairs batch fusions leave.

A fusion ends in ``unbind`` and the next one starts with ``stack`` of the same pieces;
``stack(unbind(Y, d)[0..n-1], d)`` is ``Y``. Likewise ``cat`` of every piece of a
``split`` in order, on the same dim, is the split's input. Each rule checks that the
pieces are *all* the pieces, in order, on the same (normalised) dim: a cat that
reorders or skips pieces is not an identity and is left alone (upstream:
torch/_inductor/fx_passes/split_cat.py, ``UnbindCatRemover`` / ``merge_getitem_cat``).

Below the four identity removals come upstream's split/cat pattern passes in our form
(``remove_split_with_size_one``, ``merge_splits``, ``simplify_split_cat``,
``merge_split_squeeze``, ``merge_unbind_stack``, ``merge_getitem_cat``, ``mutate_cat``) and
the analysis they share with optimus/passes/split_cat_extra.py: :func:`parts_of` (a
split/unbind read from its example value), :func:`segments` (a cat/stack list grouped
into runs of consecutive pieces) and :func:`as_block` (a run as one view of the input).
Unlike upstream they read section sizes and dims from example values, so they do not
need ``normalization_pass`` to have run, and they refuse any site whose values (or values
aliasing them) are written in place.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Callable

import torch
from torch.fx import Node

from optimus import meta
from optimus.lang import ANY, Op, Pieces, Rule, RulePattern, Var, here, require
from optimus.pattern import Match, Miss, RewritePattern, register
from optimus.layout import replace_miss
from optimus.rewriter import Rewriter
from optimus.passes.common import (CAT, SPLIT, STACK, UNBIND, arg, call, dim_of, is_call,
                                   is_getitem, is_written)


def pieces_of(node: Node):
    """For a split or unbind node: (input, normalised dim, number of pieces), or a Miss."""
    v = meta.value(node)
    if not isinstance(v, (list, tuple)):
        return Miss("split/unbind has no example value")
    x = node.args[0] if node.args else node.kwargs.get("input", node.kwargs.get("self"))
    xt = meta.tensor(x)
    if xt is None:
        return Miss("input has no example value")
    if is_call(node, *UNBIND):
        d = arg(node, 1, "dim", 0)
    else:
        d = arg(node, 2, "dim", 0)
    d = dim_of(d, xt.dim())
    if d is None:
        return Miss("dim is not a static int")
    return x, d, len(v)


def all_pieces_in_order(tensors, producer_ok) -> tuple[Node, list[Node]] | Miss:
    """If ``tensors`` are ``getitem(P, 0) .. getitem(P, n-1)`` of one producer P accepted by
    ``producer_ok`` and P has exactly n pieces, return (P, the getitems); else a Miss."""
    if not isinstance(tensors, (list, tuple)) or not tensors:
        return Miss("tensors is not a list")
    if not all(is_getitem(t) for t in tensors):
        return Miss("not every input is a getitem")
    parent = tensors[0].args[0]
    if not isinstance(parent, Node) or not producer_ok(parent):
        return Miss("inputs do not come from a split/unbind")
    if any(t.args[0] is not parent for t in tensors):
        return Miss("inputs come from different producers")
    idx = [t.args[1] for t in tensors]
    if idx != list(range(len(tensors))):
        return Miss(f"pieces are not all taken in order (indices {idx})")
    n = len(meta.value(parent) or ())
    if n != len(tensors):
        return Miss(f"{len(tensors)} of {n} pieces are taken")
    return parent, list(tensors)


def off_anchor(pattern: RewritePattern, node: Node) -> Miss | None:
    """A Miss when ``node`` is not one of ``pattern.anchors`` (so ``why_not`` on any node
    answers truthfully, not only the nodes the engine offers)."""
    target = node.target if node.op in ("call_function", "call_method") else None
    return None if target in pattern.anchors else Miss(f"not one of the ops {pattern.name} starts from")


def _erase_if_unused(rw: Rewriter, nodes: list[Node]) -> None:
    for n in nodes:
        if not n._erased and not n.users:
            rw.erase(n)


@register
class RemoveUnbindStack(RewritePattern):
    """``stack([unbind(Y, d)[i] for i in 0..n-1], d)`` -> ``Y``."""

    name = "remove_unbind_stack"
    upstream = "unbind_stack_pass (UnbindCatRemover)"
    description = "A stack of every unbind piece, in order, on the unbind's dim is the unbind's input."
    preconditions = ("stack's inputs are getitems 0..n-1 of one unbind with n pieces",
                     "stack dim == unbind dim (after normalising negative dims)",
                     "no value aliasing the stack or the unbind input is written in place")
    anchors = frozenset(STACK[0])

    def match(self, node: Node):
        if off := off_anchor(self, node):
            return off
        tensors = arg(node, 0, "tensors")
        r = all_pieces_in_order(tensors, lambda p: is_call(p, *UNBIND))
        if isinstance(r, Miss):
            return r
        unbind, items = r
        p = pieces_of(unbind)
        if isinstance(p, Miss):
            return p
        y, ud, _ = p
        yt = meta.tensor(y)
        sd = dim_of(arg(node, 1, "dim", 0), yt.dim())
        if sd != ud:
            return Miss(f"stack dim {sd} != unbind dim {ud}")
        return mutation_miss(node, y) or Match(node, [node, *items, unbind], {"input": y})

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        stack, *rest = m.nodes
        rw.replace_all_uses(stack, m.info["input"])
        rw.erase(stack)
        _erase_if_unused(rw, rest)


@register
class RemoveStackUnbind(RewritePattern):
    """``unbind(stack(xs, d), d)[i]`` -> ``xs[i]``."""

    name = "remove_stack_unbind"
    upstream = "(none: upstream leaves these to Inductor)"
    description = "Unbinding a stack on the stack's dim gives back the stacked tensors."
    preconditions = ("unbind's input is a stack", "unbind dim == stack dim (normalised)",
                     "every user of the unbind is a getitem with a constant index",
                     "no value aliasing a piece or a stacked tensor is written in place",
                     "no piece whose strides a use depends on (view, as_strided, graph output ...) gets other strides")
    anchors = frozenset(UNBIND[0]) | frozenset(UNBIND[1])

    def match(self, node: Node):
        if off := off_anchor(self, node):
            return off
        s = node.args[0] if node.args else node.kwargs.get("input")
        if not is_call(s, *STACK):
            return Miss("unbind's input is not a stack")
        xs = arg(s, 0, "tensors")
        st = meta.tensor(s)
        if st is None or not isinstance(xs, (list, tuple)):
            return Miss("stack has no example value")
        sd = dim_of(arg(s, 1, "dim", 0), st.dim())
        p = pieces_of(node)
        if isinstance(p, Miss):
            return p
        if p[1] != sd:
            return Miss(f"unbind dim {p[1]} != stack dim {sd}")
        if not all(is_getitem(u) and isinstance(u.args[1], int) for u in node.users):
            return Miss("the unbind has a user that is not a getitem")
        return (mutation_miss(node, *xs) or layout_miss(node.users, xs)
                or Match(node, [node, s, *node.users], {"tensors": list(xs)}))

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        unbind, stack, *items = m.nodes
        xs = m.info["tensors"]
        for g in items:
            rw.replace_all_uses(g, xs[g.args[1]])
            rw.erase(g)
        rw.erase(unbind)
        _erase_if_unused(rw, [stack])


def _same_dim(b: dict) -> bool:
    nd = meta.tensor(b["x"]).dim()
    return dim_of(b["cd"], nd) == dim_of(b["sd"], nd)


# cat([split(x, sizes, d)[i] for i in 0..n-1], d) -> x
register(RulePattern(Rule(
    "remove_split_cat",
    Op(CAT, Pieces(Op(SPLIT, Var("x"), ANY, dim=Var("sd"))), dim=Var("cd"), name="cat", where=[
        require(_same_dim, lambda b: f"cat dim {b['cd']} != split dim {b['sd']}"),
        require(lambda b: mutation_miss(b["cat"], b["x"]) is None, lambda b: mutation_miss(b["cat"], b["x"]))]),
    lambda rw, x, **_: x,
    description="A cat of every split piece, in order, on the split's dim is the split's input.",
    preconditions=("cat's inputs are getitems 0..n-1 of one split with n pieces (uneven sizes are fine)",
                   "cat dim == split dim (normalised)",
                   "no value aliasing the cat or the split input is written in place")),
    source=here(0), upstream="split_cat_pass / mutate_cat_pass (all sections consecutive -> input)"))


@register
class RemoveCatSplit(RewritePattern):
    """``split(cat(xs, d), sizes_of(xs), d)[i]`` -> ``xs[i]``."""

    name = "remove_cat_split"
    upstream = "(none)"
    description = "Splitting a cat back into the sizes of its inputs, on the cat's dim, gives back the inputs."
    preconditions = ("split's input is a cat on the same dim (normalised)",
                     "piece i has the size of cat input i along that dim",
                     "every user of the split is a getitem with a constant index",
                     "no value aliasing a piece or a cat input is written in place",
                     "no piece whose strides a use depends on (view, as_strided, graph output ...) gets other strides")
    anchors = frozenset(SPLIT[0]) | frozenset(SPLIT[1])

    def match(self, node: Node):
        if off := off_anchor(self, node):
            return off
        c = node.args[0] if node.args else node.kwargs.get("tensor")
        if not is_call(c, *CAT):
            return Miss("split's input is not a cat")
        xs = arg(c, 0, "tensors")
        ct = meta.tensor(c)
        if ct is None or not isinstance(xs, (list, tuple)):
            return Miss("cat has no example value")
        cd = dim_of(arg(c, 1, "dim", 0), ct.dim())
        p = pieces_of(node)
        if isinstance(p, Miss):
            return p
        if p[1] != cd:
            return Miss(f"split dim {p[1]} != cat dim {cd}")
        pieces = [tuple(t.shape) for t in meta.value(node)]
        inputs = [meta.shape(x) for x in xs]
        if pieces != inputs:
            return Miss(f"split pieces {pieces} do not match the cat inputs {inputs}")
        if not all(is_getitem(u) and isinstance(u.args[1], int) for u in node.users):
            return Miss("the split has a user that is not a getitem")
        return (mutation_miss(node, *xs) or layout_miss(node.users, xs)
                or Match(node, [node, c, *node.users], {"tensors": list(xs)}))

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        split, cat, *items = m.nodes
        xs = m.info["tensors"]
        for g in items:
            rw.replace_all_uses(g, xs[g.args[1]])
            rw.erase(g)
        rw.erase(split)
        _erase_if_unused(rw, [cat])


# =========================================================================== shared analysis


@dataclass
class Parts:
    """A split or unbind node read from its example value: its ``input``, the
    normalised ``dim`` (0 <= dim < input rank), the section ``sizes`` along it (all 1 for
    an unbind) and whether it is an ``unbind`` (whose pieces drop ``dim``)."""

    node: Node
    input: Node
    dim: int
    sizes: list[int]
    unbind: bool

    def offset(self, i: int) -> int:
        """Start of piece ``i`` along ``dim`` (elements)."""
        return sum(self.sizes[:i])


def computed_size(node: Node) -> Miss | None:
    """A Miss when a split's section sizes (``split_size_or_sections``) are computed in
    the graph (``x.size(1) // 2`` under symbolic capture; a SymInt under dynamic shapes):
    a rewrite that read them from the example value would fix them to the example's
    sizes, and the graph would then fail (or be wrong) on another input shape."""
    if is_call(node, *UNBIND):
        return None
    sizes = arg(node, 1, "split_size_or_sections", arg(node, 1, "split_size", None))
    found: list[Node] = []
    torch.fx.node.map_arg(sizes, found.append)
    if found:
        return Miss(f"section sizes are computed from the inputs ({found[0].name}); a constant would specialise them")
    return None


def parts_of(node: Node) -> Parts | Miss:
    """The :class:`Parts` of a split (any spelling: ``torch.split``, ``Tensor.split``, the
    method) or unbind node, or a Miss saying why it cannot be read."""
    unbind = is_call(node, *UNBIND)
    if not unbind and not is_call(node, *SPLIT):
        return Miss("not a split or unbind")
    x = node.args[0] if node.args else node.kwargs.get("tensor", node.kwargs.get("input", node.kwargs.get("self")))
    xt, v = meta.tensor(x), meta.value(node)
    if xt is None or not isinstance(v, (list, tuple)):
        return Miss("split/unbind or its input has no example value")
    d = dim_of(arg(node, 1 if unbind else 2, "dim", 0), xt.dim())
    if d is None:
        return Miss("dim is not a static int")
    computed = computed_size(node)
    if computed:
        return computed
    sizes = [1] * len(v) if unbind else [t.shape[d] for t in v]
    if not all(type(s) is int for s in sizes):
        return Miss("section sizes are symbolic")
    return Parts(node, x, d, sizes, unbind)


def piece_index(g: Node, parts: Parts) -> int | None:
    """``i`` (normalised, >= 0) if ``g`` is ``getitem(parts.node, i)`` with a constant int, else None."""
    if not is_getitem(g) or g.args[0] is not parts.node:
        return None
    i = g.args[1]
    if type(i) is not int or not -len(parts.sizes) <= i < len(parts.sizes):
        return None
    return i % len(parts.sizes)


def getitem_users(parts: Parts) -> list[tuple[Node, int]] | Miss:
    """``(getitem, index)`` for every user of the split/unbind; a Miss if some user is
    not a getitem with a constant index."""
    out = []
    for u in parts.node.users:
        i = piece_index(u, parts)
        if i is None:
            return Miss(f"{u.name} uses the split/unbind but is not a getitem with a constant index")
        out.append((u, i))
    return out


@dataclass
class Run:
    """Consecutive pieces ``first .. first+n-1`` of one split/unbind, in that order, as
    they appear in a cat/stack list (``items`` are the list entries)."""

    parts: Parts
    first: int
    items: list[Node]

    @property
    def n(self) -> int:
        return len(self.items)

    @property
    def last(self) -> int:
        return self.first + self.n - 1

    @property
    def full(self) -> bool:
        """True when the run is every piece of the split/unbind, in order."""
        return self.first == 0 and self.n == len(self.parts.sizes)

    @property
    def offset(self) -> int:
        return self.parts.offset(self.first)

    @property
    def length(self) -> int:
        return sum(self.parts.sizes[self.first:self.last + 1])


def segments(tensors, piece: Callable[[Node], tuple[Parts, int] | None]) -> list[Node | Run]:
    """Group a cat/stack list into maximal :class:`Run`\\ s of consecutive pieces and
    other entries. ``piece(t)`` says which piece ``t`` is (``(parts, index)``) or None.
    A reordered or gapped list gives runs of length 1, never a longer run."""
    out: list[Node | Run] = []
    for t in tensors:
        p = piece(t) if isinstance(t, Node) else None
        if p is None:
            out.append(t)
            continue
        parts, i = p
        last = out[-1] if out else None
        if isinstance(last, Run) and last.parts.node is parts.node and i == last.last + 1:
            last.items.append(t)
        else:
            out.append(Run(parts, i, [t]))
    return out


def getitem_piece(accept: Callable[[Parts], bool]) -> Callable[[Node], tuple[Parts, int] | None]:
    """A ``piece`` function for :func:`segments`: ``getitem(P, i)`` of a split/unbind ``P``
    whose Parts ``accept`` approves (Parts are read once per producer)."""
    cache: dict[Node, Parts | None] = {}

    def piece(t: Node):
        if not is_getitem(t) or not isinstance(t.args[0], Node):
            return None
        src = t.args[0]
        if src not in cache:
            p = parts_of(src)
            cache[src] = p if not isinstance(p, Miss) and accept(p) else None
        p = cache[src]
        if p is None:
            return None
        i = piece_index(t, p)
        return None if i is None else (p, i)

    return piece


def cat_args(node: Node) -> tuple[list[Node], int] | Miss:
    """(tensors, normalised dim) of a cat/stack node, read from its example value."""
    tensors = arg(node, 0, "tensors")
    out = meta.tensor(node)
    if not isinstance(tensors, (list, tuple)) or out is None:
        return Miss("cat/stack has no tensor list or no example value")
    d = arg(node, 1, "dim", node.kwargs.get("axis", 0))
    d = dim_of(d, out.dim())
    if d is None:
        return Miss("dim is not a static int")
    return list(tensors), d


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


def getitems_of(rw: Rewriter, node: Node) -> Callable[[int], Node]:
    """``get(i)``: the getitem ``node[i]``, created on first use at the insert point."""
    made: dict[int, Node] = {}

    def get(i: int) -> Node:
        if i not in made:
            made[i] = call(rw, operator.getitem, node, i)
        return made[i]

    return get


def layout_miss(items, xs) -> Miss | None:
    """A Miss when a piece ``g = P[i]`` among ``items`` would be replaced by ``xs[i]`` with
    other strides that a use of ``g`` depends on (:func:`optimus.layout.replace_miss`)."""
    for g in items:
        miss = replace_miss(g, xs[g.args[1]])
        if miss:
            return miss
    return None


def mutation_miss(*nodes: Node) -> Miss | None:
    """A Miss when any of ``nodes`` (or a value sharing its storage) is written in place:
    a rewrite that makes an output alias an input, or drops a copy, is then unsound."""
    for n in nodes:
        if isinstance(n, Node) and is_written(n):
            return Miss(f"{n.name} (or a view of it) is written in place")
    return None


def movedim(rw: Rewriter, t: Node, src: int, dst: int) -> Node:
    return t if src == dst else call(rw, torch.movedim, t, src, dst)


def block_ok(run: Run, stack: bool, e: int) -> bool:
    """Whether :func:`as_block` can lay out ``run`` for a cat/stack on dim ``e``: unbind
    pieces always; split pieces in a cat on the split's dim always, otherwise only when
    the pieces have one size."""
    p = run.parts
    return p.unbind or (not stack and e == p.dim) or len(set(p.sizes[run.first:run.last + 1])) == 1


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
    t = span if p.unbind else call(rw, torch.unflatten, span, p.dim, (run.n, p.sizes[run.first]))
    t = movedim(rw, t, p.dim, e)
    return t if stack else call(rw, torch.flatten, t, e, e + 1)


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
                parts.append(call(rw, torch.stack, loose, dim=e))
                loose = []
            parts.append(b)
        if loose:
            parts.append(call(rw, torch.stack, loose, dim=e))
        swap(rw, user, parts[0] if len(parts) == 1 else call(rw, torch.cat, parts, dim=e))


def cat_stack_layouts(parts: Parts, items: list[tuple[Node, int]]) -> dict[Node, tuple[list, int]]:
    """Every cat/stack that uses a piece of ``parts``: ``user -> (segments of its list over
    this split/unbind's pieces, its normalised dim)``."""
    piece = getitem_piece(lambda q: q.node is parts.node)
    out: dict[Node, tuple[list, int]] = {}
    for g, _ in items:
        for u in g.users:
            if u not in out and is_call(u, CAT[0] | STACK[0]):
                ca = cat_args(u)
                if not isinstance(ca, Miss):
                    out[u] = (segments(ca[0], piece), ca[1])
    return out


# =========================================================================== remove_split_with_size_one_pass


@register
class RemoveSplitWithSizeOne(RewritePattern):
    """``s = split(x, [n], d); y = f(s[0])`` -> ``y = f(x)``: a split into one section is ``x``."""

    name = "remove_split_with_size_one"
    upstream = "remove_split_with_size_one_pass (remove_split_with_size_one)"
    description = "A split that yields a single piece is its input."
    preconditions = ("split (any spelling) with example values yields exactly one piece",
                     "every user is getitem 0 (or -1); at least one user",
                     "no value aliasing the input is written in place")
    anchors = frozenset(SPLIT[0]) | frozenset(SPLIT[1])

    def match(self, node: Node):
        if off := off_anchor(self, node):
            return off
        p = parts_of(node)
        if isinstance(p, Miss) or p.unbind:
            return p if isinstance(p, Miss) else Miss("not a split")
        if len(p.sizes) != 1:
            return Miss(f"split yields {len(p.sizes)} pieces, not 1")
        items = getitem_users(p)
        if isinstance(items, Miss):
            return items
        if not items:
            return Miss("split has no users")
        return mutation_miss(p.input) or Match(node, [node, *(g for g, _ in items)], {"input": p.input})

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        split, *items = m.nodes
        for g in items:
            rw.replace_all_uses(g, m.info["input"])
            rw.erase(g)
        rw.erase(split)


# =========================================================================== merge_splits_pass


@register
class MergeSplits(RewritePattern):
    """``a = split(x, A, d); b = split(a[i], B, d)`` -> ``split(x, A[:i] + B + A[i+1:], d)``,
    the getitems of both renumbered (``a[j]`` -> ``new[j]`` for j < i, ``new[j+len(B)-1]``
    for j > i; ``b[k]`` -> ``new[i+k]``)."""

    name = "merge_splits"
    upstream = "merge_splits_pass (merge_splits)"
    description = "A split of a split piece on the same dim becomes one split with the sections spliced in."
    preconditions = ("the split's input is getitem i of another split, used only by this split",
                     "same dim (after normalising negative dims); sizes read from example values",
                     "every user of both splits is a getitem with a constant index",
                     "no value aliasing the input is written in place")
    anchors = frozenset(SPLIT[0]) | frozenset(SPLIT[1])

    def match(self, node: Node):
        if off := off_anchor(self, node):
            return off
        inner = parts_of(node)
        if isinstance(inner, Miss) or inner.unbind:
            return inner if isinstance(inner, Miss) else Miss("not a split")
        g = inner.input
        outer = parts_of(g.args[0]) if is_getitem(g) and isinstance(g.args[0], Node) else Miss("input is not a getitem")
        if isinstance(outer, Miss) or outer.unbind:
            return Miss("the split's input is not a piece of another split")
        i = piece_index(g, outer)
        if i is None:
            return Miss("the split's input is not a constant piece of another split")
        if outer.dim != inner.dim:
            return Miss(f"outer split dim {outer.dim} != inner split dim {inner.dim}")
        if list(g.users) != [node]:
            return Miss(f"piece {i} of the outer split has other users")
        a_items, b_items = getitem_users(outer), getitem_users(inner)
        for r in (a_items, b_items):
            if isinstance(r, Miss):
                return r
        if not b_items:
            return Miss("the inner split has no users")
        return mutation_miss(outer.input) or Match(
            node, [node, *(h for h, _ in b_items), outer.node, *(h for h, _ in a_items)],
            {"outer": outer, "inner": inner, "index": i, "a": a_items, "b": b_items})

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        outer, inner, i = m.info["outer"], m.info["inner"], m.info["index"]
        sizes = outer.sizes[:i] + inner.sizes + outer.sizes[i + 1:]
        with rw.inserting_before(outer.node):  # erased last, so the insert point stays live
            new = call(rw, torch.split, outer.input, sizes, dim=outer.dim)
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


# =========================================================================== split_cat_pass


@register
class SimplifySplitCat(RewritePattern):
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
    preconditions = ("every user of the split is a getitem with a constant index",
                     "a run is >= 2 consecutive pieces, in order, in a cat or stack (of one size unless "
                     "in a cat on the split's dim)",
                     "the piece ranges used anywhere do not overlap",
                     "fewer sections result than the split has",
                     "no value aliasing the input or a rewritten cat/stack is written in place")
    anchors = frozenset(SPLIT[0]) | frozenset(SPLIT[1])

    def match(self, node: Node):
        if off := off_anchor(self, node):
            return off
        p = parts_of(node)
        if isinstance(p, Miss) or p.unbind:
            return p if isinstance(p, Miss) else Miss("not a split")
        items = getitem_users(p)
        if isinstance(items, Miss):
            return items
        layouts = cat_stack_layouts(p, items)
        merged = {u: [s for s in segs if isinstance(s, Run) and s.n > 1 and block_ok(s, is_call(u, *STACK), e)]
                  for u, (segs, e) in layouts.items()}
        merged = {u: runs for u, runs in merged.items() if runs}
        ranges = {(r.first, r.last) for runs in merged.values() for r in runs}
        ranges |= {(i, i) for g, i in items if any(u not in merged for u in g.users)}
        ranges |= {(i, i) for u in merged for s in layouts[u][0] if isinstance(s, Run) and s not in merged[u]
                   for i in range(s.first, s.last + 1)}
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
            node, [node, *(g for g, _ in items), *users],
            {"parts": p, "items": items, "sections": sections, "ranges": ranges,
             "layouts": {u: layouts[u] for u in users}, "merged": merged})

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        p: Parts = m.info["parts"]
        sections, merged, needed = m.info["sections"], m.info["merged"], m.info["ranges"]
        with rw.inserting_before(p.node):  # erased last, so the insert point stays live
            if len(sections) == 1:
                new_of = {r: p.input for r in needed}
            else:
                sizes = [sum(p.sizes[a:b + 1]) for a, b in sections]
                get = getitems_of(rw, call(rw, torch.split, p.input, sizes, dim=p.dim))
                new_of = {r: get(sections.index(r)) for r in sorted(needed)}
        for user, (segs, e) in m.info["layouts"].items():
            chosen = {id(r) for r in merged[user]}
            stack = is_call(user, *STACK)
            rebuild(rw, user, segs, lambda r: as_block(rw, new_of[(r.first, r.last)], r, stack, e)
                    if id(r) in chosen else None, e)
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
class MergeSplitSqueeze(RewritePattern):
    """``s = split(x, 1, d); y_i = squeeze(s[i], d)`` for every use -> ``u = unbind(x, d); y_i = u[i]``."""

    name = "merge_split_squeeze"
    upstream = "split_cat_pass (merge_split_squeeze)"
    description = "A split into size-1 pieces that are all squeezed on the split dim is an unbind."
    preconditions = ("every section of the split has size 1",
                     "every user of every piece is a squeeze on the split's dim (normalised; one int dim)",
                     "every user of the split is a getitem with a constant index",
                     "no value aliasing the input is written in place")
    anchors = frozenset(SPLIT[0]) | frozenset(SPLIT[1])

    def match(self, node: Node):
        if off := off_anchor(self, node):
            return off
        p = parts_of(node)
        if isinstance(p, Miss) or p.unbind:
            return p if isinstance(p, Miss) else Miss("not a split")
        if any(s != 1 for s in p.sizes):
            return Miss("not every section has size 1")
        items = getitem_users(p)
        if isinstance(items, Miss):
            return items
        squeezes = [(u, i) for g, i in items for u in g.users]
        if not squeezes:
            return Miss("no piece is used")
        bad = [u.name for u, _ in squeezes if _squeeze_dim(u) != p.dim]
        if bad:
            return Miss(f"{bad[0]} is not a squeeze on the split's dim {p.dim}")
        return mutation_miss(p.input) or Match(node, [node, *(g for g, _ in items), *(u for u, _ in squeezes)],
                                               {"parts": p, "items": items, "squeezes": squeezes})

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        p: Parts = m.info["parts"]
        with rw.inserting_before(p.node):
            get = getitems_of(rw, call(rw, torch.unbind, p.input, dim=p.dim))
            for u, i in m.info["squeezes"]:
                swap(rw, u, get(i))
        for g, _ in m.info["items"]:
            rw.erase(g)
        rw.erase(p.node)


# =========================================================================== unbind_stack_pass


@register
class MergeUnbindStack(RewritePattern):
    """``UnbindCatRemover`` in our form: when every use of every piece of ``u = unbind(y, a)``
    is inside a run of all the pieces, in order, in a cat or stack, each such run becomes a
    view of ``y`` (``movedim(y, a, e)``, flattened for a cat); other entries of a stack are
    stacked, and the parts joined with a cat. The unbind goes."""

    name = "merge_unbind_stack"
    upstream = "unbind_stack_pass (merge_unbind_stack, UnbindCatRemover)"
    description = "Replace cats/stacks of all the pieces of an unbind, in order, by views of its input."
    preconditions = ("every piece of the unbind has a getitem, and every use of a piece is in a run of all "
                     "the pieces, in order, in a cat or stack (any dims; other entries allowed)",
                     "no value aliasing the input or a rewritten cat/stack is written in place")
    anchors = frozenset(UNBIND[0]) | frozenset(UNBIND[1])

    def match(self, node: Node):
        if off := off_anchor(self, node):
            return off
        p = parts_of(node)
        if isinstance(p, Miss) or not p.unbind:
            return p if isinstance(p, Miss) else Miss("not an unbind")
        items = getitem_users(p)
        if isinstance(items, Miss):
            return items
        if {i for _, i in items} != set(range(len(p.sizes))):
            return Miss("not every piece of the unbind is used")
        layouts = cat_stack_layouts(p, items)
        if (any(u not in layouts for g, _ in items for u in g.users)
                or any(isinstance(s, Run) and not s.full for segs, _ in layouts.values() for s in segs)):
            return Miss("a piece is used outside a run of all the pieces in a cat or stack")
        return mutation_miss(p.input, *layouts) or Match(node, [node, *(g for g, _ in items), *layouts],
                                                        {"parts": p, "items": items, "layouts": layouts})

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        p: Parts = m.info["parts"]
        for user, (segs, e) in m.info["layouts"].items():
            stack = is_call(user, *STACK)
            rebuild(rw, user, segs, lambda r: as_block(rw, p.input, r, stack, e) if r.full else None, e)
        _erase_if_unused(rw, [*(g for g, _ in m.info["items"]), p.node])


# =========================================================================== merge_getitem_cat_pass / mutate_cat_pass


def single_run(node: Node) -> tuple[Run, int] | Miss:
    """For a cat whose inputs are exactly consecutive pieces of one split on the cat's
    dim, in order: (that Run, the dim); else a Miss naming what differs."""
    ca = cat_args(node)
    if isinstance(ca, Miss):
        return ca
    tensors, d = ca
    segs = segments(tensors, getitem_piece(lambda q: not q.unbind and q.dim == d))
    if len(segs) != 1 or not isinstance(segs[0], Run):
        return Miss("cat inputs are not consecutive pieces, in order, of one split on the cat's dim")
    return segs[0], d


@register
class MergeGetitemCat(RewritePattern):
    """``s = split(x, [a, b, c], d); y = cat([s0, s1], d)`` -> ``s = split(x, [a+b, c], d);
    y = s[0]``, the other getitems renumbered."""

    name = "merge_getitem_cat"
    upstream = "merge_getitem_cat_pass (merge_getitem_cat)"
    description = "A cat of consecutive split pieces used nowhere else becomes one piece of a coarser split."
    preconditions = ("the cat's inputs are >= 2 consecutive pieces, in order, of one split, on the split's dim",
                     "each of those getitems is used only by the cat",
                     "every user of the split is a getitem with a constant index",
                     "no value aliasing the input or the cat is written in place")
    anchors = frozenset(CAT[0])

    def match(self, node: Node):
        if off := off_anchor(self, node):
            return off
        r = single_run(node)
        if isinstance(r, Miss):
            return r
        run, _ = r
        if run.n < 2:
            return Miss("the cat takes a single piece")
        if any(len(g.users) != 1 for g in run.items):
            return Miss("a piece in the cat has other users")
        items = getitem_users(run.parts)
        if isinstance(items, Miss):
            return items
        return mutation_miss(run.parts.input, node) or Match(
            node, [node, *(g for g, _ in items), run.parts.node], {"run": run, "items": items})

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        run: Run = m.info["run"]
        p = run.parts
        sizes = p.sizes[:run.first] + [run.length] + p.sizes[run.last + 1:]
        with rw.inserting_before(p.node):  # erased last, so the insert point stays live
            get = getitems_of(rw, call(rw, torch.split, p.input, sizes, dim=p.dim))
            swap(rw, m.anchor, get(run.first))
            for g, j in m.info["items"]:
                if run.first <= j <= run.last:
                    rw.erase(g)
                else:
                    swap(rw, g, get(j if j < run.first else j - run.n + 1))
        rw.erase(p.node)


@register
class MutateCat(RewritePattern):
    """``y = cat([s_i .. s_j], d)`` of consecutive pieces of ``s = split(x, sizes, d)`` ->
    ``y = narrow(x, d, offset_i, size_i + .. + size_j)``; ``y = x`` when they are all the pieces."""

    name = "mutate_cat"
    upstream = "mutate_cat_pass (mutate_cat_node)"
    description = "A cat of consecutive split pieces on the split's dim is a slice of the split's input."
    preconditions = ("the cat's inputs are consecutive pieces, in order, of one split, on the split's dim",
                     "(the getitems may have other users)",
                     "no value aliasing the input or the cat is written in place")
    anchors = frozenset(CAT[0])

    def match(self, node: Node):
        if off := off_anchor(self, node):
            return off
        r = single_run(node)
        if isinstance(r, Miss):
            return r
        run, _ = r
        return mutation_miss(run.parts.input, node) or Match(node, [node, *run.items, run.parts.node], {"run": run})

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        run: Run = m.info["run"]
        cat, *rest = m.nodes
        if run.full:
            rw.replace_all_uses(cat, run.parts.input)
            rw.erase(cat)
        else:
            with rw.inserting_before(cat):
                swap(rw, cat, call(rw, torch.narrow, run.parts.input, run.parts.dim, run.offset, run.length))
        _erase_if_unused(rw, rest)
