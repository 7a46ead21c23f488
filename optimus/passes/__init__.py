"""The predefined Optimus patterns and the default pipeline.

Importing this package registers every shipped pattern in ``optimus.pattern.REGISTRY``.
"""
from __future__ import annotations

from optimus.engine import Pass, Pipeline
from optimus.pattern import REGISTRY
from optimus.passes import batch, split_cat  # noqa: F401  (registration)

BATCH_PASSES = ["batch_linear", "batch_layernorm", "batch_relu", "batch_tanh", "batch_sigmoid"]
CLEANUP_PATTERNS = ["remove_unbind_stack", "remove_stack_unbind", "remove_split_cat", "remove_cat_split"]


def default_pipeline() -> Pipeline:
    """Upstream's order: every batch fusion (one pass each), then the split/cat cleanup
    that removes the identity stack/unbind and split/cat pairs the fusions leave."""
    passes = [Pass(name, [REGISTRY[name]], description=REGISTRY[name].description) for name in BATCH_PASSES]
    passes.append(Pass("split_cat_cleanup", [REGISTRY[n] for n in CLEANUP_PATTERNS],
                       description="Remove identity stack/unbind and split/cat pairs left by the fusions."))
    return Pipeline(passes)


def pass_catalogue() -> list[dict]:
    """Every registered pattern as plain data: name, kind, description, preconditions,
    upstream counterpart and source location (``optimus passes`` prints this)."""
    return [{"name": p.name, "kind": p.kind, "description": p.description,
             "preconditions": list(p.preconditions), "upstream": p.upstream, "source": p.source}
            for p in REGISTRY.values()]
