"""Op effects, read from the ops themselves: for every FX node, which of its inputs it
writes, which it may return as an alias (a view, or the input itself), whether it changes
global state (grad mode, autocast, inference mode) and whether it draws random numbers.

One analysis answers for the whole package (:func:`effect`, node in,
:class:`NodeEffect` out); the graph-wide questions built on it (alias classes, write
epochs, regions) are in :mod:`optimus_lens.core.aliasing`. No answer comes from an op's
name. The sources, in order:

* **an ATen overload** (``torch.ops.aten.mul_.Tensor``, a custom op made with
  ``torch.library.custom_op(..., mutates_args=...)``, whose declared mutations are alias
  annotations of its schema): the ``torch._C.FunctionSchema`` of the overload, the
  arguments bound to the call: ``Tensor(a!)`` is written, ``Tensor(a)`` is returned as an
  alias (its alias set is in a return's), ``Tag.nondeterministic_seeded`` draws random
  numbers. An ``OpOverloadPacket`` is read over every overload the call's arguments fit
  (conservatively over all of them when none does).
* **a torch-level function or Tensor method** (``F.relu(x, inplace=True)``,
  ``x.add_(1)``, ``torch.atleast_2d``, ``x.contiguous()``, ``operator.setitem``,
  ``operator.iadd``): resolved to the ATen overloads it runs by running it once on fresh
  FakeTensors shaped like the node's example inputs under a dispatch recorder
  (:func:`optimus_lens.core.opschema.probe`; one run per target and argument signature): the recorded overloads'
  schemas say what is written (mapped back to the inputs by storage), and a result that
  shares an input's storage is an alias (the input itself: :attr:`NodeEffect.identity`,
  e.g. eval-mode dropout, ``contiguous`` of a contiguous tensor). The schemas of the
  ATen ops of the same name (the JIT's builtin table for functions, ``torch.ops.aten.<m>``
  for methods) are added where they exist, so ``contiguous``/``to`` count as aliases even
  where this example copies.
* **the example values**: a node whose ``example_value`` shares an input's storage is an
  alias of it (``type_as``/``to`` of the same dtype, ``atleast_2d`` of a 2-D tensor).
* **getattr** of a Tensor attribute that is a tensor (``T``, ``mT``, ``H``, ``mH``,
  ``real``, ``imag``, ``data``): an alias of the tensor. ``getitem``: an alias of what it
  indexes.
* a call with no tensor inputs whose result is not a number (``torch._C._set_grad_enabled``,
  ``_enter_autocast`` / ``_exit_autocast``, ``_enter_inference_mode``): changes global
  state, a region boundary. Arithmetic on sizes (``operator.mul`` of SymInts) is pure.
* anything else (a Python callable outside torch, a higher-order op, a probe that
  raised): unknown, so it may write and alias every tensor it receives and change state.
"""

from __future__ import annotations

import operator
import types
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import Node

from optimus_lens.core import meta
from optimus_lens.core.argscan import nodes_in
from optimus_lens.core.meta import storages
from optimus_lens.core.opschema import (
    NUMBER,
    bind,
    call_signature,
    holds_storage,
    loose,
    named_overloads,
    overloads,
    params,
    probe,
    shared_inputs,
    value_kind,
)

#: modules whose functions may be run on FakeTensors to see what they dispatch (no global state)
PROBE_MODULES = frozenset(
    {
        "torch",
        "torch.functional",
        "torch.nn.functional",
        "torch._C._nn",
        "torch._C._linalg",
        "torch._C._fft",
        "torch._C._special",
        "torch._C._VariableFunctions",
        "torch.linalg",
        "torch.fft",
        "torch.special",
        "_operator",
        "operator",
    }
)
#: modules of plain arithmetic on Python numbers and SymInts (sizes computed in the graph)
NUMBER_MODULES = frozenset({"_operator", "operator", "math", "builtins", "torch"})
#: modules of functions that, given only numbers, compute a number and touch no state
ARITHMETIC_MODULES = frozenset({"_operator", "operator", "math"})


