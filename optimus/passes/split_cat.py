"""Split / cat / stack / unbind cleanups: remove the identity pairs batch fusions leave.

A fusion ends in ``unbind`` and the next one starts with ``stack`` of the same pieces;
``stack(unbind(Y, d)[0..n-1], d)`` is ``Y``. Likewise ``cat`` of every piece of a
``split`` in order, on the same dim, is the split's input. Each rule checks that the
pieces are *all* the pieces, in order, on the same (normalised) dim: a cat that
reorders or skips pieces is not an identity and is left alone (upstream:
torch/_inductor/fx_passes/split_cat.py, ``UnbindCatRemover`` / ``merge_getitem_cat``).
"""
from __future__ import annotations

from torch.fx import Graph, Node

from optimus import meta
from optimus.pattern import Match, Miss, RewritePattern, register
from optimus.passes.common import CAT, SPLIT, STACK, UNBIND, arg, dim_of, has_mutating_user, is_call, is_getitem


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


def _erase_if_unused(graph: Graph, nodes: list[Node]) -> None:
    for n in nodes:
        if not n._erased and not n.users:
            graph.erase_node(n)


@register
class RemoveUnbindStack(RewritePattern):
    """``stack([unbind(Y, d)[i] for i in 0..n-1], d)`` -> ``Y``."""

    name = "remove_unbind_stack"
    upstream = "unbind_stack_pass (UnbindCatRemover)"
    description = "A stack of every unbind piece, in order, on the unbind's dim is the unbind's input."
    preconditions = ("stack's inputs are getitems 0..n-1 of one unbind with n pieces",
                     "stack dim == unbind dim (after normalising negative dims)")
    anchors = frozenset(STACK[0])

    def match(self, node: Node):
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
        if has_mutating_user(node) or has_mutating_user(y):
            return Miss("the stack or its source is mutated in place")
        return Match(node, [node, *items, unbind], {"input": y})

    def rewrite(self, graph: Graph, m: Match) -> None:
        stack, *rest = m.nodes
        stack.replace_all_uses_with(m.info["input"])
        graph.erase_node(stack)
        _erase_if_unused(graph, rest)


@register
class RemoveStackUnbind(RewritePattern):
    """``unbind(stack(xs, d), d)[i]`` -> ``xs[i]``."""

    name = "remove_stack_unbind"
    upstream = "(none: upstream leaves these to Inductor)"
    description = "Unbinding a stack on the stack's dim gives back the stacked tensors."
    preconditions = ("unbind's input is a stack", "unbind dim == stack dim (normalised)",
                     "every user of the unbind is a getitem with a constant index")
    anchors = frozenset(UNBIND[0]) | frozenset(UNBIND[1])

    def match(self, node: Node):
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
        return Match(node, [node, s, *node.users], {"tensors": list(xs)})

    def rewrite(self, graph: Graph, m: Match) -> None:
        unbind, stack, *items = m.nodes
        xs = m.info["tensors"]
        for g in items:
            g.replace_all_uses_with(xs[g.args[1]])
            graph.erase_node(g)
        graph.erase_node(unbind)
        _erase_if_unused(graph, [stack])


@register
class RemoveSplitCat(RewritePattern):
    """``cat([split(x, sizes, d)[i] for i in 0..n-1], d)`` -> ``x``."""

    name = "remove_split_cat"
    upstream = "split_cat_pass / mutate_cat_pass (all sections consecutive -> input)"
    description = "A cat of every split piece, in order, on the split's dim is the split's input."
    preconditions = ("cat's inputs are getitems 0..n-1 of one split with n pieces (uneven sizes are fine)",
                     "cat dim == split dim (normalised)")
    anchors = frozenset(CAT[0])

    def match(self, node: Node):
        r = all_pieces_in_order(arg(node, 0, "tensors"), lambda p: is_call(p, *SPLIT))
        if isinstance(r, Miss):
            return r
        split, items = r
        p = pieces_of(split)
        if isinstance(p, Miss):
            return p
        x, sd, _ = p
        cd = dim_of(arg(node, 1, "dim", 0), meta.tensor(x).dim())
        if cd != sd:
            return Miss(f"cat dim {cd} != split dim {sd}")
        if has_mutating_user(node) or has_mutating_user(x):
            return Miss("the cat or the split input is mutated in place")
        return Match(node, [node, *items, split], {"input": x})

    def rewrite(self, graph: Graph, m: Match) -> None:
        cat, *rest = m.nodes
        cat.replace_all_uses_with(m.info["input"])
        graph.erase_node(cat)
        _erase_if_unused(graph, rest)


@register
class RemoveCatSplit(RewritePattern):
    """``split(cat(xs, d), sizes_of(xs), d)[i]`` -> ``xs[i]``."""

    name = "remove_cat_split"
    upstream = "(none)"
    description = "Splitting a cat back into the sizes of its inputs, on the cat's dim, gives back the inputs."
    preconditions = ("split's input is a cat on the same dim (normalised)",
                     "piece i has the size of cat input i along that dim",
                     "every user of the split is a getitem with a constant index")
    anchors = frozenset(SPLIT[0]) | frozenset(SPLIT[1])

    def match(self, node: Node):
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
        return Match(node, [node, c, *node.users], {"tensors": list(xs)})

    def rewrite(self, graph: Graph, m: Match) -> None:
        split, cat, *items = m.nodes
        xs = m.info["tensors"]
        for g in items:
            g.replace_all_uses_with(xs[g.args[1]])
            graph.erase_node(g)
        graph.erase_node(split)
        _erase_if_unused(graph, [cat])
