"""The post-grad Optimus catalogue: patterns on the ATen graphs (forward, backward) that
Inductor's ``post_grad_passes(gm, is_inference)`` rewrites (upstream:
torch/_inductor/fx_passes/post_grad.py runs ``group_batch_fusion_passes(graph,
pre_grad=False)`` with ``POST_GRAD_FUSIONS``, then each ``post_grad_fusion_options`` key of
``POST_GRAD_PATTERNS``).

Importing this package registers the patterns (``stage = "post-grad"``):
:mod:`.batch` (``batch_linear_post_grad``, ``batch_aten_tanh/sigmoid/relu``,
``batch_aten_add/sub/mul/div``), :mod:`.split_cat` (``normalization_aten_pass``,
``unbind_stack_aten_pass``, ``split_cat_aten_pass``, ``select_cat_aten_pass``,
``move_view_after_cat_aten_pass``) and :mod:`.decompose` (``decompose_mm_pass``,
``group_linear``). :func:`post_grad_pipeline` is our default, :func:`upstream_post_grad_pipeline`
the pipeline of an upstream ``post_grad_fusion_options`` dict.
"""

from __future__ import annotations

# ruff: noqa: I001 - the imports register the patterns, in this order
from optimus_lens.core.pattern import REGISTRY
from optimus_lens.core.pipeline import Pass, Pipeline
from optimus_lens.passes.post_grad import batch, split_cat, decompose  # noqa: F401  (registration)
from optimus_lens.passes.post_grad.batch import POST_GRAD_BATCH

#: upstream post-grad pattern pass -> our patterns
POST_GRAD_PATTERN_PASSES = {
    "normalization_aten_pass": ["normalize_split_aten", "normalize_split_with_sizes_aten", "normalize_cat_aten"],
    "unbind_stack_aten_pass": ["merge_unbind_stack_aten"],
    "split_cat_aten_pass": ["merge_split_cat_aten"],
    "select_cat_aten_pass": ["merge_select_cat_aten"],
    "move_view_after_cat_aten_pass": ["move_view_after_cat"],
    "decompose_mm_pass": ["decompose_mm", "decompose_addmm", "decompose_bmm"],
}
#: upstream post-grad names that are not patterns on the graph: they tune pad_mm (GPU), so
#: they change nothing here (they are accepted, and run as passes with no patterns)
NOT_PATTERNS = {
    "shape_padding_multiplier": "Not a graph pattern: upstream multiplies pad_mm's benchmark margin by it (GPU pad_mm only).",
    "pad_aten_mm_pass": "Not a graph pattern: upstream forces pad_mm's bf16 padding for a large K (GPU only).",
}
#: upstream's fusion that needs fbgemm (CUDA): in the catalogue, refused with the reason where it cannot run
FBGEMM_FUSIONS = ["group_linear"]
#: the pattern passes of our default post-grad pipeline, in upstream's run order after the
#: fusions. ``decompose_mm_pass`` is in the catalogue but not the default: it trades one GEMM
#: for a broadcast product that only pays once Inductor fuses it into a reduction (run eagerly,
#: the (M, K, N) product is materialised), so it is a choice for a compiled graph
#: (``--passes``, or ``upstream_post_grad_pipeline`` of options that name it)
DEFAULT_PATTERN_PASSES = [
    "normalization_aten_pass",
    "unbind_stack_aten_pass",
    "split_cat_aten_pass",
    "select_cat_aten_pass",
    "move_view_after_cat_aten_pass",
]
#: in the catalogue, switched off in the default pipeline (see ``DEFAULT_PATTERN_PASSES``)
OFF_BY_DEFAULT = ["decompose_mm_pass"]


def known_post_grad_names() -> list[str]:
    """Every name our post-grad pipelines accept: the fusions (upstream's
    ``POST_GRAD_FUSIONS`` names), then the pattern passes and the pad_mm knobs
    (``POST_GRAD_PATTERNS``)."""
    return [*POST_GRAD_BATCH, *FBGEMM_FUSIONS, *POST_GRAD_PATTERN_PASSES, *NOT_PATTERNS]


