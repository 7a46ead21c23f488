"""Example values read off a node's inputs without a FakeTensor dispatch
(``optimus_lens.core.meta.infer``'s getitem and stack paths) equal what the dispatch gives."""

from __future__ import annotations

import operator

import pytest
import torch
from test_static_reads import _graph
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx import Graph

from optimus_lens.core import meta


def _layout(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.device, t.requires_grad, t.is_leaf)


def _node_on(values: list, target, extra_args=(), kwargs=None, as_list=True):
    g, ins = _graph(values)  # placeholders carrying the values
    first = ins if as_list else ins[0]
    return g.call_function(target, (first, *extra_args), kwargs or {})


def _dispatched(node):
    args = torch.fx.node.map_arg(node.args, lambda n: n.meta["example_value"])
    kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: n.meta["example_value"])
    mode = next(v.fake_mode for v in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(v, FakeTensor))
    with mode:
        return node.target(*args, **kwargs)


@pytest.fixture(scope="module")
def mode():
    return FakeTensorMode()


@pytest.mark.parametrize("dim", [0, 1, 2, -1, -3])
@pytest.mark.parametrize("grad", [False, True])
def test_stack_value_without_dispatch_equals_the_dispatched_one(mode, dim, grad):
    xs = [mode.from_tensor(torch.randn(4, 8)) for _ in range(5)]
    if grad:
        xs[2] = mode.from_tensor(torch.randn(4, 8, requires_grad=True))
    n = _node_on(xs, torch.stack, kwargs={"dim": dim})
    got = meta.infer(n)
    want = _dispatched(n)
    assert _layout(got) == _layout(want)
    assert got.untyped_storage()._cdata not in {x.untyped_storage()._cdata for x in xs}
    assert n.meta["example_value"] is got


def test_stack_of_non_contiguous_or_mixed_inputs_is_dispatched(mode):
    t = mode.from_tensor(torch.randn(8, 4)).t()  # (4, 8), strides (1, 4)
    xs = [t, mode.from_tensor(torch.randn(4, 8))]
    assert meta._stacked((xs,), {}) is None
    n = _node_on(xs, torch.stack)
    assert _layout(meta.infer(n)) == _layout(_dispatched(n))
    mixed = [mode.from_tensor(torch.randn(4, 8)), mode.from_tensor(torch.randn(4, 8, dtype=torch.float64))]
    assert meta._stacked((mixed,), {}) is None


def test_getitem_of_a_tuple_value_is_the_parents_element(mode):
    with mode:
        pieces = torch.unbind(torch.empty(3, 4, 8))
    g = Graph()
    p = g.placeholder("t")
    p.meta["example_value"] = pieces
    gi = g.call_function(operator.getitem, (p, 1))
    assert meta.infer(gi) is pieces[1]
    neg = g.call_function(operator.getitem, (p, -1))
    assert meta.infer(neg) is pieces[-1]


def _pieces_layout(ts) -> list:
    return [(*_layout(t), type(t), meta.storage_key(t), t.fake_mode, t.fake_device) for t in ts]


@pytest.mark.parametrize(
    "make, dim",
    [
        (lambda: torch.randn(128, 4, 8), 0),
        (lambda: torch.randn(4, 6, 8), 1),
        (lambda: torch.randn(8, 4, 3).transpose(0, 2), -1),  # non-contiguous parent
        (lambda: torch.randn(10, 6)[2:, 1:], 0),  # parent at a storage offset
        (lambda: torch.randn(5, dtype=torch.float16), 0),  # 0-d pieces
        (lambda: torch.randn(3, 0, 2), 2),  # empty pieces
    ],
)
def test_unbind_value_without_dispatch_equals_the_dispatched_one(mode, make, dim):
    x = mode.from_tensor(make())
    n = _node_on([x], torch.unbind, extra_args=(dim,), as_list=False)
    got = meta.infer(n)
    want = _dispatched(n)
    assert n.meta["example_value"] is got
    assert type(got) is tuple and len(got) == len(want)
    assert _pieces_layout(got) == _pieces_layout(want)
    assert all(meta.storage_key(p) == meta.storage_key(x) for p in got)  # views of the parent's storage
    assert all(meta._read_storage_key(p) == meta.storage_key(p) for p in got)  # the kept key is the storage's
    with mode:  # they compute as the dispatched pieces do
        assert _layout(got[-1] * 2) == _layout(want[-1] * 2)
        assert _layout(torch.stack(got)) == _layout(torch.stack(want))


