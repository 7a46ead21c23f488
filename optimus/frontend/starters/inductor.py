"""a * b + c -> addcmul, written in Inductor's own pattern language (torch._inductor.pattern_matcher).

``register_replacement(search_fn, replace_fn, example_inputs, trace_fn, pass_dicts)`` traces both
functions with ``trace_fn`` (``fwd_only``: Inductor's decompositions, the ATen ops post-grad
passes see) and files the search function's graph as a pattern in the ``PatternMatcherPass``.
Run it on the post-grad (ATen) graphs: ``optimus match MODEL --pattern-file F --stage post-grad``
previews every match and near miss, ``optimus run MODEL --pattern-file F --passes addcmul_fusion
--stage post-grad`` applies it one recorded step per replacement. The pass is named by its
``pass_name`` (else by the variable it is bound to); each registration by its search function.
"""

import torch
from torch._inductor.pattern_matcher import PatternMatcherPass, fwd_only, register_replacement

addcmul_pass = PatternMatcherPass(pass_name="addcmul_fusion")


def mul_add(x, y, z):
    return x * y + z


def addcmul(x, y, z):
    return torch.addcmul(z, x, y)


register_replacement(mul_add, addcmul, [torch.empty(4, 4) for _ in range(3)], fwd_only, addcmul_pass)
