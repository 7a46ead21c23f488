"""The predefined Optimus patterns and the default pipelines: :func:`default_pipeline` (the
pre-grad passes, on the Dynamo graph) and :func:`post_grad_pipeline` (the post-grad passes, on
the ATen forward and backward graphs; :mod:`optimus_lens.passes.post_grad`).

Importing this package registers every shipped pattern in ``optimus_lens.core.pattern.REGISTRY``,
so this is the one module that knows every pattern: look one up with :func:`pattern_named`,
all of them with :func:`all_patterns`.
"""

from __future__ import annotations

# ruff: noqa: I001 - the imports register the patterns, in this order (REGISTRY's order)
from optimus_lens.core.pipeline import Pass, Pipeline
from optimus_lens.core.pattern import REGISTRY, Pattern
from optimus_lens.passes import batch, split_cat  # noqa: F401  (registration)
from optimus_lens.passes import normalize, einsum  # noqa: F401  (registration)
from optimus_lens.passes import contract  # noqa: F401  (registration)
from optimus_lens.passes import post_grad  # noqa: F401  (registration: the ATen patterns, stage "post-grad")
from optimus_lens.passes.post_grad import post_grad_pipeline, upstream_post_grad_pipeline  # noqa: F401  (re-exported)
from optimus_lens.passes.batch_extra import EXTRA_BATCH_PASSES
from optimus_lens.passes.profit import group_estimate


