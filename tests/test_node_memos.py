"""Answers kept on FX nodes and graphs between queries (a linear's operands, a node's value
signature, the placeholders' storage spans) follow every change of what they read: the
node's target and arguments and its inputs' example values."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.fx import symbolic_trace

from optimus_lens.core import meta
from optimus_lens.core.miss import Miss
from optimus_lens.core.opschema import node_signature, value_signature
from optimus_lens.core.outputs import placeholder_spans
from optimus_lens.passes.linears import LinearOperands, linear_operands


class Linear(torch.nn.Module):
    def forward(self, x, w, b):
        return F.linear(x, w, b)


def _linear_graph():
    g = symbolic_trace(Linear()).graph
    x, w, b = (n for n in g.nodes if n.op == "placeholder")
    lin = next(n for n in g.nodes if n.op == "call_function")
    for n, v in ((x, torch.randn(4, 8)), (w, torch.randn(16, 8)), (b, torch.randn(16))):
        n.meta["example_value"] = v
    return x, w, b, lin


def test_linear_operands_follow_a_new_example_value_of_an_input():
    x, w, b, lin = _linear_graph()
    first = linear_operands(lin)
    assert isinstance(first, LinearOperands) and first.w is w
    assert linear_operands(lin) is first  # nothing changed: the kept answer
    w.meta["example_value"] = torch.randn(2, 16, 8)  # a 3-D weight is no linear's
    miss = linear_operands(lin)
    assert isinstance(miss, Miss) and "3-D" in miss
    w.meta["example_value"] = torch.randn(16, 8)
    assert isinstance(linear_operands(lin), LinearOperands)


def test_linear_operands_follow_new_arguments_and_target():
    x, w, b, lin = _linear_graph()
    assert linear_operands(lin).b is b
    lin.args = (x, w)  # the bias dropped
    assert linear_operands(lin).b is None
    lin.target = torch.relu
    assert isinstance(linear_operands(lin), Miss)


def test_node_signature_is_the_value_signature_of_the_current_example_value():
    x, _, _, lin = _linear_graph()
    v = x.meta["example_value"]
    assert node_signature(x, v) == value_signature(v)
    t = torch.randn(8, 4).t()  # same shape, other strides
    x.meta["example_value"] = t
    assert node_signature(x, t) == value_signature(t) != value_signature(v)
    pieces = torch.randn(3, 4).unbind(0)
    assert node_signature(lin, pieces) == value_signature(pieces)


def test_placeholder_spans_follow_views_of_one_storage_and_new_example_values():
    class Three(torch.nn.Module):
        def forward(self, a, b, n):
            return a + b * n

    g = symbolic_trace(Three()).graph
    a, b, n = (p for p in g.nodes if p.op == "placeholder")
    base = torch.randn(4, 8)
    a.meta["example_value"], b.meta["example_value"], n.meta["example_value"] = base[:2], base[1:3], 3
    sa, sb, sn = placeholder_spans(g)
    assert sn is None  # not a tensor
    assert sa[0] == sb[0] and sb[1] < sa[2]  # one storage, rows 1..2 overlap rows 0..1
    b.meta["example_value"] = torch.randn(2, 8)
    sa2, sb2, _ = placeholder_spans(g)
    assert sa2 == sa and sb2[0] != sa[0]  # b now has a storage of its own
    assert meta.value(b) is b.meta["example_value"]