def test_unbind_with_autograd_history_or_in_inference_mode_is_dispatched(mode):
    x = mode.from_tensor(torch.randn(4, 3, requires_grad=True))
    assert meta._unbound((x, 0), {}) is None
    n = _node_on([x], torch.unbind, extra_args=(0,), as_list=False)
    got = meta.infer(n)
    assert all(p.grad_fn is not None and p.requires_grad for p in got)
    y = mode.from_tensor(torch.randn(4, 3))
    with torch.inference_mode():
        assert meta._unbound((y, 0), {}) is None
    assert meta._unbound((y, 2), {}) is None  # out of range: the dispatch raises
    assert meta._unbound((y,), {"dim": 1}) is not None


def _state(t: FakeTensor) -> tuple:
    """What a FakeTensor is made of: its Python attributes (our kept storage key aside), the
    dispatch keys of its C-level tensor, its layout and storage, whether it requires grad."""
    attrs = {k: v for k, v in t.__dict__.items() if k not in (meta._SKEY, meta._SKEY_OF)}
    return (type(t), attrs, torch._C._dispatch_keys(t), _layout(t), t.untyped_storage()._cdata)


@pytest.mark.parametrize("unsafe_ptr", [False, True])
def test_fakes_made_in_one_go_equal_the_constructor_s(unsafe_ptr):
    fake = FakeTensorMode()
    fake._allow_unsafe_data_ptr_access = unsafe_ptr
    x = fake.from_tensor(torch.randn(6, 4, 3))
    with torch._subclasses.fake_tensor.in_kernel_invocation_manager(fake):
        metas = torch.ops.aten.unbind.int(x, 0)
    got = meta.fakes(fake, metas, x.fake_device)
    want = tuple(FakeTensor(fake, m, x.fake_device) for m in metas)
    assert [_state(t) for t in got] == [_state(t) for t in want]
    for t, u in zip(got, want):  # the data-pointer flag: both refuse, or both only warn
        outcomes = []
        for v in (t, u):
            try:
                v.untyped_storage().data_ptr()
                outcomes.append("allowed")
            except RuntimeError:
                outcomes.append("refused")
        assert outcomes[0] == outcomes[1]
    assert len({id(t.__dict__) for t in got}) == len(got)  # each has attributes of its own


def test_a_stack_of_one_unbind_s_pieces_reads_them_as_alike_and_equals_the_dispatched_one(mode):
    x = mode.from_tensor(torch.randn(6, 4, 8))
    y = mode.from_tensor(torch.randn(6, 4, 8))
    px, py = meta._unbound((x, 0), {}), meta._unbound((y, 0), {})
    assert meta.siblings(px) and meta.siblings(list(reversed(px[1:])))
    assert not meta.siblings([*px[:3], *py[:3]])  # two unbinds: each input is compared
    for xs in (list(px), [px[4], px[0], px[2]], [*px[:3], *py[:3]]):
        n = _node_on(xs, torch.stack, kwargs={"dim": 1})
        assert _layout(meta.infer(n)) == _layout(_dispatched(n))


def test_layout_record_is_the_tensor_s_static_layout_kept_on_it(mode):
    x = mode.from_tensor(torch.randn(6, 4, 8).transpose(1, 2))
    rec = meta.layout_record(x)
    assert rec == ((6, 8, 4), (32, 1, 8), torch.float32, "cpu") and meta.layout_record(x) is rec
    assert meta.signature(_graph([x])[1][0]) == ((6, 8, 4), torch.float32, "cpu")
    pieces = meta._unbound((mode.from_tensor(torch.randn(5, 3)), 0), {})
    assert all(meta.layout_record(p) is meta.layout_record(pieces[0]) for p in pieces)  # one record, made once
    assert meta.layout_record(pieces[0]) == ((3,), (1,), torch.float32, "cpu")
    assert meta.layout_record(torch.randn(2)) is None  # a real tensor: no record
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    sym = FakeTensorMode(shape_env=ShapeEnv())
    z = sym.from_tensor(
        torch.randn(4, 3),
        source=ConstantSource("z"),
        symbolic_context=StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC]),
    )
    assert meta.layout_record(z) is None  # symbolic sizes: no record, read each time
    assert meta.signature(_graph([z])[1][0])[0][0] == str(z.shape[0])