def post_grad_pattern_pass(name: str, options: dict | None = None) -> Pass:
    """Upstream's post-grad pattern pass ``name`` as our pass, with its options
    (``threshold_to_cat`` for ``split_cat_aten_pass``; the thresholds of
    ``decompose_mm_pass``). Raises KeyError for an unknown name."""
    options = dict(options or {})
    patterns = [REGISTRY[n] for n in POST_GRAD_PATTERN_PASSES[name]]
    description = " ".join(p.description for p in patterns)
    if name == "split_cat_aten_pass" and "threshold_to_cat" in options:
        patterns = [p.configured(options["threshold_to_cat"]) for p in patterns]  # type: ignore[attr-defined]
        description += f" (threshold_to_cat={options['threshold_to_cat']})"
    if name == "decompose_mm_pass":
        patterns = [p.configured(options) for p in patterns]  # type: ignore[attr-defined]
    return Pass(name, patterns, description=description)


def _batch_pass(name: str, options: dict | None = None, upstream_search: bool = False) -> Pass:
    p = REGISTRY[name]
    opts = {k: v for k, v in (options or {}).items()}
    if upstream_search:
        opts = {"search": "upstream", **opts}
    return Pass(name, [p], options=p.options.replace(**opts) if opts else None, description=p.description)  # type: ignore[attr-defined]


def post_grad_pipeline() -> Pipeline:
    """Our default post-grad pipeline, in upstream's order: every batch fusion (one pass
    each, ``group_linear`` among them: refused with its reason where fbgemm or CUDA is
    missing), then the pattern passes of ``DEFAULT_PATTERN_PASSES``: the normalization, the
    cleanup of the stacks of selects the fusions leave (``unbind_stack_aten_pass``) and the
    split/cat passes; ``decompose_mm_pass`` (upstream's CPU and GPU thresholds) is in the
    pipeline switched off (``OFF_BY_DEFAULT``; ``--passes`` turns it on)."""
    passes = [_batch_pass(n) for n in [POST_GRAD_BATCH[0], *FBGEMM_FUSIONS, *POST_GRAD_BATCH[1:]]]
    passes += [post_grad_pattern_pass(n) for n in [*DEFAULT_PATTERN_PASSES, *OFF_BY_DEFAULT]]
    return Pipeline(passes, disabled=set(OFF_BY_DEFAULT))


def upstream_post_grad_pipeline(options: dict) -> Pipeline:
    """A pipeline from an upstream ``torch._inductor.config.post_grad_fusion_options``
    dict, in upstream's order (post_grad.py): the fusions named in the dict (dict order),
    then the pattern passes (dict order).

    Fusions use upstream's bounded search unless an entry says ``"search": "global"``;
    ``min_fuse_set_size`` / ``max_fuse_set_size`` / ``max_fuse_search_depth`` override
    its search options. Upstream's other fusion options (``fuse_nodes_with_same_users``,
    ``fuse_nodes_with_same_parent``, ``shape_broadcast_batch_linear``, ``require_fbgemm``)
    are accepted and not used: they narrow upstream's keys or change how it adds a bias,
    and ours fuse every independent group of one key (docs/parity.md). Raises KeyError for
    a name upstream does not know (upstream fails the compile with a KeyError too)."""
    fusions, patterns = [], []
    for name, opts in dict(options).items():
        opts = dict(opts or {})
        if name in POST_GRAD_BATCH or name in FBGEMM_FUSIONS:
            fusions.append(_batch_pass(name, _search_options(opts), upstream_search=True))
        elif name in POST_GRAD_PATTERN_PASSES:
            patterns.append(post_grad_pattern_pass(name, opts))
        elif name in NOT_PATTERNS:
            patterns.append(Pass(name, [], description=NOT_PATTERNS[name]))
        else:
            raise KeyError(f"unknown post-grad fusion option {name!r}; known: {', '.join(known_post_grad_names())}")
    return Pipeline(fusions + patterns)


def _search_options(opts: dict) -> dict:
    keep = ("min_fuse_set_size", "max_fuse_set_size", "max_fuse_search_depth", "search")
    return {k: v for k, v in opts.items() if k in keep}
