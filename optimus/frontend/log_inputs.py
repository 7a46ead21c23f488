"""Example inputs for a graph read from a compile log: tensors made from the recorded metas.

A log records each graph input's dtype, sizes, strides and device (the readable code's
annotations; ``describe_tensor`` adds whether it is a parameter) but never its values.
:func:`example_inputs` makes seeded values of exactly that layout (``torch.as_strided`` on
a storage as long as the strides reach, so transposed, sliced and expanded inputs keep
their strides) and says in plain words what it had to choose:

* floating inputs: standard normal; parameters (``describe_tensor``'s ``is_parameter``, or
  Dynamo's ``..._parameters_...`` name) uniform in +-1/sqrt(fan-in) as ``nn.Linear``
  initialises them, so activations stay of order one through deep graphs;
* integer inputs: values the ops reading them accept, read from the graph
  (:func:`int_ranges`): indices below an ``embedding``'s ``num_embeddings`` (the weight's
  first size), below the indexed size of ``index_select`` / ``gather`` / ``scatter`` /
  ``x[idx]``, below ``one_hot``'s ``num_classes``, below the class count of
  ``cross_entropy`` / ``nll_loss``; an ``embedding_bag``'s offsets start at 0, never
  decrease and stay at most the number of indices (its last is that number with
  ``include_last_offset``). Views, reshapes and dtype conversions between the input and
  the op are followed. An integer input no such op reads gets 0 or 1, and a note says so;
* booleans: random; SymInt inputs: the size the log recorded for the symbol
  (``create_symbol``'s value).

Sizes and strides that are symbolic (``s0``, ``16*s0``) are evaluated with the symbols'
recorded values; a symbol the log gives no value for is an error naming it.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.fx import GraphModule, Node

from optimus_lens.frontend.readable import LoggedMeta, logged_meta

F = torch.nn.functional
aten = torch.ops.aten

#: values of an integer input no op tells the range of: [0, UNKNOWN_HIGH)
UNKNOWN_HIGH = 2


class InputError(ValueError):
    """An input of a logged graph that cannot be made: no recorded meta, or a size whose
    symbol the log gives no value for."""


# --------------------------------------------------------------------------- sizes


def _floor_div(a, b):
    return a // b


def _ceil_div(a, b):
    return -(-a // b)


_SIZE_FUNCS: dict[str, Callable] = {
    "Max": max,
    "Min": min,
    "FloorDiv": _floor_div,
    "CeilDiv": _ceil_div,
    "CeilToInt": math.ceil,
    "FloorToInt": math.floor,
    "Mod": operator.mod,
    "PythonMod": operator.mod,
    "ModularIndexing": lambda x, d, m: (x // d) % m,
    "TruncToInt": math.trunc,
    "sympy_max": max,
}
_SIZE_EXPR = re.compile(r"^[\w\s+\-*/%(),.]*$")


def size_value(text: str, symbols: dict[str, int]) -> int:
    """One size or stride of an annotation (``16``, ``s0``, ``16*s0``, ``Max(1, s0)``) as an
    int, symbols replaced by their recorded values. Raises InputError naming a symbol
    with no value, or an expression this cannot evaluate."""
    text = text.strip()
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    names = set(re.findall(r"[A-Za-z_]\w*", text)) - set(_SIZE_FUNCS)
    missing = sorted(n for n in names if n not in symbols)
    if missing:
        raise InputError(f"size {text!r}: the log records no value for {', '.join(missing)}")
    if not _SIZE_EXPR.match(text):
        raise InputError(f"size {text!r}: not an expression of sizes")
    try:
        v = eval(text, {"__builtins__": {}}, {**_SIZE_FUNCS, **symbols})  # noqa: S307 - checked: names and arithmetic only
    except Exception as e:  # noqa: BLE001
        raise InputError(f"size {text!r}: cannot evaluate: {e}") from e
    return int(v)


def sizes(m: LoggedMeta, symbols: dict[str, int]) -> tuple[list[int], list[int]]:
    """(sizes, strides) of a tensor annotation, evaluated; strides contiguous where the
    annotation has none (``TORCH_COMPILE_DEBUG``'s ``fx_graph_readable.py``)."""
    shape = [size_value(s, symbols) for s in m.shape]
    if m.stride is not None:
        return shape, [size_value(s, symbols) for s in m.stride]
    stride, acc = [], 1
    for s in reversed(shape):
        stride.append(acc)
        acc *= max(s, 1)
    return shape, stride[::-1]


def node_shape(n, symbols: dict[str, int]) -> list[int] | None:
    """A node's logged sizes, evaluated (else the static sizes of its example value, or of
    ``meta["shape"]`` — a list of ints —, as a graph rebuilt from a trace carries them);
    None when it has none or a size cannot be evaluated."""
    if not isinstance(n, Node):
        return None
    m = logged_meta(n)
    if m is None or m.dtype is None:
        from optimus_lens.core import meta

        v = meta.tensor(n)
        shape = list(v.shape) if v is not None else n.meta.get("shape")
        ok = isinstance(shape, list) and all(type(d) is int for d in shape)
        return shape if ok else None
    try:
        return [size_value(s, symbols) for s in m.shape]
    except InputError:
        return None


def _is_int(ph: Node) -> bool:
    """An integer (not bool) tensor placeholder, by its logged annotation or ``meta["dtype"]``."""
    m = logged_meta(ph)
    dt = m.dtype if m is not None else ph.meta.get("dtype")
    return isinstance(dt, torch.dtype) and not (dt.is_floating_point or dt.is_complex or dt == torch.bool)


# --------------------------------------------------------------------------- integer ranges


@dataclass
class IntRange:
    """What values an integer input may hold: ``[0, high)`` for indices (``why``: the op and
    the size that bounds them), or an offsets vector (``offsets_of``: the number of
    indices; ``include_last``: its last entry is that number)."""

    high: int | None = None
    why: str = ""
    offsets_of: int | None = None
    include_last: bool = False


def _get(n: Node, pos: int, name: str, default=None):
    if len(n.args) > pos:
        return n.args[pos]
    return n.kwargs.get(name, default)


def _dim_size(n: Node, base, dim, symbols) -> int | None:
    shape = node_shape(base, symbols)
    if shape is None or not isinstance(dim, int) or not -len(shape) <= dim < len(shape):
        return None
    return shape[dim]


#: (targets, position and name of the index argument, function giving its bound)
def _index_ops() -> list[tuple[set, int, str, Callable]]:
    def weight_rows(pos: int, name: str) -> Callable:
        return lambda n, s: _dim_size(n, _get(n, pos, name), 0, s)

    def along_dim(n, s):
        return _dim_size(n, _get(n, 0, "input", _get(n, 0, "self")), _get(n, 1, "dim"), s)

    def classes(pos: int) -> Callable:
        def bound(n, s):
            shape = node_shape(_get(n, pos, "input", _get(n, pos, "self")), s)
            return None if not shape else (shape[1] if len(shape) >= 2 else shape[0])

        return bound

    def one_hot(n, s):
        k = _get(n, 1, "num_classes", -1)
        return k if isinstance(k, int) and k > 0 else None

    def num_weights(n, s):
        k = _get(n, 2, "num_weights")
        return k if isinstance(k, int) else None

    bags = {aten.embedding_bag.default, aten._embedding_bag.default, aten._embedding_bag_forward_only.default}
    return [
        ({F.embedding}, 0, "input", weight_rows(1, "weight")),
        ({torch.embedding, aten.embedding.default}, 1, "indices", weight_rows(0, "weight")),
        ({F.embedding_bag}, 0, "input", weight_rows(1, "weight")),
        ({torch.embedding_bag, *bags}, 1, "indices", weight_rows(0, "weight")),
        ({torch.index_select, aten.index_select.default, "index_select"}, 2, "index", along_dim),
        ({torch.gather, aten.gather.default, "gather"}, 2, "index", along_dim),
        (
            {
                torch.scatter,
                torch.scatter_add,
                aten.scatter.src,
                aten.scatter.value,
                aten.scatter_add.default,
                "scatter",
                "scatter_",
                "scatter_add",
                "scatter_add_",
            },
            2,
            "index",
            along_dim,
        ),
        ({F.one_hot, aten.one_hot.default}, 0, "tensor", one_hot),
        ({F.cross_entropy, F.nll_loss}, 1, "target", classes(0)),
        ({aten.nll_loss_forward.default, aten.nll_loss2d_forward.default}, 1, "target", classes(0)),
        ({aten.nll_loss_backward.default, aten.nll_loss2d_backward.default}, 2, "target", classes(1)),
        ({aten.embedding_dense_backward.default}, 1, "indices", num_weights),
    ]


#: (targets, position and name of the offsets, of the indices, of include_last_offset)
_BAG_OFFSETS = [
    ({F.embedding_bag}, 2, "offsets", 0, "input", 9, "include_last_offset"),
    (
        {
            torch.embedding_bag,
            aten.embedding_bag.default,
            aten._embedding_bag.default,
            aten._embedding_bag_forward_only.default,
        },
        2,
        "offsets",
        1,
        "indices",
        7,
        "include_last_offset",
    ),
]

#: ops whose output holds the values of their first input (views, copies, dtype casts,
#: and the pieces of a split): an index read through them is still the input's
_SAME_VALUES_METHODS = {
    "view",
    "reshape",
    "flatten",
    "contiguous",
    "long",
    "int",
    "to",
    "type",
    "squeeze",
    "unsqueeze",
    "clone",
    "permute",
    "transpose",
    "t",
    "expand",
    "expand_as",
    "view_as",
    "reshape_as",
    "detach",
    "cpu",
    "cuda",
    "split",
    "chunk",
    "unbind",
}


def _same_values_functions() -> set:
    return {
        torch.flatten,
        torch.reshape,
        torch.squeeze,
        torch.unsqueeze,
        torch.clone,
        torch.permute,
        torch.transpose,
        torch.t,
        torch.detach,
        torch.split,
        torch.chunk,
        torch.unbind,
        torch.tensor_split,
        aten.view.default,
        aten.reshape.default,
        aten._unsafe_view.default,
        aten.clone.default,
        aten.squeeze.dim,
        aten.squeeze.dims,
        aten.squeeze.default,
        aten.unsqueeze.default,
        aten.permute.default,
        aten.expand.default,
        aten.slice.Tensor,
        aten.select.int,
        aten._to_copy.default,
        aten.alias.default,
        aten.t.default,
        aten.transpose.int,
        aten.split.Tensor,
        aten.split_with_sizes.default,
        aten.unbind.int,
        torch.ops.prims.convert_element_type.default,
    }


#: ops indexing a tensor (the base at the first position) with a tensor or a list of
#: them (at the second): ``x[idx]``, ``aten.index``, ``index_put`` and their unsafe forms
_INDEXING = {
    operator.getitem: (0, 1),
    aten.index.Tensor: (0, 1),
    aten._unsafe_index.Tensor: (0, 1),
    aten.index_put.default: (0, 1),
    aten.index_put_.default: (0, 1),
    aten._unsafe_index_put.default: (0, 1),
    aten._unsafe_masked_index.default: (0, 2),
    aten._unsafe_masked_index_put_accumulate.default: (0, 2),
}


def _indexed_dim(index, n: Node) -> int | None:
    """Which dim of the indexed tensor ``n`` indexes in ``x[index]``."""
    if index is n:
        return 0
    if isinstance(index, (list, tuple)):
        for k, a in enumerate(index):
            if a is None or a is Ellipsis:
                return None  # a new or skipped dim: the position no longer names the dim
            if a is n:
                return k
    return None


def _key(t) -> object:
    return t if not isinstance(t, str) else ("method", t)


def int_ranges(gm: GraphModule, symbols: dict[str, int]) -> dict[str, IntRange]:
    """placeholder name -> the range of values the graph accepts for that integer input,
    read from the ops that consume it (see the module doc); inputs nothing bounds are
    left out. Where two uses bound one input the lower bound wins; an input used both
    as indices and as offsets keeps the offsets (and the note says which)."""
    index_ops = [(set(map(_key, ts)), pos, name, fn) for ts, pos, name, fn in _index_ops()]
    same = {_key(t) for t in _same_values_functions()} | {("method", m) for m in _SAME_VALUES_METHODS}
    out: dict[str, IntRange] = {}
    for ph in gm.graph.nodes:
        if ph.op != "placeholder" or not _is_int(ph):
            continue
        seen, todo, r = {ph}, [ph], IntRange()
        while todo:
            cur = todo.pop()
            for u in cur.users:
                key = _key(u.target) if u.op in ("call_function", "call_method") else None
                if u.op == "call_method":
                    key = ("method", u.target)
                for ts, pos, name, fn in index_ops:
                    if key in ts and _get(u, pos, name) is cur:
                        high = fn(u, symbols)
                        if high is not None and (r.high is None or high < r.high):
                            r.high, r.why = high, f"indices of {u.name} ({_op_name(u)}), below {high}"
                for ts, opos, oname, ipos, iname, lpos, lname in _BAG_OFFSETS:
                    if key in ts and _get(u, opos, oname) is cur:
                        n_idx = node_shape(_get(u, ipos, iname), symbols)
                        if n_idx is not None:
                            r.offsets_of, r.include_last = math.prod(n_idx), bool(_get(u, lpos, lname, False))
                            r.why = f"offsets of {u.name} ({_op_name(u)}) into {r.offsets_of} indices"
                if key in _INDEXING:
                    bpos, ipos = _INDEXING[key]  # type: ignore[index]
                    base, index = _get(u, bpos, "self"), _get(u, ipos, "indices")
                    if base is cur and not isinstance(index, Node):
                        if u not in seen:
                            seen.add(u)
                            todo.append(u)
                        continue
                    k = _indexed_dim(index, cur)
                    high = _dim_size(u, base, k, symbols) if k is not None else None
                    if high is not None and (r.high is None or high < r.high):
                        r.high, r.why = high, f"indices of {u.name} (dim {k} of {base.name}), below {high}"
                elif key in same and u.args and u.args[0] is cur and u not in seen:
                    seen.add(u)
                    todo.append(u)
        if r.high is not None or r.offsets_of is not None:
            out[ph.name] = r
    return out


def _op_name(n: Node) -> str:
    t = n.target
    return t if isinstance(t, str) else getattr(t, "__name__", str(t))


# --------------------------------------------------------------------------- inputs


def is_parameter(ph: Node, described: dict | None) -> bool:
    """Whether a placeholder is a module's parameter: ``describe_tensor`` says so, or
    (without one) Dynamo's placeholder name has a ``_parameters_`` part."""
    if described is not None and "is_parameter" in described:
        return bool(described["is_parameter"])
    return "_parameters_" in str(ph.target)


def _strided(values: torch.Tensor, shape: list[int], stride: list[int]) -> torch.Tensor:
    """``values`` (a flat storage long enough) viewed with the logged sizes and strides."""
    return torch.as_strided(values, shape, stride)


def _storage_len(shape: list[int], stride: list[int]) -> int:
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * abs(st) for s, st in zip(shape, stride))


