"""Pipeline types: a :class:`Pass` (named, ordered patterns run to a fixed point) and a
:class:`Pipeline` (ordered passes, some switched off). Their own module, so that the
shipped patterns (``optimus_lens.passes``) and the engine both use them without importing
each other."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from torch.fx import GraphModule, Node

from optimus_lens.core.pattern import Pattern, SearchOptions

if TYPE_CHECKING:
    from optimus_lens.core.rewriter import Rewriter


class Profit(Protocol):
    """What an estimate says of fusing one group: whether it is expected to save time
    per call, and that judgement in words (``optimus why`` quotes it)."""

    @property
    def profitable(self) -> bool: ...

    def text(self) -> str: ...


#: ``estimate(gm, fuse, nodes)``: the effect of ``fuse(rw, nodes)`` (a BatchPattern's
#: ``fuse``) on ``gm``, found without changing ``gm``
Estimator = Callable[[GraphModule, Callable[["Rewriter", list[Node]], None], list[Node]], Profit]


@dataclass
class Pass:
    """A named, ordered list of patterns run greedily to a fixed point.

    ``options`` overrides the search options of its BatchPatterns (upstream's per-fusion
    entry in ``pre_grad_fusion_options``). ``estimate`` is what the engine asks before
    fusing a group when a BatchPattern's options set ``profitable_only`` (the catalogue's
    passes carry :func:`optimus_lens.passes.profit.group_estimate`); a pass that needs
    one and has none is refused when the engine starts (ValueError)."""

    name: str
    patterns: list[Pattern]
    options: SearchOptions | None = None
    max_iterations: int = 10
    description: str = ""
    estimate: Estimator | None = None

    def to_json(self, enabled: bool = True) -> dict:
        """The pass as a Trace records it: name, enabled, pattern names, options, description."""
        return {
            "name": self.name,
            "enabled": enabled,
            "patterns": [p.name for p in self.patterns],
            "options": dict(self.options.__dict__) if self.options else {},
            "description": self.description,
        }


@dataclass
class Pipeline:
    """Ordered passes; ``disabled`` names the ones switched off."""

    passes: list[Pass]
    disabled: set[str] = field(default_factory=set)

    def names(self) -> list[str]:
        return [p.name for p in self.passes]

    def enabled(self) -> list[Pass]:
        return [p for p in self.passes if p.name not in self.disabled]

    def only(self, names: list[str]) -> Pipeline:
        """The same passes with all but ``names`` disabled. Raises KeyError on an unknown name."""
        unknown = [n for n in names if n not in self.names()]
        if unknown:
            raise KeyError(f"unknown pass(es) {', '.join(unknown)}; known: {', '.join(self.names())}")
        return Pipeline(self.passes, {p for p in self.names() if p not in names})
