"""Reading split / unbind / cat / stack nodes: what the split/cat patterns match on.

:func:`parts_of` reads a split or unbind from its example value (:class:`Parts`: input,
normalised dim, section sizes), :func:`segments` groups a cat/stack list into
:class:`Run`\\ s of consecutive pieces, and the ``*_miss`` functions say why a site must be
left alone (an in-place write, a use that depends on strides). Sizes and dims come from
example values, so the patterns do not need ``normalization_pass`` to have run (upstream:
torch/_inductor/fx_passes/split_cat.py reads them from the normalised arguments).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.fx import Node

from optimus_lens.core import meta
from optimus_lens.core.aliasing import is_written
from optimus_lens.core.miss import Miss
from optimus_lens.core.strides import replace_miss
from optimus_lens.passes.common import CAT, SPLIT, STACK, UNBIND, arg, dim_of, is_call, is_getitem


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


def split_parts(node: Node) -> Parts | Miss:
    """:func:`parts_of` for a split only: an unbind is a Miss ("not a split")."""
    p = parts_of(node)
    return Miss("not a split") if isinstance(p, Parts) and p.unbind else p


def unbind_parts(node: Node) -> Parts | Miss:
    """:func:`parts_of` for an unbind only: a split is a Miss ("not an unbind")."""
    p = parts_of(node)
    return Miss("not an unbind") if isinstance(p, Parts) and not p.unbind else p


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
        return sum(self.parts.sizes[self.first : self.last + 1])


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
            read = parts_of(src)
            cache[src] = read if isinstance(read, Parts) and accept(read) else None
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


def block_ok(run: Run, stack: bool, e: int) -> bool:
    """Whether :func:`optimus_lens.passes.split_cat.build.as_block` can lay out ``run`` for a
    cat/stack on dim ``e``: unbind pieces always; split pieces in a cat on the split's dim
    always, otherwise only when the pieces have one size."""
    p = run.parts
    return p.unbind or (not stack and e == p.dim) or len(set(p.sizes[run.first : run.last + 1])) == 1


def layout_miss(items, xs) -> Miss | None:
    """A Miss when a piece ``g = P[i]`` among ``items`` (users of a split/unbind; other
    users are skipped) would be replaced by ``xs[i]`` with other strides that a use of
    ``g`` depends on (:func:`optimus_lens.core.strides.replace_miss`)."""
    for g in items:
        if is_getitem(g) and type(g.args[1]) is int:
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
