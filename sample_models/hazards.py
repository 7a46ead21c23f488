"""What bit us, as switchable classes of the random models (:mod:`.random_models`).

Each hazard is a small change to a random model's ``forward`` that a rewrite gets wrong
when it reads effects, aliases, regions, dtypes or offsets by name or by guess (issue
21's classes). A spec lists the hazards it draws (``RandomSpec.hazards``); ``at`` is the
branch where a write or a region starts, so branches before it and from it on are two
sides of the hazard, and a batch fusion of all branches straddles it.

* ``custom_op_write``: a custom op declared with ``torch.library.custom_op(...,
  mutates_args=("x",))`` (``optimus_fuzz::scale``: no trailing underscore says it writes) scales
  the piece of the input branch ``at`` reads, just before it reads it;
* ``aten_inplace``: the same write through an ATen in-place overload called directly
  (``torch.ops.aten.mul_.Scalar``);
* ``attr_alias``: the write through an attribute alias of the piece (``piece.T`` or
  ``piece.mT``: ``getattr`` nodes);
* ``identity_alias``: the write through a function that returns its input
  (``torch.atleast_2d`` of the 2-D piece);
* ``overlapping_inputs``: a second input, an overlapping view of the buffer ``x`` is a
  view of, written in place before branch ``at``;
* ``grad_region``: branches from ``at`` on run under ``torch.no_grad()``;
* ``autocast_region``: branches from ``at`` on run under ``torch.autocast("cpu",
  dtype=torch.bfloat16)`` (float32 models);
* ``mixed_dtype``: branch ``at``'s output is cast to another dtype (float32 -> float64,
  half types -> float32), so the join promotes;
* ``zero_dim``: every branch output is multiplied by a 0-dim float32 buffer (which does
  not promote a bf16 tensor; stacked into a 1-D tensor it would);
* ``output_is_input``: ``cat(split(x))`` is an extra output (a fresh tensor in eager;
  the identity rule would return ``x`` itself);
* ``as_strided_offset``: an extra output reads the last branch's output through
  ``as_strided`` with an explicit storage offset (absolute: it depends on where the
  value starts in its storage, which a batch fusion changes for all but the first member).

Writes into the input are writes into a leaf: gradients are not checked for a spec with
one (:func:`writes_input`).
"""

from __future__ import annotations

import contextlib
import functools

import torch

HAZARDS = (
    "custom_op_write",
    "aten_inplace",
    "attr_alias",
    "identity_alias",
    "overlapping_inputs",
    "grad_region",
    "autocast_region",
    "mixed_dtype",
    "zero_dim",
    "output_is_input",
    "as_strided_offset",
)
#: hazards that write into the model's input
WRITES = ("custom_op_write", "aten_inplace", "attr_alias", "identity_alias", "overlapping_inputs")
#: how far the extra input of ``overlapping_inputs`` is shifted along dim 1 (elements)
SHIFT = 2


@functools.cache
def fuzz_ops():
    """``torch.ops.optimus_fuzz``, with ``scale(x, s)``: ``x *= s`` in place, declared by
    ``mutates_args`` (registered on first use)."""

    @torch.library.custom_op("optimus_fuzz::scale", mutates_args=("x",))
    def scale(x: torch.Tensor, s: float) -> None:
        x.mul_(s)

    @scale.register_fake
    def _(x, s):
        return None

    return torch.ops.optimus_fuzz


def writes_input(hazards) -> bool:
    """True when one of ``hazards`` writes into the model's input."""
    return any(h in WRITES for h in hazards)


def write(kind: str, piece: torch.Tensor, flavour: int) -> None:
    """Scale ``piece`` by 2 in place the way hazard ``kind`` does (``flavour`` picks the
    attribute alias: 0 ``.T``, 1 ``.mT``)."""
    if kind == "custom_op_write":
        torch.ops.optimus_fuzz.scale(piece, 2.0)  # registered by build() (fuzz_ops), outside the traced code
    elif kind == "aten_inplace":
        torch.ops.aten.mul_.Scalar(piece, 2.0)
    elif kind == "attr_alias":
        (piece.mT if flavour % 2 else piece.T).mul_(2.0)
    elif kind == "identity_alias":
        torch.atleast_2d(piece).mul_(2.0)
    else:
        raise ValueError(f"{kind!r} is not a write hazard")


def region(hazards, i: int, at: int):
    """The context branch ``i`` runs in: ``torch.no_grad()`` or ``torch.autocast`` from
    branch ``at`` on when ``hazards`` has the region, else nothing."""
    if i < at:
        return contextlib.nullcontext()
    if "grad_region" in hazards:
        return torch.no_grad()
    if "autocast_region" in hazards:
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def other_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype ``mixed_dtype`` casts one branch to: float64 for float32, else float32."""
    return torch.float64 if dtype == torch.float32 else torch.float32


def strided_offset(t: torch.Tensor) -> torch.Tensor:
    """``as_strided`` over ``t``'s elements from storage offset 1 (absolute), times 1.0
    (a fresh output); ``t`` is fresh and contiguous in eager, so this reads elements
    1..numel-1 of it."""
    n = t.numel() - 1
    return torch.as_strided(t, (n,), (1,), 1) * 1.0