@dataclass(frozen=True)
class NodeEffect:
    """What one FX node does besides computing its value.

    ``writes``: the input nodes whose storage it writes (in place, ``out=``, a custom op's
    ``mutates_args``); ``aliases``: the input nodes whose storage its result may share;
    ``identity``: the input its result is, itself (eager mode returns it: eval-mode
    dropout, ``contiguous`` of a contiguous tensor), else None; ``state``: it changes
    global state every op reads (grad mode, autocast, inference mode), or is unknown;
    ``rng``: it draws from the random generator; ``source``: where the answer comes from."""

    writes: tuple[Node, ...] = ()
    aliases: tuple[Node, ...] = ()
    identity: Node | None = None
    state: bool = False
    rng: bool = False
    source: str = ""

    @property
    def effectful(self) -> bool:
        """Whether the node writes, changes state or draws random numbers (its place in
        the program matters beyond its data edges)."""
        return bool(self.writes) or self.state or self.rng


PURE = NodeEffect(source="no effect")
_MEMO = "_optimus_effect"  # the node attribute holding (target, args, kwargs, value, NodeEffect)


def effect(node: Node) -> NodeEffect:
    """The :class:`NodeEffect` of ``node`` (see the module docstring for the sources).
    Memoised on the node itself while its target, arguments and example value stay the
    same objects (a rewrite that changes them is answered afresh; a copied graph's nodes
    start with no memo), and for an erased node, whose arguments FX clears, as it was
    while it was in the graph (a step's checks read the nodes it replaced). Never raises: what cannot be read is the unknown, conservative
    answer."""
    m = node.meta
    value = m.get("example_value")
    if value is None:
        value = m.get("val")
    hit = node.__dict__.get(_MEMO)
    if hit is not None and hit[0] is node.target and hit[3] is value:
        if hit[1] is node._args and hit[2] is node._kwargs or node._erased:
            return hit[4]  # an erased node (FX clears its arguments) is answered as it was
        got = None if node.target is operator.getitem else _carried(hit, node, value)  # a getitem reads at once
    else:
        got = None
    if got is None:
        try:
            if node.target is operator.getitem and node.op == "call_function":
                got = _resolve(node)  # an alias of what it indexes, kept on it
            elif node.op == "call_function" and is_plain(node):
                got = _plain_effect(node, value)
            if got is None:
                got = _resolve_shared(node, value)
        except Exception as e:  # noqa: BLE001 - an op we cannot read is unknown, not an error
            got = _unknown(node, f"cannot read its effects ({type(e).__name__})")
    object.__setattr__(node, _MEMO, (node.target, node._args, node._kwargs, value, got))  # not Node.__setattr__
    return got


#: the effect of a call of a plain target (:func:`is_plain`): every overload's schema has no
#: write, no aliased return and no random tag, so neither its arguments nor its example
#: values can change the answer
_PLAIN_EFFECT = NodeEffect(source="schema: every overload of the target is pure and returns no alias")


def _plain_effect(node: Node, value: Any) -> NodeEffect | None:
    """:data:`_PLAIN_EFFECT` for a call of a plain target, unless its example value shares
    an input's storage (``aten._unsafe_view``: a view its schema does not declare), which
    :func:`_resolve` reads from the storages."""
    return None if shared_inputs(value, node._input_nodes) else _PLAIN_EFFECT


_RESOLVED: dict = {}  # signature (see _resolve_shared) -> the answer with inputs as slot numbers
_RESOLVED_LIMIT = 1 << 16


def _resolve_shared(node: Node, value: Any) -> NodeEffect:
    """:func:`_resolve`, shared between calls of one signature: the target, the arguments'
    structure and constants, each input's layout (its slot: a node passed twice is one
    input), the kind of the node's own example value (:func:`optimus_lens.core.opschema.value_kind`) and which
    inputs share its storage. Those are everything the answer is read from (the schema
    binding, the probe, which :func:`optimus_lens.core.opschema.probe` keys the same way,
    the storages, and the kind where no tensor comes in), so one answer serves every node
    of the signature, with its own inputs in their slots: the 128 ``relu`` s of a layer,
    or one node before and after a rewrite rewired it. A signature that cannot be formed
    (an unhashable constant, a symbolic size) is resolved as it stands. Raises what
    :func:`_resolve` raises."""
    if node.op not in ("call_function", "call_method") or node.target is operator.getitem or node.target is getattr:
        return _resolve(node)
    slots: dict[Node, int] = {}
    try:
        args, kwargs = call_signature(node._args, node._kwargs, slots)
        order = list(slots)
        key = (node.op, node.target, args, kwargs, value_kind(value), shared_inputs(value, order))
        hit = _RESOLVED.get(key)
    except (TypeError, ValueError):  # an unhashable constant or target, a symbolic size without hint
        return _resolve(node)
    if hit is not None:
        w, a, i, state, rng, source, whole = hit
        if whole is not None:  # names no input: one answer for every node of the signature
            return whole
        return NodeEffect(
            tuple(order[j] for j in w),
            tuple(order[j] for j in a),
            order[i] if i is not None else None,
            state,
            rng,
            source,
        )
    got = _resolve(node)
    try:
        slot = slots.__getitem__
        entry = (
            tuple(map(slot, got.writes)),
            tuple(map(slot, got.aliases)),
            slot(got.identity) if got.identity is not None else None,
            got.state,
            got.rng,
            got.source,
            None if got.writes or got.aliases or got.identity is not None else got,
        )
    except KeyError:  # an answer naming a node that is not an input: keep it to this node
        return got
    if len(_RESOLVED) >= _RESOLVED_LIMIT:
        _RESOLVED.clear()
    _RESOLVED[key] = entry
    return got


