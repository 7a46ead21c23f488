"""Storages of real tensors: pristine copies that keep aliasing, and which tensors overlap.

Memory layout is semantics: two graph inputs that are views of one buffer are not two
independent tensors (a write through one is read through the other), and a graph output
that is its input, or another output, behaves differently from a fresh tensor when the
caller writes into it. Verification (:mod:`optimus_lens.core.verify`), the capture
(:mod:`optimus_lens.frontend.capture`) and ``optimus_lens.compile``'s first-call check
therefore copy inputs *storage by storage* (:func:`clone_preserving_aliases`: each
distinct storage cloned once, every tensor rebuilt as a view of its clone with its size,
stride and storage offset) and compare *which* outputs overlap inputs or each other
(:func:`overlap_signature`), byte ranges per storage as PyTorch's own
``torch._functorch._aot_autograd`` alias analysis reads them.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten


def plain_storage(t: Any) -> bool:
    """A dense strided tensor (or Parameter) with real storage, whose bits a view fully
    describes (no conjugate/negative bit, no subclass, not fake or meta)."""
    if type(t) not in (torch.Tensor, torch.nn.Parameter):
        return False
    if t.layout != torch.strided or t.is_quantized or t.is_conj() or t.is_neg() or t.device.type == "meta":
        return False
    try:
        t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # no storage (a functional or wrapper tensor)
        return False
    return True


def storage_key(t: torch.Tensor) -> tuple:
    """What identifies ``t``'s storage among live tensors: (device, data pointer), or the
    storage object's identity for an empty storage (data pointer 0)."""
    s = t.untyped_storage()
    ptr = s.data_ptr()
    return (str(t.device), ptr) if ptr else (str(t.device), "empty", id(s))


def clone_preserving_aliases(values: Any) -> Any:
    """A copy of ``values`` (a tuple, list or dict of tensors and other objects, nested)
    whose tensors share memory exactly as the originals do among themselves, and none
    with the originals: each distinct storage is cloned once and every tensor rebuilt on
    its clone with the original's size, stride, storage offset and dtype
    (``Tensor.set_``). ``requires_grad`` and the ``nn.Parameter`` type are kept (a copy
    is a leaf). Tensors whose storage cannot be read as bytes (subclasses, sparse,
    quantized, conjugate views, FakeTensors) are cloned on their own; other objects are
    deep-copied when they can be, kept as they are when not (a SymInt, a function).

    Cost: one copy of every distinct storage the values reach (bytes = the storages'
    sizes, not only the elements the tensors view)."""
    leaves, spec = tree_flatten(values)
    clones: dict[tuple, torch.UntypedStorage] = {}
    out = []
    for v in leaves:
        if isinstance(v, torch.Tensor):
            out.append(_clone_tensor(v, clones))
        else:
            try:
                out.append(copy.deepcopy(v))
            except Exception:  # noqa: BLE001 - an uncopyable object is shared, as the caller passed it
                out.append(v)
    return tree_unflatten(out, spec)


def _clone_tensor(t: torch.Tensor, clones: dict) -> torch.Tensor:
    with torch.no_grad():
        if not plain_storage(t):
            c = t.detach().clone()
        else:
            key = storage_key(t)
            if key not in clones:
                clones[key] = t.untyped_storage().clone()
            c = torch.empty(0, dtype=t.dtype, device=t.device).set_(
                clones[key], t.storage_offset(), t.size(), t.stride()
            )
    if isinstance(t, torch.nn.Parameter):
        return torch.nn.Parameter(c, requires_grad=t.requires_grad)
    return c.requires_grad_(t.requires_grad) if t.requires_grad and (c.is_floating_point() or c.is_complex()) else c


def span(t: torch.Tensor) -> tuple[tuple, int, int]:
    """(storage key, first byte, one past the last byte) that ``t`` can address; an
    empty tensor addresses nothing (first == last). Negative strides count towards the
    first byte."""
    key = storage_key(t)
    if t.numel() == 0:
        return key, 0, 0
    lo = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if s < 0)
    hi = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if s > 0) + 1
    return key, lo * t.element_size(), hi * t.element_size()


def overlaps(a: Any, b: Any) -> bool:
    """True when tensors ``a`` and ``b`` can address a common byte of one storage (their
    byte ranges intersect: two interleaved strided views count as overlapping, which is
    conservative). False for anything that is not a plain tensor with storage."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and plain_storage(a) and plain_storage(b)):
        return False
    (ka, la, ha), (kb, lb, hb) = span(a), span(b)
    return ka == kb and la < hb and lb < ha


def overlap_signature(outputs: list, inputs: Any) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """For each output (flat list, in order): the indices of the inputs (flattened) whose
    memory it overlaps, and of the other outputs whose memory it overlaps. Equal
    signatures mean a caller's in-place write into any output is seen in the same places."""
    ins = [x for x in tree_flatten(inputs)[0] if isinstance(x, torch.Tensor)]
    return [
        (
            tuple(j for j, t in enumerate(ins) if overlaps(o, t)),
            tuple(j for j, t in enumerate(outputs) if j != i and overlaps(o, t)),
        )
        for i, o in enumerate(outputs)
    ]


def overlap_difference(expected: list, actual: list) -> str:
    """The first difference between two :func:`overlap_signature` results as a sentence
    (``output 0 now overlaps input 0``, ``output 1 no longer overlaps output 0``), or
    "" when they are equal."""
    for i, ((ei, eo), (ai, ao)) in enumerate(zip(expected, actual)):
        for what, e, a in (("input", ei, ai), ("output", eo, ao)):
            new, gone = [j for j in a if j not in e], [j for j in e if j not in a]
            if new:
                return f"output {i} now overlaps {what} {new[0]} (it did not in the original: a write into one changes the other)"
            if gone:
                return f"output {i} no longer overlaps {what} {gone[0]} (it did in the original)"
    if len(expected) != len(actual):
        return f"{len(actual)} outputs instead of {len(expected)}"
    return ""