def int_values(n: int, dtype: torch.dtype, rng: IntRange | None, gen: torch.Generator) -> torch.Tensor:
    """``n`` values (a flat tensor) of an integer input with range ``rng``
    (:func:`int_ranges`): offsets into its indices, indices below its bound, or, with no
    range, values in [0, :data:`UNKNOWN_HIGH`)."""
    if rng is not None and rng.offsets_of is not None:
        return _offsets(n, rng.offsets_of, rng.include_last, gen).to(dtype)
    high = rng.high if rng is not None and rng.high is not None else UNKNOWN_HIGH
    return torch.randint(0, max(high, 1), (n,), generator=gen).to(dtype)


def _offsets(n: int, n_indices: int, include_last: bool, gen: torch.Generator) -> torch.Tensor:
    """``n`` bag offsets into ``n_indices`` indices: 0 first, non-decreasing, at most
    ``n_indices`` (the last equal to it with ``include_last``)."""
    if n <= 0:
        return torch.zeros(0, dtype=torch.int64)
    inner = torch.randint(0, n_indices + 1, (max(n - 1, 0),), generator=gen).sort().values
    out = torch.cat([torch.zeros(1, dtype=torch.int64), inner])
    if include_last and n > 1:
        out[-1] = n_indices
    return out


def make_input(
    ph: Node,
    m: LoggedMeta,
    symbols: dict[str, int],
    rng: IntRange | None,
    described: dict | None,
    device: str,
    seed: int,
) -> tuple[object, str | None]:
    """One example input of the logged meta ``m`` on ``device`` (see the module doc), and a
    note when its values are a guess. Raises InputError for a size that cannot be
    evaluated."""
    gen = torch.Generator().manual_seed(seed)
    if m.sym is not None:
        return size_value(m.sym, symbols), None
    assert m.dtype is not None
    shape, stride = sizes(m, symbols)
    n = _storage_len(shape, stride)
    dt, note = m.dtype, None
    if dt.is_floating_point or dt.is_complex:
        if is_parameter(ph, described):
            fan = shape[1] if len(shape) >= 2 else (shape[0] if shape else 1)
            bound = 1.0 / math.sqrt(max(fan, 1))
            flat = (torch.rand(n, generator=gen, dtype=torch.float32) * 2 - 1) * bound
        else:
            flat = torch.randn(n, generator=gen, dtype=torch.float32)
        flat = flat.to(dt)
    elif dt == torch.bool:
        flat = torch.randint(0, 2, (n,), generator=gen).bool()
    elif rng is not None and rng.offsets_of is not None:
        if len(shape) != 1:
            raise InputError(f"{ph.name}: offsets of {len(shape)} dimensions")
        flat = int_values(shape[0], dt, rng, gen)
        stride = [1]
    else:
        flat = int_values(n, dt, rng, gen)
    if rng is None and not (dt.is_floating_point or dt.is_complex or dt == torch.bool):
        note = (
            f"{ph.name} ({str(dt).replace('torch.', '')}{shape}): no op in the graph tells its range; "
            f"filled with values in [0, {UNKNOWN_HIGH})"
        )
    t = _strided(flat.to(device), shape, stride)
    if dt.is_floating_point and is_parameter(ph, described):
        grad = bool(described.get("requires_grad", True)) if described is not None else True
        return torch.nn.Parameter(t, requires_grad=grad), note
    return t, note


