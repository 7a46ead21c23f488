"""Where a custom operator comes from: the module that registers it, so that a graph rebuilt
from a trace can import it and resolve ``torch.ops.ns.name`` again
(:attr:`optimus_lens.core.trace.NodeRecord.target_module`)."""

from __future__ import annotations

import functools
import os
import re
import sys
from typing import Any

import torch


def op_module(target: Any) -> str | None:
    """The module that registers a custom operator ``target`` (an ``OpOverload`` or
    ``OpOverloadPacket`` outside torch's own namespaces): the module of the function
    ``torch.library.custom_op`` decorated, else the module whose file the dispatcher
    names as the op's registration (``torch.library.Library.define``); ``"__main__"`` for
    a script; None for torch's own ops, other targets, or an op whose registration no
    loaded module holds. A rebuild imports it to resolve ``torch.ops.ns.name``."""
    if not isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return None
    return _op_module(target)


@functools.lru_cache(maxsize=1024)
def _op_module(target: Any) -> str | None:
    qualname = target._qualified_op_name if isinstance(target, torch._ops.OpOverloadPacket) else target._schema.name
    ns = qualname.split("::")[0]
    if ns in ("aten", "prim", "prims", "quantized", "profiler", "inductor", "_c10d_functional", "c10d", "higher_order"):
        return None
    from torch._library.custom_ops import OPDEFS

    opdef = OPDEFS.get(qualname)
    if opdef is not None:
        return getattr(opdef._init_fn, "__module__", None)
    try:
        dump = torch._C._dispatch_dump(qualname)
    except RuntimeError:
        return None
    m = re.search(r"registered at (.+?):\d+", dump)
    if not m:
        return None
    file = os.path.realpath(m.group(1))
    if file.startswith(os.path.realpath(os.path.dirname(torch.__file__)) + os.sep):
        return None  # registered by torch itself (its own ops, or a library helper)
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None)
        if f and os.path.realpath(f) == file:
            return name
    return None
