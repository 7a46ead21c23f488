"""Reading FX argument structures (a node's ``args`` and ``kwargs``): the nodes they name, the
symbolic sizes they hold, and a target's name for messages."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.fx import Node
from torch.fx.node import map_arg


def target_text(target: Any) -> str:
    """A call target as a message names it: a method's name, a function's ``__name__``."""
    return target if isinstance(target, str) else getattr(target, "__name__", str(target))


_SYM = (torch.SymInt, torch.SymFloat, torch.SymBool)


def scan(x: Any, nodes: list[Node]) -> Any:
    """Collect the Nodes in an argument structure into ``nodes``; return its first SymInt /
    SymFloat / SymBool, or None (one walk, cheaper than pytree for long node lists)."""
    if isinstance(x, Node):
        nodes.append(x)
        return None
    if isinstance(x, (tuple, list, dict)):
        found = None
        for v in x.values() if isinstance(x, dict) else x:
            r = scan(v, nodes)
            found = found if found is not None else r
        return found
    if isinstance(x, slice):
        return scan((x.start, x.stop, x.step), nodes)
    return x if isinstance(x, _SYM) else None


def nodes_in(x: Any) -> list[Node]:
    """The Nodes in an argument structure, in order, each as often as it appears."""
    out: list[Node] = []
    map_arg(x, out.append)
    return out


def swap_in(swap: dict[Node, Node]) -> Callable[[Node], Node]:
    """For ``map_arg``: a node's replacement in ``swap``, or the node itself."""
    get = swap.get
    return lambda n: get(n, n)