def example_inputs(
    gm: GraphModule,
    symbols: dict[str, int],
    described: dict[str, dict] | None = None,
    devices: dict[str, str] | None = None,
    seed: int = 0,
) -> tuple[tuple, list[str]]:
    """The graph's example inputs, in placeholder order, and the notes on what was
    guessed (see the module doc). ``described`` maps a placeholder's target to its
    ``describe_tensor`` record; ``devices`` maps a logged device to the one to make it on
    (``{"cuda:0": "cpu"}`` where there is no GPU). Input ``i`` is seeded with ``seed + i``,
    so the same log gives the same inputs. Raises InputError for an input with no
    recorded meta or a size the log gives no value for."""
    ranges = int_ranges(gm, symbols)
    out, notes = [], []
    for i, ph in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
        m = logged_meta(ph)
        if m is None or (m.dtype is None and m.sym is None):
            raise InputError(f"input {ph.target} has no recorded dtype and sizes in the log")
        dev = m.device or "cpu"
        dev = (devices or {}).get(dev, dev)
        rng = ranges.get(ph.name)
        try:
            value, note = make_input(ph, m, symbols, rng, (described or {}).get(str(ph.target)), dev, seed + i)
        except InputError as e:
            raise InputError(f"input {ph.target}: {e}") from e
        if rng is not None and note is None and (rng.high is not None or rng.offsets_of is not None):
            notes.append(f"{ph.name}: {rng.why}")
        if note:
            notes.append(note)
        out.append(value)
    return tuple(out), notes
