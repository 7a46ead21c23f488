"""Records are read in one pass (``record._record``: each field straight from the node,
the shape and stride lists of one shape shared between records, the snapshot made in the
program-order walk): every record a snapshot and a run's deltas hold equals the record
read field by field through the public readers, as the recorder read it before. Checked
on graphs with in-place writes and regions (``after`` / ``effects`` set), symbolic sizes
(the dim-by-dim path), split pieces, keyword arguments and modules."""

from __future__ import annotations

import enum
import operator
import random

import pytest
import torch
from torch.fx import Graph
from torch.fx.immutable_collections import immutable_list

from optimus_lens.core import meta, record
from optimus_lens.core.engine import Engine, RunOptions
from optimus_lens.core.trace import NodeRecord, Trace, source_of
from optimus_lens.frontend.capture import capture
from optimus_lens.passes import default_pipeline
from optimus_lens.sample_models import hazards, perf, random_models


def _arg_chain(a):
    """A node argument as plain data, by the ``isinstance`` chain alone (the general path)."""
    if isinstance(a, torch.fx.Node):
        return {"node": a.name}
    if isinstance(a, (list, tuple)):
        return [_arg_chain(x) for x in a]
    if isinstance(a, dict):
        return {str(k): _arg_chain(v) for k, v in a.items()}
    if isinstance(a, slice):
        return {"slice": [_arg_chain(a.start), _arg_chain(a.stop), _arg_chain(a.step)]}
    if a is None or isinstance(a, (bool, int, float, str)):
        return a
    if isinstance(a, torch.dtype):
        return str(a).replace("torch.", "")
    return repr(a)


def _field_by_field(node, order: record.ProgramOrder) -> NodeRecord:
    """``node``'s record read one field at a time through the public readers."""
    v = meta.value(node)
    mod, mod_type = record.module_path(node)
    seq_nr = node.meta.get("seq_nr")
    return NodeRecord(
        name=node.name,
        op=node.op,
        target=record.target_name(node),
        args=_arg_chain(node.args),
        kwargs=_arg_chain(dict(node.kwargs)) if node.kwargs else {},
        inputs=[n.name for n in node.all_input_nodes],
        shape=record._shape(v),
        dtype=record._dtype(v),
        module=mod,
        module_type=mod_type,
        source=source_of(node.meta.get("stack_trace")),
        stride=meta.strides(v),
        device=record._device(v),
        seq_nr=seq_nr if isinstance(seq_nr, int) else None,
        from_node=record.origins(node),
        after=order.after.get(node),
        effects=order.is_effect(node),
        target_module=record.op_module(node.target) if node.op == "call_function" else None,
    )


def _random_capture(seed: int, grad: bool = False, **spec):
    rng = random.Random(seed)
    s = random_models.random_spec(rng, hazards=hazards.HAZARDS)
    for k, v in spec.items():
        setattr(s, k, v)
    model, inputs = random_models.build(s)
    return capture(model, inputs, dynamic=s.dynamic, grad=grad), s


def _check_run(gm, inputs) -> int:
    """Runs the default pipeline on ``gm`` recording every step; checks the snapshot and every
    step's delta against the records read field by field. Returns the records checked."""
    engine = Engine(gm, inputs, default_pipeline(), RunOptions(verify="off", record=True))
    order = record.program_order(gm.graph)
    snap = engine.trace.initial_graph.nodes
    assert list(snap) == [n.name for n in gm.graph.nodes]
    checked = 0
    for n in gm.graph.nodes:
        assert snap[n.name] == _field_by_field(n, order), n.format_node()
        checked += 1
    for step in engine.steps():
        live = {n.name: n for n in gm.graph.nodes}
        for r in step.delta.upsert:
            assert r == _field_by_field(live[r.name], order), (step.index, r.name)
            checked += 1
    return checked


def test_towers_snapshot_and_deltas_are_the_records_read_field_by_field():
    model, inputs = perf.build_recsys_towers32()
    c = capture(model, inputs)
    assert _check_run(c.gm, c.example_inputs) > 100


@pytest.mark.parametrize("hazard", ["aten_inplace", "grad_region", "custom_op_write", "overlapping_inputs"])
def test_records_of_graphs_with_side_effects_are_the_records_read_field_by_field(hazard):
    c, _ = _random_capture(
        3, grad=hazard == "grad_region", hazards=[hazard], hazard_at=1, widths=[8] * 4, chains=[["relu", "linear"]] * 4
    )
    snap = record.snapshot_graph(c.gm.graph)
    assert any(r.effects for r in snap.nodes.values()) and any(r.after for r in snap.nodes.values())
    _check_run(c.gm, c.example_inputs)


def test_records_of_symbolic_sizes_are_the_records_read_field_by_field():
    c, spec = _random_capture(5, dynamic=True, hazards=[], widths=[8, 8, 8], chains=[["linear"]] * 3)
    assert any(
        isinstance(v, torch.Tensor) and v._has_symbolic_sizes_strides for v in (meta.value(n) for n in c.gm.graph.nodes)
    )
    _check_run(c.gm, c.example_inputs)


class _Small(enum.IntEnum):
    TWO = 2


class _Text(str):
    pass


def test_arguments_of_every_kind_are_written_as_the_isinstance_chain_writes_them():
    g = Graph()
    x = g.placeholder("x")
    values = [
        x,
        3,
        2.5,
        True,
        None,
        "s",
        _Text("t"),
        _Small.TWO,
        (x, 1, (2, x)),
        [x, [None]],
        immutable_list([x, 4]),
        {"a": x, 1: [x]},
        slice(1, None, 2),
        torch.float16,
        torch.device("cpu"),
        torch.Size([2, 3]),
        torch.contiguous_format,
        operator.add,
    ]
    for v in values:
        assert record._arg(v) == _arg_chain(v), v
        assert type(record._arg(v)) is type(_arg_chain(v)), v


def test_records_of_one_shape_share_their_lists_and_write_what_separate_lists_write():
    model, inputs = perf.build_recsys_towers32()
    gm = capture(model, inputs).gm
    snap = record.snapshot_graph(gm.graph)
    by_shape: dict[tuple, list] = {}
    for r in snap.nodes.values():
        if r.shape is not None and r.shape and not isinstance(r.shape[0], list):
            assert by_shape.setdefault(tuple(r.shape), r.shape) is r.shape  # one list per shape
    assert len(by_shape) < len(snap.nodes) // 4
    text = Trace(model="m", initial_graph=snap).dumps()
    assert Trace.loads(text).dumps() == text  # read back as separate lists, written the same