def _carried(hit: tuple, node: Node, value: Any) -> NodeEffect | None:
    """The memoised answer ``hit`` carried over to ``node``'s new arguments, or None to
    resolve afresh. A rewrite that rewires a node (``replace_all_uses``) gives it new
    argument objects that differ only in which nodes they name. The answer is a function
    of the target, the arguments' structure and constants, the layout of each input's
    example value (sizes, strides, dtype, device: what the schema binding and the probe
    read, :func:`optimus_lens.core.opschema.probe`'s signature) and which inputs share the
    node's own storage. So when every swapped input is laid out as the one it replaces,
    one node for one node, and shares the node's storage exactly when that one did, the
    old answer holds with the new inputs in place of the old. The storage offset may
    differ (the ``i``-th piece of an unbind starts ``i`` rows in): what an op writes or
    returns as an alias is fixed per argument by its schema's alias annotations, and
    which overloads a torch function dispatches is chosen by sizes, strides, dtype and
    device, never by where in its storage a tensor starts; so the 128 uses of a fused
    group's pieces keep their answers."""
    swap: dict[Node, Node] = {}
    if not _same_but_inputs(hit[1], node._args, swap) or not _same_but_inputs(hit[2], node._kwargs, swap):
        return None
    if len(swap) > 1 and (len(set(swap.values())) != len(swap) or any(n in swap for n in swap.values())):
        return None  # two inputs became one, or an input moved to another's place (one swap can do neither)
    if swap and not _same_sharing(value, swap):
        return None
    e = hit[4]
    if not (e.writes or e.aliases or e.identity is not None):
        return e
    sw = swap.get
    return NodeEffect(
        tuple(sw(n, n) for n in e.writes),
        tuple(sw(n, n) for n in e.aliases),
        sw(e.identity, e.identity) if e.identity is not None else None,
        e.state,
        e.rng,
        e.source,
    )


def _same_sharing(value: Any, swap: dict[Node, Node]) -> bool:
    """Whether each new input of ``swap`` (old -> new) shares a storage with ``value``
    exactly when the input it replaces does."""
    if isinstance(value, torch.Tensor):  # the common case: one storage, compared by key
        mine = meta.storage_key(value)
        if mine is None:
            return True  # shares with nothing
        for a, b in swap.items():
            if holds_storage(meta.value(a), mine) != holds_storage(meta.value(b), mine):
                return False
        return True
    ks = storages(value)
    return all(bool(storages(meta.value(a)) & ks) == bool(storages(meta.value(b)) & ks) for a, b in swap.items())


def _same_but_inputs(a: Any, b: Any, swap: dict) -> bool:
    """Whether ``b`` is ``a`` with some input nodes replaced by nodes of the same layout
    (recorded in ``swap``, old -> new), constants equal and of the same type."""
    if a is b:
        return True
    ta = type(a)
    if ta is not type(b):
        return False
    if ta is Node:
        if swap.setdefault(a, b) is not b:
            return False
        return _same_layout(meta.value(a), meta.value(b))
    if ta is tuple or ta is list or isinstance(a, (tuple, list)):
        if len(a) != len(b):
            return False
        for x, y in zip(a, b):
            if x is not y and not _same_but_inputs(x, y, swap):
                return False
        return True
    if isinstance(a, dict):
        if a.keys() != b.keys():
            return False
        for k, x in a.items():
            y = b[k]
            if x is not y and not _same_but_inputs(x, y, swap):
                return False
        return True
    if isinstance(a, torch.Tensor) or ta is slice:
        return False
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - an incomparable constant: resolve afresh
        return False


