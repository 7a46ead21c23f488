"""Kernels per stage: what Inductor generates for a graph, read from its output code.

Horizontal fusion is usually judged by the kernels it saves. :func:`count_kernels`
compiles a graph with ``torch.compile(backend="inductor")`` (caches off, so the code is
generated, not loaded) and reads the module Inductor wrote
(``torch._inductor.utils.run_and_get_code``: one module per compiled graph, forward and
backward in training):

* **generated kernels**: the kernels the module defines (``name = async_compile.cpp_pybinding(...)``
  for CPU C++ kernels, ``async_compile.triton(...)`` on GPU, and Inductor's other
  backends) and how often its ``call`` launches them;
* **extern calls**: calls of library kernels Inductor does not generate: its
  ``extern_kernels.*`` (``mm``, ``addmm``, ``bmm``, convolutions) and ATen fallbacks
  (``torch.ops.aten.*``, ``aten.*``) made inside ``call``, counted per name.

The figures come from the code itself, so they hold for whatever torch generates them.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

_DEFINED = re.compile(r"^(\w+) = async_compile\.(cpp_pybinding|cpp|triton|cuda|halide|mps|rocm)\(", re.M)
_EXTERN = re.compile(r"\bextern_kernels\.(\w+)\(")
_FALLBACK = re.compile(r"\b(?:torch\.ops\.)?(aten|_quantized|quantized|prims)\.(\w+)(?:\.(\w+))?\(")


@dataclass
class KernelCount:
    """Inductor's output for one graph (forward and backward summed in training):
    ``kernels`` the generated kernels' names (in the order the code defines them),
    ``launches`` how many kernel launches ``call`` makes, ``extern`` library calls per name
    (``extern_kernels.addmm``, ``aten.index``), ``modules`` how many output modules were
    read."""

    kernels: list[str] = field(default_factory=list)
    launches: int = 0
    extern: dict[str, int] = field(default_factory=dict)
    modules: int = 0

    @property
    def extern_calls(self) -> int:
        return sum(self.extern.values())

    def text(self) -> str:
        """``7 kernels (3 launches ...), 2 extern: addmm x1, mm x1``, for a table."""
        ext = ", ".join(f"{k} x{v}" for k, v in self.extern.items())
        return f"{len(self.kernels)} kernel(s), {self.launches} launch(es); {self.extern_calls} extern call(s)" + (
            f": {ext}" if ext else ""
        )

    def to_json(self) -> dict:
        return {
            "kernels": len(self.kernels),
            "kernel_names": list(self.kernels),
            "launches": self.launches,
            "extern_calls": self.extern_calls,
            "extern": dict(self.extern),
            "modules": self.modules,
        }


def _call_body(code: str) -> str:
    """The ``call`` function of an output module (where kernels are launched), or the whole
    code when there is none."""
    m = re.search(r"^(\s*)def call\(self, args\):\n|^def call\(args\):\n", code, re.M)
    if not m:
        return code
    rest = code[m.end() :]
    indent = len(m.group(1) or "")
    end = re.search(rf"^ {{0,{indent}}}\S", rest, re.M)
    return rest[: end.start()] if end else rest


def read_output_code(codes: list[str]) -> KernelCount:
    """Count the kernels and extern calls of Inductor output modules (module doc)."""
    out = KernelCount(modules=len(codes))
    extern: Counter = Counter()
    for code in codes:
        names = [m.group(1) for m in _DEFINED.finditer(code)]
        out.kernels += names
        body = _call_body(code)
        for n in names:
            out.launches += len(re.findall(rf"\b{re.escape(n)}(?:\.run)?\(", body))
        extern.update(f"extern_kernels.{m.group(1)}" for m in _EXTERN.finditer(body))
        extern.update(
            f"{m.group(1)}.{m.group(2)}" for m in _FALLBACK.finditer(body) if m.group(2) not in ("empty_strided",)
        )
    out.extern = dict(extern)
    return out


def count_kernels(run: Callable[[], object]) -> KernelCount:
    """Run ``run`` (a call of a ``torch.compile(..., backend="inductor")`` module, e.g.
    :func:`optimus_lens.perf.bench.make_call` of one) once with Inductor's caches off, so
    its code is generated rather than loaded, and count what the generated modules hold
    (:func:`read_output_code`). Dynamo is reset before and after. Raises what compilation
    raises."""
    import torch._dynamo
    import torch._inductor.config as inductor_config
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    try:
        with inductor_config.patch(force_disable_caches=True):
            _, codes = run_and_get_code(run)
    finally:
        torch._dynamo.reset()
    return read_output_code(codes)