@pytest.mark.parametrize(
    "target, extra",
    [
        (torch.transpose, (1, 2)),
        (torch.transpose, (-1, 0)),
        (torch.unsqueeze, (1,)),
        (torch.unsqueeze, (-1,)),
        (torch.unsqueeze, (3,)),
    ],
)
def test_a_view_value_without_dispatch_equals_the_dispatched_one(mode, target, extra):
    x = mode.from_tensor(torch.randn(6, 4, 8)[:, 1:, :])  # at a storage offset, not contiguous
    n = _node_on([x], target, extra_args=extra, as_list=False)
    got = meta.infer(n)
    want = _dispatched(n)
    assert meta._viewed(target, (x, *extra), {}) is not None  # read off the kernel, not dispatched
    assert _layout(got) == _layout(want)
    assert meta.storage_key(got) == meta.storage_key(x) == meta._read_storage_key(got)
    with mode:  # it computes as the dispatched view does
        assert _layout(got * 2) == _layout(want * 2)


def test_a_view_the_kernel_refuses_or_of_a_tensor_with_history_is_dispatched(mode):
    x = mode.from_tensor(torch.randn(4, 3))
    assert meta._viewed(torch.transpose, (x, 0, 5), {}) is None  # the dispatch raises the op's error
    n = _node_on([x], torch.transpose, extra_args=(0, 5), as_list=False)
    with pytest.raises(IndexError):
        meta.infer(n)
    g = mode.from_tensor(torch.randn(4, 3, requires_grad=True))
    assert meta._viewed(torch.unsqueeze, (g, 0), {}) is None
    assert meta._viewed(torch.unsqueeze, (x,), {"dim": 0}) is None


@pytest.mark.parametrize("target", [torch.relu, torch.tanh, torch.sigmoid])
def test_a_pointwise_value_without_dispatch_equals_the_dispatched_one(mode, target):
    x = mode.from_tensor(torch.randn(6, 4, 8))
    n = _node_on([x], target, as_list=False)
    assert meta._pointwise((x,), {}) is not None
    got, want = meta.infer(n), _dispatched(n)
    assert _state(got)[1:4] == _state(want)[1:4]  # attributes, dispatch keys, layout
    assert meta.storage_key(got) not in (meta.storage_key(x), meta.storage_key(want))  # a fresh storage
    t = mode.from_tensor(torch.randn(8, 4)).t()  # not contiguous, an int tensor, history: dispatched
    i = mode.from_tensor(torch.arange(6))
    g = mode.from_tensor(torch.randn(3, requires_grad=True))
    assert meta._pointwise((t,), {}) is meta._pointwise((i,), {}) is meta._pointwise((g,), {}) is None


@pytest.mark.parametrize("bias", [(6, 1, 8), (8,), (6, 4, 8), None])
def test_a_batched_matmul_value_without_dispatch_equals_the_dispatched_one(mode, bias):
    x = mode.from_tensor(torch.randn(6, 4, 5))
    w = mode.from_tensor(torch.randn(6, 8, 5)).transpose(1, 2)  # (6, 5, 8), a view
    args = (x, w) if bias is None else (mode.from_tensor(torch.randn(*bias)), x, w)
    target = torch.bmm if bias is None else torch.baddbmm
    g, ins = _graph(list(args))
    n = g.call_function(target, tuple(ins))
    assert meta._batched_matmul(args, {}) is not None
    got, want = meta.infer(n), _dispatched(n)
    assert _state(got)[1:4] == _state(want)[1:4]


def test_a_batched_matmul_the_kernel_would_refuse_is_dispatched(mode):
    x = mode.from_tensor(torch.randn(6, 4, 5))
    w = mode.from_tensor(torch.randn(6, 4, 8))  # inner sizes differ
    assert meta._batched_matmul((x, w), {}) is None
    assert meta._batched_matmul((mode.from_tensor(torch.randn(6, 2, 8)), x, x.transpose(1, 2)), {}) is None
    assert meta._batched_matmul((x.double(), x.transpose(1, 2)), {}) is None  # mixed dtypes