def _same_layout(x: Any, y: Any) -> bool:
    """Whether two example values have the same sizes, strides, dtype and device
    (statically: a symbolic size compares False; the storage offset may differ, see
    :func:`_carried`), or are equal numbers/None. Two FakeTensors with static layouts compare
    their kept records (:func:`optimus_lens.core.meta.layout_record`; one unbind's pieces share
    one)."""
    rx = meta.layout_record(x)
    if rx is not None:
        ry = meta.layout_record(y)
        if ry is not None:
            return rx is ry or rx == ry
    if isinstance(x, torch.Tensor):
        if not isinstance(y, torch.Tensor):
            return False
        try:
            if not (x._has_symbolic_sizes_strides or y._has_symbolic_sizes_strides):  # plain ints
                return x.shape == y.shape and x.stride() == y.stride() and x.dtype is y.dtype and x.device == y.device
            if x.dtype is not y.dtype or x.device != y.device:
                return False
            sx, sy, tx, ty = tuple(x.shape), tuple(y.shape), x.stride(), y.stride()
        except Exception:  # noqa: BLE001 - a tensor without strides
            return False
        if not all(type(v) is int for v in (*sx, *sy, *tx, *ty)):
            return False
        return sx == sy and tx == ty
    if isinstance(x, (list, tuple)):
        return type(x) is type(y) and len(x) == len(y) and all(_same_layout(p, q) for p, q in zip(x, y))
    if x is None or type(x) in (int, float, bool):
        return type(x) is type(y) and x == y
    return False


def writes_inputs(node: Node) -> bool:
    """True when ``node`` writes into the storage of one of its inputs (:func:`effect`); a
    ``getitem`` never does (:func:`_resolve`: an alias of what it indexes), answered at once."""
    if node.target is operator.getitem and node.op == "call_function":
        return False
    return bool(effect(node).writes)


is_mutating = writes_inputs


def written_inputs(node: Node) -> tuple[Node, ...]:
    """The input nodes whose storage ``node`` writes."""
    return effect(node).writes


def is_view(node: Node) -> bool:
    """True when ``node``'s result may share storage with one of its inputs (a view, or
    the input itself)."""
    return bool(effect(node).aliases) if isinstance(node, Node) else False


def is_pure_view(node: Node) -> bool:
    """True when ``node``'s result, every tensor of it, shares the storage of its first
    input on the example values (or is that input itself): it allocates nothing
    (:mod:`optimus_lens.perf.memory`'s liveness estimate)."""
    if not isinstance(node, Node) or node.op not in ("call_function", "call_method") or not node.all_input_nodes:
        return False
    first = node.all_input_nodes[0]
    if effect(node).identity is first:
        return True
    mine, theirs = storages(meta.value(node)), storages(meta.value(first))
    return bool(mine) and mine <= theirs


def returns_input(node: Node) -> Node | None:
    """The input node that ``node`` returns itself in eager mode (eval-mode ``F.dropout``,
    ``contiguous`` of a contiguous tensor, ``to`` its own dtype), else None; its example
    value may be a fresh FakeTensor all the same (Dynamo's is, for dropout)."""
    if not isinstance(node, Node) or node.op != "call_function" and node.op != "call_method":
        return None  # not a call (a placeholder, get_attr, output): computes nothing, PURE
    if node.op == "call_function" and (node.target is operator.getitem or is_plain(node)):
        return None  # a getitem is a view, never its input; a plain target returns no alias
    return effect(node).identity


def alias_root(node: Node) -> Node:
    """Follow alias edges up from ``node`` (its first aliased input, repeatedly) to the
    node that owns its storage."""
    seen = set()
    while isinstance(node, Node) and node not in seen:
        seen.add(node)
        al = effect(node).aliases
        if not al:
            break
        node = al[0]
    return node


def has_side_effects(node: Node) -> bool:
    """True when ``node`` writes, changes global state or draws random numbers."""
    return effect(node).effectful