def pattern_named(name: str) -> Pattern:
    """The registered pattern ``name`` (a shipped one, or one a loaded pattern file
    registered); KeyError listing the known names otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown pattern {name!r}; known: {', '.join(sorted(REGISTRY))}") from None


def all_patterns(stage: str | None = None) -> list[Pattern]:
    """Every registered pattern, in registration order (the shipped ones first); with
    ``stage`` ("pre-grad" or "post-grad") only the patterns written for that graph."""
    return [p for p in REGISTRY.values() if stage is None or p.stage == stage]


# the shipped batch fusions in pipeline order: each registration's ``pipeline_order`` (upstream's
# order, the registration order of torch/_inductor/fx_passes/group_batch_fusion.py)
BATCH_PASSES = [
    p.name
    for p in sorted(
        (p for p in REGISTRY.values() if p.kind == "batch" and p.pipeline_order is not None),
        key=lambda p: p.pipeline_order,
    )
]
CLEANUP_PATTERNS = ["remove_unbind_stack", "remove_stack_unbind", "remove_split_cat", "remove_cat_split"]
# upstream pre-grad pattern pass name -> our patterns (torch/_inductor/fx_passes/split_cat.py)
PATTERN_PASSES = {
    "normalization_pass": ["normalize_split", "normalize_unbind", "normalize_cat", "normalize_stack"],
    "remove_split_with_size_one_pass": ["remove_split_with_size_one"],
    "merge_splits_pass": ["merge_splits"],
    "split_cat_pass": ["merge_split_squeeze", "simplify_split_cat"],
    "merge_getitem_cat_pass": ["merge_getitem_cat"],
    "mutate_cat_pass": ["mutate_cat"],
    "unbind_stack_pass": ["merge_unbind_stack"],
    "split_cat_to_slices_pass": ["split_cat_to_slices"],
    "unbind_cat_to_view_pass": ["unbind_cat_to_view"],
    "split_stack_to_cats_pass": ["split_stack_to_cats"],
    "unbind_stack_to_slices_pass": ["unbind_stack_to_slices"],
    "move_reshape_out_of_split_stack_pass": ["move_reshape_out_of_split_stack"],
    "einsum_to_pointwise_pass": ["einsum_to_pointwise"],
}
# upstream pre-grad pass names upstream accepts but registers no pre-grad pattern in (its
# merge_stack_tahn_unbind patterns exist only in the aten pass, pre_grad.py's *_pass_aten)
EMPTY_UPSTREAM_PASSES = {
    "merge_stack_tahn_unbind_pass": "Upstream accepts this name but registers no pre-grad "
    "pattern in it (only the ATen-level merge_stack_tahn_unbind_pass_aten has patterns): "
    "it changes nothing."
}
# split/cat passes the default pipeline runs after the fusions and the identity cleanup
DEFAULT_SPLIT_CAT_PASSES = [
    "remove_split_with_size_one_pass",
    "merge_splits_pass",
    "split_cat_pass",
    "unbind_cat_to_view_pass",
    "split_stack_to_cats_pass",
    "unbind_stack_to_slices_pass",
    "move_reshape_out_of_split_stack_pass",
]
# rewrites beyond upstream's catalogue the default pipeline runs last, once the fusions
# have stacked what they batch (``docs/parity.md``)
EXTRA_REWRITE_PASSES = ["mul_sum_to_matmul"]


def default_pipeline(search: str | None = None, profitable_only: bool = False) -> Pipeline:
    """Upstream's order: ``normalization_pass``, every batch fusion (one pass each; ours
    beyond upstream's catalogue, ``EXTRA_BATCH_PASSES``, last of them), then
    the split/cat cleanup that removes the identity stack/unbind and split/cat pairs the
    fusions leave, then the split/cat passes of ``DEFAULT_SPLIT_CAT_PASSES``, then ours
    beyond upstream's catalogue, ``EXTRA_REWRITE_PASSES`` (``mul_sum_to_matmul``).

    ``search`` ("global" or "upstream", see :class:`optimus_lens.core.pattern.SearchOptions`)
    overrides every batch fusion's search mode; None keeps each pattern's own (global).
    ``profitable_only`` skips groups whose estimated effect is a slowdown
    (:func:`optimus_lens.passes.profit.group_estimate`, every batch pass's ``estimate``) in every batch fusion; the fusions beyond upstream's
    catalogue that fuse groups of two (``batch_softmax``, ``batch_mul``, ``batch_sum``)
    always do. Raises ValueError for another mode."""
    passes = [pattern_pass("normalization_pass")]
    passes += [
        Pass(
            name,
            [REGISTRY[name]],
            description=REGISTRY[name].description,
            estimate=group_estimate,
            options=None
            if search is None and not profitable_only
            else REGISTRY[name].options.replace(
                **({} if search is None else {"search": search}),
                profitable_only=profitable_only or REGISTRY[name].options.profitable_only,
            ),
        )
        for name in BATCH_PASSES + EXTRA_BATCH_PASSES
    ]
    passes.append(
        Pass(
            "split_cat_cleanup",
            [REGISTRY[n] for n in CLEANUP_PATTERNS],
            description="Remove identity stack/unbind and split/cat pairs left by the fusions.",
        )
    )
    passes += [pattern_pass(name) for name in DEFAULT_SPLIT_CAT_PASSES]
    passes += [Pass(n, [REGISTRY[n]], description=REGISTRY[n].description) for n in EXTRA_REWRITE_PASSES]
    return Pipeline(passes)


def pattern_pass(name: str, threshold_to_cat: int | None = None) -> Pass:
    """The pattern pass upstream calls ``name`` (a key of ``PATTERN_PASSES``), with
    ``threshold_to_cat`` (default 10) for the *_to_slices / _to_view / _to_cats passes.
    Raises KeyError for an unknown name."""
    patterns = [REGISTRY[n] for n in PATTERN_PASSES[name]]
    description = " ".join(p.description for p in patterns)
    if threshold_to_cat is not None and any(hasattr(p, "configured") for p in patterns):
        patterns = [p.configured(threshold_to_cat) if hasattr(p, "configured") else p for p in patterns]
        description += f" (threshold_to_cat={threshold_to_cat})"
    return Pass(name, patterns, description=description)


def upstream_pipeline(options: dict) -> Pipeline:
    """A pipeline from an upstream-style ``torch._inductor.config.pre_grad_fusion_options``
    dict, in upstream's order (torch/_inductor/fx_passes/pre_grad.py): ``normalization_pass``
    first if present, then the batch fusions named in the dict (dict order), then the
    pattern passes (dict order).

    Batch fusions use upstream's bounded search (``search="upstream"``) unless an entry
    says ``"search": "global"``. Per-name options: a batch fusion's ``min_fuse_set_size`` /
    ``max_fuse_set_size`` / ``max_fuse_search_depth`` override its search options; ``threshold_to_cat`` sets the
    run length of the *_to_slices / _to_view / _to_cats passes. Keys the search does not
    use (``counter``, ``require_fbgemm``) are accepted and ignored: our passes run to a
    fixed point. A name upstream accepts without registering any pre-grad pattern in it
    (``EMPTY_UPSTREAM_PASSES``) becomes a pass with no patterns. Raises KeyError for a
    name that is neither a batch fusion nor a pattern pass (upstream fails the compile
    with a KeyError too), and for a post-grad fusion's name (``batch_aten_relu``: see
    :func:`optimus_lens.passes.post_grad.upstream_post_grad_pipeline`)."""
    options = dict(options)
    batch_passes, pattern_passes = [], []
    for name, opts in options.items():
        opts = dict(opts or {})
        pattern = REGISTRY.get(name)
        if pattern is not None and pattern.stage != "pre-grad":
            raise KeyError(
                f"{name!r} is a {pattern.stage} fusion option (post_grad_fusion_options), not a pre-grad one"
            )
        if pattern is not None and pattern.kind == "batch":
            batch_passes.append(
                Pass(
                    name,
                    [pattern],
                    options=pattern.options.replace(**{"search": "upstream", **opts}),
                    description=pattern.description,
                    estimate=group_estimate,
                )
            )
        elif name in PATTERN_PASSES:
            if name != "normalization_pass":
                pattern_passes.append(pattern_pass(name, opts.get("threshold_to_cat")))
        elif name in EMPTY_UPSTREAM_PASSES:
            pattern_passes.append(Pass(name, [], description=EMPTY_UPSTREAM_PASSES[name]))
        else:
            known = sorted([*PATTERN_PASSES, *EMPTY_UPSTREAM_PASSES]) + sorted(
                n for n, p in REGISTRY.items() if p.kind == "batch" and p.stage == "pre-grad"
            )
            raise KeyError(f"unknown pre-grad fusion option {name!r}; known: {', '.join(known)}")
    head = [pattern_pass("normalization_pass")] if "normalization_pass" in options else []
    return Pipeline(head + batch_passes + pattern_passes)


def pass_catalogue() -> list[dict]:
    """Every registered pattern as plain data: name, kind, description, preconditions,
    upstream counterpart, source location and stage (``"pre-grad"`` or ``"post-grad"``;
    ``optimus passes`` prints this)."""
    return [
        {
            "name": p.name,
            "kind": p.kind,
            "description": p.description,
            "preconditions": list(p.preconditions),
            "upstream": p.upstream,
            "source": p.source,
            "stage": p.stage,
        }
        for p in REGISTRY.values()
    ]
