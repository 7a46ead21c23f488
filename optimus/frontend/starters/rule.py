"""Swish -> SiLU, written in the declarative match language (optimus_lens.core.lang).

``Op(target, *args, **kwargs)`` matches an FX node and its arguments; ``Var("x")`` captures
a value (used twice, both uses must be the same node); ``require`` adds a condition with
the reason shown when it fails. The replacement gets the Rewriter-like builder ``rw`` and
the captures, and returns the value that takes the matched root's place.
"""

import operator

import torch
import torch.nn.functional as F

from optimus_lens.core.lang import Op, Rule, Var, require

floating = require(lambda b: b["x"].meta["example_value"].dtype.is_floating_point, "x is not a float tensor")

PATTERNS = [
    Rule(
        "swish_to_silu",
        Op(operator.mul, Var("x"), Op(torch.sigmoid, Var("x")), where=[floating]),
        lambda rw, x: rw.call(F.silu, x),
        description="x * sigmoid(x) is SiLU",
    ),
]