_PLAIN: dict[str, dict] = {"call_function": {}, "call_method": {}}  # op -> target -> whether plain


def is_plain(node: Node) -> bool:
    """Whether every call of ``node``'s target is pure and returns no alias, whatever its
    arguments: an ATen overload whose schema has no write, no aliased return and no random
    tag (``aten.mm.default``, in a post-grad graph), or a C builtin or Tensor method whose
    ATen overloads of the same name (:func:`optimus_lens.core.opschema.named_overloads`)
    all have none, so no probe is ever needed (``torch._C._nn.linear``, ``torch.cat``,
    ``Tensor.sum``). A node whose example value shares an input's storage all the same
    (``aten._unsafe_view``) is read from its storages (:func:`effect`).
    The ``.out`` overloads (``Tag.out``) are left out: a call with ``out=`` is never plain.
    Memoised per target; the graph-wide analysis reads most nodes this way."""
    table = _PLAIN.get(node.op)  # none for a placeholder, get_attr or output: no call is made
    if table is None or "out" in node._kwargs:  # the ``.out`` overloads write: read this call from its schema
        return False
    try:
        got = table.get(node.target)
    except TypeError:  # an unhashable target
        return False
    if got is None:
        got = table[node.target] = _plain(node)
    return got


def _plain(node: Node) -> bool:
    t = node.target
    if node.op not in ("call_function", "call_method") or t is operator.getitem or t is getattr:
        return False
    if isinstance(t, torch._ops.OpOverload):  # one schema: the call binds to it
        return not (
            torch.Tag.nondeterministic_seeded in t.tags or any(p.writes or p.returned for p in params(t._schema))
        )
    if isinstance(t, (torch._ops.OpOverloadPacket, torch._ops.HigherOrderOperator)):
        return False
    if isinstance(t, types.FunctionType) or node.op == "call_function" and _module(t) not in PROBE_MODULES:
        return False
    ops = named_overloads(node)
    if not ops:
        return False
    for op in ops:
        if torch.Tag.out in op.tags:  # reached only through ``out=``, which is_plain excludes
            continue
        if torch.Tag.nondeterministic_seeded in op.tags or any(p.writes or p.returned for p in params(op._schema)):
            return False
    return True


# ----------------------------------------------------------------------------- resolution


def _tensor_inputs(node: Node) -> list[Node]:
    return [i for i in node.all_input_nodes if _has_tensor(meta.value(i))]


def _has_tensor(v: Any) -> bool:
    if isinstance(v, torch.Tensor):
        return True
    return isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v)


def _unknown(node: Node, why: str) -> NodeEffect:
    ins = tuple(_tensor_inputs(node)) or tuple(node.all_input_nodes)
    return NodeEffect(writes=ins, aliases=ins, state=True, source=why)


def _resolve(node: Node) -> NodeEffect:
    if node.op not in ("call_function", "call_method"):
        return PURE
    target = node.target
    if node.op == "call_function" and target is operator.getitem:
        src = node.args[0] if node.args and isinstance(node.args[0], Node) else None
        return _view_of(src) if src is not None else _INDEXES_NOTHING
    if node.op == "call_function" and target is getattr:
        src = node.args[0] if node.args and isinstance(node.args[0], Node) else None
        if src is not None and isinstance(meta.value(node), torch.Tensor):
            return NodeEffect(aliases=(src,), source=f"Tensor attribute {node.args[1]!r}: an alias")
        return NodeEffect(source="attribute read")
    if isinstance(target, torch._ops.OpOverload):
        return _with_storage_aliases(node, _schema_effect(node, [target], str(target)))
    if isinstance(target, torch._ops.OpOverloadPacket):
        return _with_storage_aliases(node, _schema_effect(node, overloads(target), str(target)))
    if isinstance(target, torch._ops.HigherOrderOperator):
        return _unknown(node, f"higher-order op {target}: unknown effects")
    if not _tensor_inputs(node) and all(meta.value(i) is not None for i in node.all_input_nodes):
        v = meta.value(node)
        if isinstance(v, NUMBER) and _module(target) in NUMBER_MODULES | PROBE_MODULES:
            return NodeEffect(source="arithmetic on numbers")
        if _module(target) in ARITHMETIC_MODULES and all(
            isinstance(meta.value(i), NUMBER) for i in node.all_input_nodes
        ):
            return NodeEffect(source="arithmetic on numbers")  # its own example value not recorded
        if v is None or not (isinstance(v, torch.Tensor) or _has_tensor(v)):
            if node.op == "call_method":
                return NodeEffect(source="method on a non-tensor")
            return NodeEffect(state=True, source=f"{_name(target)}: no tensor in, no tensor out: global state")
    named = named_overloads(node)
    got = None
    if (not named or isinstance(target, types.FunctionType)) and (
        node.op == "call_method" or _module(target) in PROBE_MODULES
    ):
        got = _from_probe(probe(node))  # a Python function (F.relu(x, inplace=True)), operator.setitem, x.float()
    if got is None and not named:
        return _unknown(node, f"{_name(target)}: not an ATen op, effects unknown")
    eff = _merge(got, _schema_effect(node, named, _name(target)) if named else None)
    return _with_storage_aliases(node, eff)


