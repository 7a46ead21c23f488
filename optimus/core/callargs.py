"""A call node's arguments by parameter name, as the match language
(:mod:`optimus_lens.core.lang`) reads them: ``cat([a, b], 1)`` and ``cat([a, b], dim=1)``
both give ``{"tensors": [a, b], "dim": 1}``, bound to the op's signature with its defaults
filled in (an ATen overload's by its schema)."""

from __future__ import annotations

import inspect
import types
from typing import Any

import torch
from torch.fx import Node

from optimus_lens.core.miss import Miss


def _signatures(node: Node) -> list[inspect.Signature]:
    """Candidate Python signatures for the node's target: an ATen/prims op overload's own
    schema (``aten.addmm.default`` -> ``(input, mat1, mat2, *, beta=1, alpha=1)``; its
    ``__call__`` is only ``*args, **kwargs``), ``inspect.signature`` of a Python function,
    else the TorchScript schemas of a torch builtin (a method name is looked up as the
    ``torch`` function of that name, whose first parameter is the tensor)."""
    target: Any = node.target
    if node.op == "call_method":
        target = getattr(torch, str(target), None)
        if target is None:
            return []
    if type(target) is types.BuiltinFunctionType or type(target) is torch._ops.OpOverload:
        got = _FIXED_SIGNATURES.get(target)
        if got is None:
            got = _FIXED_SIGNATURES[target] = _read_signatures(target)
        return got
    return _read_signatures(target)


#: the signatures of C builtins (``torch.cat``: its text signature, else the ATen schemas
#: registered for it when torch loads) and of ATen overloads (one schema each), which never
#: change: read once per target (``inspect`` and the schema look-up cost ~7 us a node)
_FIXED_SIGNATURES: dict[Any, list[inspect.Signature]] = {}


def _read_signatures(target: Any) -> list[inspect.Signature]:
    """:func:`_signatures` of a resolved target, read afresh."""
    from torch.fx.operator_schemas import get_signature_for_torch_op

    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return get_signature_for_torch_op(target) or []
    try:
        return [inspect.signature(target)]
    except (TypeError, ValueError):
        pass
    try:
        return get_signature_for_torch_op(target) or []
    except Exception:  # noqa: BLE001 - an op torch has no schema for: fall back to positions
        return []


def bind(node: Node) -> dict | Miss:
    """The node's arguments by parameter name, defaults filled in, in signature order:
    ``cat([a, b], 1)`` -> ``{"tensors": [a, b], "dim": 1}``. The first signature the
    arguments bind to wins (schemas of one op share parameter names). A node whose op
    has no known signature gets positional names ``arg0, arg1, ...`` plus its keywords.
    Returns a Miss when the arguments fit no signature."""
    sigs = _signatures(node)
    for sig in sigs:
        try:
            ba = sig.bind(*node.args, **node.kwargs)
        except TypeError:
            continue
        ba.apply_defaults()
        return dict(ba.arguments)
    if sigs:
        return Miss(f"arguments of {node.name} fit no signature of {node.target}")
    out = {f"arg{i}": a for i, a in enumerate(node.args)}
    out.update(node.kwargs)
    return out
