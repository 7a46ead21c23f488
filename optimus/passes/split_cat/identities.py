"""The split/cat identities, as rules of the match language (:mod:`optimus_lens.core.lang`).

A fusion ends in ``unbind`` and the next one starts with ``stack`` of the same pieces;
``stack(unbind(Y, d)[0..n-1], d)`` is ``Y``. Likewise ``cat`` of every piece of a
``split`` in order, on the same dim, is the split's input, and taking apart what was just
put together gives back the parts. Each rule checks that the pieces are *all* the pieces,
in order, on the same (normalised) dim: a cat that reorders or skips pieces is not an
identity and is left alone (upstream: torch/_inductor/fx_passes/split_cat.py,
``UnbindCatRemover`` / ``merge_getitem_cat`` / ``remove_split_with_size_one``).
"""

from __future__ import annotations

from optimus_lens.core import meta
from optimus_lens.core.lang import ANY, Op, Pieces, Require, Rule, RulePattern, Var, check
from optimus_lens.core.miss import Miss
from optimus_lens.core.pattern import register
from optimus_lens.core.where import caller
from optimus_lens.passes.common import CAT, SPLIT, STACK, UNBIND, dim_of
from optimus_lens.passes.split_cat.analysis import layout_miss, mutation_miss, split_parts


def same_dim(rank_of: str, a: str, b: str, text: str) -> Require:
    """A condition: the dims bound to ``a`` and ``b``, normalised against the rank of the
    tensor bound to ``rank_of``, are one static dim; else ``text.format(dim_a, dim_b)``."""

    def why(bd):
        t = meta.tensor(bd[rank_of])
        if t is None:
            return f"{rank_of} has no example value"
        da, db = dim_of(bd[a], t.dim()), dim_of(bd[b], t.dim())
        if da is None or db is None:
            return "dim is not a static int"
        return None if da == db else text.format(da, db)

    return check(why)


def sizes_miss(split, xs) -> Miss | None:
    """A Miss unless piece i of ``split`` has the shape of ``xs[i]``, for every i."""
    pieces = [tuple(t.shape) for t in meta.value(split) or ()]
    inputs = [meta.shape(x) for x in xs]
    return None if pieces == inputs else Miss(f"split pieces {pieces} do not match the cat inputs {inputs}")


def one_piece(split) -> Miss | None:
    """A Miss unless ``split`` (read by :func:`split_parts`) yields exactly one piece."""
    p = split_parts(split)
    if isinstance(p, Miss):
        return p
    return None if len(p.sizes) == 1 else Miss(f"split yields {len(p.sizes)} pieces, not 1")


# stack([unbind(y, d)[0], ..., unbind(y, d)[n-1]], d) -> y
REMOVE_UNBIND_STACK = register(
    RulePattern(
        Rule(
            "remove_unbind_stack",
            Op(
                STACK,
                Pieces(Op(UNBIND, Var("y"), dim=Var("ud"))),
                dim=Var("sd"),
                name="stack",
                where=[
                    same_dim("y", "sd", "ud", "stack dim {} != unbind dim {}"),
                    check(lambda b: mutation_miss(b["stack"], b["y"])),
                ],
            ),
            lambda rw, y, **_: y,
            description="A stack of every unbind piece, in order, on the unbind's dim is the unbind's input.",
            preconditions=(
                "stack's inputs are getitems 0..n-1 of one unbind with n pieces",
                "stack dim == unbind dim (after normalising negative dims)",
                "no value aliasing the stack or the unbind input is written in place",
            ),
        ),
        source=caller(0),
        upstream="unbind_stack_pass (UnbindCatRemover)",
    )
)

# unbind(stack([x0, ..., xn-1], d), d)[i] -> xi
register(
    RulePattern(
        Rule(
            "remove_stack_unbind",
            Op(
                UNBIND,
                Op(STACK, Var("xs"), dim=Var("sd"), name="stack"),
                dim=Var("ud"),
                name="unbind",
                where=[
                    same_dim("stack", "ud", "sd", "unbind dim {} != stack dim {}"),
                    check(lambda b: mutation_miss(b["unbind"], *b["xs"]) or layout_miss(b["unbind"].users, b["xs"])),
                ],
            ),
            lambda rw, xs, **_: list(xs),
            pieces=True,
            description="Unbinding a stack on the stack's dim gives back the stacked tensors.",
            preconditions=(
                "unbind's input is a stack",
                "unbind dim == stack dim (normalised)",
                "every user of the unbind is a getitem with a constant index",
                "no value aliasing a piece or a stacked tensor is written in place",
                "no piece whose strides a use depends on (view, as_strided, graph output ...) gets other strides",
            ),
        ),
        source=caller(0),
        upstream="(none: upstream leaves these to Inductor)",
    )
)

# cat([split(x, sizes, d)[0], ..., split(x, sizes, d)[n-1]], d) -> x
register(
    RulePattern(
        Rule(
            "remove_split_cat",
            Op(
                CAT,
                Pieces(Op(SPLIT, Var("x"), ANY, dim=Var("sd"))),
                dim=Var("cd"),
                name="cat",
                where=[
                    same_dim("x", "cd", "sd", "cat dim {} != split dim {}"),
                    check(lambda b: mutation_miss(b["cat"], b["x"])),
                ],
            ),
            lambda rw, x, **_: x,
            description="A cat of every split piece, in order, on the split's dim is the split's input.",
            preconditions=(
                "cat's inputs are getitems 0..n-1 of one split with n pieces (uneven sizes are fine)",
                "cat dim == split dim (normalised)",
                "no value aliasing the cat or the split input is written in place",
            ),
        ),
        source=caller(0),
        upstream="split_cat_pass / mutate_cat_pass (all sections consecutive -> input)",
    )
)

# split(cat([x0, ..., xn-1], d), [size of each xi along d], d)[i] -> xi
register(
    RulePattern(
        Rule(
            "remove_cat_split",
            Op(
                SPLIT,
                Op(CAT, Var("xs"), dim=Var("cd"), name="cat"),
                ANY,
                dim=Var("sd"),
                name="split",
                where=[
                    same_dim("cat", "sd", "cd", "split dim {} != cat dim {}"),
                    check(lambda b: sizes_miss(b["split"], b["xs"])),
                    check(lambda b: mutation_miss(b["split"], *b["xs"]) or layout_miss(b["split"].users, b["xs"])),
                ],
            ),
            lambda rw, xs, **_: list(xs),
            pieces=True,
            description="Splitting a cat back into the sizes of its inputs, on the cat's dim, gives back the inputs.",
            preconditions=(
                "split's input is a cat on the same dim (normalised)",
                "piece i has the size of cat input i along that dim",
                "every user of the split is a getitem with a constant index",
                "no value aliasing a piece or a cat input is written in place",
                "no piece whose strides a use depends on (view, as_strided, graph output ...) gets other strides",
            ),
        ),
        source=caller(0),
        upstream="(none)",
    )
)

# split(x, [n], d)[0] -> x
register(
    RulePattern(
        Rule(
            "remove_split_with_size_one",
            Op(
                SPLIT,
                Var("x"),
                name="split",
                where=[check(lambda b: one_piece(b["split"])), check(lambda b: mutation_miss(b["x"]))],
            ),
            lambda rw, x, **_: [x],
            pieces=True,
            description="A split that yields a single piece is its input.",
            preconditions=(
                "split (any spelling) with example values yields exactly one piece",
                "every user is getitem 0 (or -1); at least one user",
                "no value aliasing the input is written in place",
            ),
        ),
        source=caller(0),
        upstream="remove_split_with_size_one_pass (remove_split_with_size_one)",
    )
)