_INDEXES_NOTHING = NodeEffect(source="getitem: a view of what it indexes")
_VIEW_OF = "_optimus_view_of"  # the node attribute holding the effect of a getitem of it


def _view_of(src: Node) -> NodeEffect:
    """The effect of a getitem of ``src``: an alias of ``src``, nothing else. It names
    ``src`` only, so it is kept on ``src`` and shared (the 128 getitems of an ``unbind``
    hold one answer: a step that creates them builds it once)."""
    got = src.__dict__.get(_VIEW_OF)
    if got is None:
        got = NodeEffect(aliases=(src,), source="getitem: a view of what it indexes")
        object.__setattr__(src, _VIEW_OF, got)  # not Node.__setattr__
    return got


def _module(target: Any) -> str:
    return getattr(target, "__module__", None) or ""


def _name(target: Any) -> str:
    return target if isinstance(target, str) else getattr(target, "__qualname__", None) or str(target)


def _from_probe(p: Any) -> NodeEffect | None:
    if p is None:
        return None
    return NodeEffect(
        p.writes, p.aliases, p.identity, False, p.rng, f"runs {', '.join(dict.fromkeys(p.ops)) or 'no ATen op'}"
    )


def _merge(a: NodeEffect | None, b: NodeEffect | None) -> NodeEffect:
    if a is None:
        return b or PURE
    if b is None:
        return a
    return NodeEffect(
        writes=tuple(dict.fromkeys(a.writes + b.writes)),
        aliases=tuple(dict.fromkeys(a.aliases + b.aliases)),
        identity=a.identity or b.identity,
        state=a.state or b.state,
        rng=a.rng or b.rng,
        source=f"{a.source}; {b.source}",
    )


def _with_storage_aliases(node: Node, eff: NodeEffect) -> NodeEffect:
    """``eff`` plus every input whose example storage the node's example value shares."""
    mine = storages(meta.value(node))
    if not mine:
        return eff
    extra = tuple(i for i in node.all_input_nodes if i not in eff.aliases and storages(meta.value(i)) & mine)
    if not extra:
        return eff
    return NodeEffect(eff.writes, eff.aliases + extra, eff.identity, eff.state, eff.rng, eff.source)


# ----------------------------------------------------------------------------- schemas


def _schema_effect(node: Node, ops: list, what: str) -> NodeEffect:
    """The effects of calling one of the overloads ``ops`` with ``node``'s arguments, read
    from their schemas' alias annotations and tags: the union over the overloads the call
    fits, or over all of them (by position and name) when it fits none."""
    args = tuple(node.args)
    kwargs = dict(node.kwargs)
    bound = [(op, b) for op in ops if (b := bind(op._schema, args, kwargs)) is not None]
    if not bound:
        bound = [(op, loose(op._schema, args, kwargs)) for op in ops]
    writes: dict[Node, None] = {}
    aliases: dict[Node, None] = {}
    rng = False
    for op, b in bound:
        ps = params(op._schema)
        for i, v in b.items():
            p = ps[i]
            if not (p.writes or p.returned):
                continue
            ns = nodes_in(v)
            if p.writes:
                writes.update(dict.fromkeys(ns))
            if p.returned:
                aliases.update(dict.fromkeys(ns))
        rng = rng or torch.Tag.nondeterministic_seeded in op.tags
    return NodeEffect(writes=tuple(writes), aliases=tuple(aliases), rng=rng, source=f"schema of {what}")
