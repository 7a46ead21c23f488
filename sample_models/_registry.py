"""The sample-model registry: :class:`SampleModel`, :data:`REGISTRY`, :func:`register`,
:func:`names` and :func:`get`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["SampleModel", "REGISTRY", "KINDS", "register", "names", "get", "get_entry"]

KINDS = ("demo", "teaching", "realistic")

BuildFn = Callable[[], "tuple[torch.nn.Module, tuple[torch.Tensor, ...]]"]


@dataclass(frozen=True)
class SampleModel:
    """One registry entry.

    ``build()`` returns ``(model, example_inputs)``: a fresh model in eval mode
    (float32, CPU) and a tuple of example input tensors; calling
    ``model(*example_inputs)`` runs one forward pass.
    """

    name: str  # registry key
    description: str  # one line: what it shows
    teaches: tuple[str, ...]  # patterns it is meant to exercise, e.g. ("batch_linear",)
    build: BuildFn  # returns (model in eval mode, example inputs)
    kind: str  # "demo" | "teaching" | "realistic"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if not isinstance(self.teaches, tuple):
            object.__setattr__(self, "teaches", tuple(self.teaches))


#: name -> SampleModel, in registration order (the first entry is the default model).
REGISTRY: dict[str, SampleModel] = {}


def register(
    entry: SampleModel | BuildFn | None = None,
    *,
    name: str | None = None,
    description: str = "",
    teaches: tuple[str, ...] = (),
    kind: str = "demo",
):
    """Add a model to :data:`REGISTRY`.

    Three ways to call it::

        register(SampleModel(name=..., description=..., teaches=..., build=fn, kind=...))

        @register(name="my_model", description="...", teaches=("batch_linear",), kind="teaching")
        def build_my_model(): ...

        register(build_fn, name="my_model", description="...")

    When ``name`` is omitted for a build function, the function name is used
    (a leading ``build_`` is stripped). A duplicate name raises ``ValueError``.
    The decorator form returns the build function unchanged.
    """

    def _add(sm: SampleModel) -> SampleModel:
        if sm.name in REGISTRY:
            raise ValueError(f"sample model {sm.name!r} is already registered")
        REGISTRY[sm.name] = sm
        return sm

    if isinstance(entry, SampleModel):
        return _add(entry)

    def _from_fn(fn: BuildFn) -> BuildFn:
        key = name
        if key is None:
            key = fn.__name__
            if key.startswith("build_"):
                key = key[len("build_") :]
        desc = description
        if not desc and fn.__doc__:
            desc = fn.__doc__.strip().splitlines()[0]
        _add(SampleModel(name=key, description=desc, teaches=tuple(teaches), build=fn, kind=kind))
        return fn

    if entry is None:
        return _from_fn  # decorator with arguments
    if callable(entry):
        return _from_fn(entry)
    raise TypeError(f"register() expects a SampleModel or a build function, got {entry!r}")


def names() -> list[str]:
    """All registered model names, in registry order."""
    return list(REGISTRY)


def get_entry(name: str) -> SampleModel:
    """The :class:`SampleModel` registered as ``name`` (``KeyError`` listing valid names if unknown)."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown sample model {name!r}; valid names: {', '.join(REGISTRY)}") from None


def get(name: str) -> tuple[torch.nn.Module, tuple]:
    """Build a fresh ``(model, example_inputs)`` for ``name``.

    Raises ``KeyError`` (listing the valid names) if ``name`` is unknown, and
    ``ImportError`` for a realistic model whose optional dependency is missing.
    """
    model, inputs = get_entry(name).build()
    model.eval()
    return model, tuple(inputs)
