"""The one-call reads of static example values give what the dim-by-dim reads give:
signatures, records, layout comparisons, contiguity, and the graph inputs' spans read
per storage. Each is checked against the general path on static, empty, strided, tuple
and symbolic values (a symbolic size takes the general path)."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx import Graph
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from optimus_lens.core import meta, record
from optimus_lens.core.effects import _same_layout
from optimus_lens.core.opschema import value_signature
from optimus_lens.core.outputs import InputSpans, input_spans, output_overlaps, placeholder_spans
from optimus_lens.core.strides import _contiguous_per_dim, _static_contiguous, same_static_strides


def _values():
    base = torch.randn(6, 8)
    return [
        base,
        base[1:4],  # offset 8
        base.t(),  # transposed
        base[:, ::2],  # gaps
        torch.empty(0, 3),
        torch.empty_strided((0, 3), (1, 0)),  # empty, odd strides
        torch.empty_strided((2, 1, 3), (3, 7, 1)),  # a size-1 dim with any stride
        torch.zeros(()),
    ]


def _dynamic(mode):
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
    return mode.from_tensor(torch.randn(4, 3), symbolic_context=ctx, source=ConstantSource("x"))


def _slow_signature(ev):
    size, stride, off = tuple(ev.shape), ev.stride(), ev.storage_offset()
    return ("t", size, stride, off, ev.dtype, str(ev.device))


def test_a_static_tensors_signature_is_its_sizes_strides_offset_dtype_and_device():
    for v in _values():
        assert value_signature(v) == _slow_signature(v)
    fake = FakeTensorMode().from_tensor(torch.randn(3, 5)[1:])
    assert value_signature(fake) == _slow_signature(fake)
    assert value_signature((fake, fake)) == (_slow_signature(fake),) * 2


def test_a_symbolic_tensors_signature_still_reads_its_hints():
    x = _dynamic(FakeTensorMode(shape_env=ShapeEnv()))
    assert x._has_symbolic_sizes_strides
    assert value_signature(x) == ("t", (4, 3), (3, 1), 0, torch.float32, "cpu")


def test_a_record_reads_shape_dtype_stride_and_device_as_the_separate_reads_do():
    cases = [*_values(), tuple(torch.randn(4, 6).unbind(0)), [torch.randn(2)], (), None, 3]
    cases.append(_dynamic(FakeTensorMode(shape_env=ShapeEnv())))
    for v in cases:
        want = (record._shape(v), record._dtype(v), meta.strides(v), record._device(v))
        assert record._value_parts(v) == want, v


def test_a_records_inputs_and_kwargs_are_the_nodes_own():
    g = Graph()
    x = g.placeholder("x")
    x.meta["example_value"] = torch.randn(2, 3)
    s = g.call_function(torch.sum, (x,), {"dim": 1})
    s.meta["example_value"] = torch.randn(2)
    r = record.node_record(s)
    assert r.inputs == ["x"] and r.kwargs == {"dim": 1}
    assert record.node_record(x).kwargs == {} and record.node_record(x).inputs == []


def test_layouts_compare_equal_exactly_when_sizes_and_strides_are_equal():
    vals = _values()
    for a in vals:
        for b in vals:
            same = tuple(a.shape) == tuple(b.shape) and a.stride() == b.stride()
            assert _same_layout(a, b) == same
            assert same_static_strides(a, b) == (a.stride() == b.stride())
    x = _dynamic(FakeTensorMode(shape_env=ShapeEnv()))
    assert not _same_layout(x, x)  # a symbolic size compares False
    assert not same_static_strides(torch.randn(3), torch.randn(3).to_sparse())


def _answer(f, v):
    try:
        return f(v)
    except Exception as e:  # noqa: BLE001 - the same failure counts as the same answer
        return type(e)


def _nested():
    return torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)])  # strided layout, no sizes


def test_contiguity_is_atens_for_a_non_empty_tensor_and_read_per_dim_for_an_empty_one():
    for v in _values():
        assert _static_contiguous(v) == _contiguous_per_dim(v), v.stride()
    odd = torch.empty_strided((0, 3), (1, 0))
    assert odd.is_contiguous() and not _static_contiguous(odd)  # ATen calls it contiguous; the rule does not


def _graph(values):
    g = Graph()
    ps = []
    for i, v in enumerate(values):
        p = g.placeholder(f"p{i}")
        p.meta["example_value"] = v
        ps.append(p)
    return g, ps


def test_the_inputs_spans_read_per_storage_give_the_overlaps_of_all_spans():
    base, other = torch.randn(6, 8), torch.randn(4)
    values = [base[:2], base[1:3], other, base[4:], 7, torch.randn(3)]
    g, ps = _graph(values)
    outs = [ps[0], ps[1], ps[2], ps[3], ps[5]]
    lazy = output_overlaps(outs, g)
    eager = output_overlaps(outs, g, placeholder_spans(g))
    assert lazy == eager
    assert [ins for ins, _ in lazy] == [(0, 1), (0, 1), (2,), (3,), (5,)]
    assert lazy[0][1] == (1,) and lazy[3][1] == ()  # outputs 0 and 1 share rows


def test_an_input_span_that_cannot_be_read_leaves_the_overlaps_undecided():
    g, ps = _graph([torch.randn(3), _dynamic_unhinted()])
    assert input_spans(g).unreadable
    assert output_overlaps([ps[0]], g) is None
    assert output_overlaps([ps[0]], g, placeholder_spans(g)) is None


def _dynamic_unhinted():
    """A FakeTensor whose size is an unbacked symbol (no hint): its span cannot be read."""
    mode = FakeTensorMode(shape_env=ShapeEnv())
    with mode:
        n = mode.shape_env.create_unbacked_symint()
        return torch.empty(n)


def test_the_inputs_spans_are_kept_until_an_input_value_changes():
    g, ps = _graph([torch.randn(3), torch.randn(2)])
    first = input_spans(g)
    assert input_spans(g) is first
    ps[1].meta["example_value"] = torch.randn(2)
    assert input_spans(g) is not first
    assert isinstance(InputSpans.of_spans(placeholder_spans(g)), InputSpans)


def test_a_getitem_is_no_side_effect_in_program_order_as_its_effect_says():
    import operator

    from optimus_lens.core import effects

    g = Graph()
    x = g.placeholder("x")
    x.meta["example_value"] = torch.randn(4, 6)
    pieces = g.call_function(torch.split, (x, 2))
    pieces.meta["example_value"] = torch.randn(4, 6).split(2)
    items = [g.call_function(operator.getitem, (pieces, i)) for i in range(2)]
    items[0].meta["example_value"] = pieces.meta["example_value"][0]
    odd = g.call_function(operator.getitem, (x, slice(0, 2)))  # a tensor indexed, no example value
    for n in (*items, odd):
        assert not record.has_side_effects(n)
        assert not effects.has_side_effects(n)


def test_contiguity_of_a_nested_or_mkldnn_tensor_is_the_per_dim_rules():
    others = [_nested()]
    if torch.backends.mkldnn.is_available():
        others.append(torch.randn(2, 3).to_mkldnn())
    for v in others:
        assert _answer(_static_contiguous, v) == _answer(_contiguous_per_dim, v)


def test_a_nested_input_leaves_the_overlaps_undecided_whatever_is_asked_first():
    x = torch.randn(4, 4)
    g, ps = _graph([x, _nested()])
    assert input_spans(g).unreadable  # known when the spans are grouped, before any output is asked about
    assert output_overlaps([ps[0]], g) is None
    assert output_overlaps([ps[0]], g, placeholder_spans(g)) is None
