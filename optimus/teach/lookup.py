"""Which patterns a lesson can teach, on which model, and the one-pattern pass it runs."""

from __future__ import annotations

from optimus_lens.core.pattern import Pattern, SearchOptions
from optimus_lens.core.pipeline import Pass, Pipeline
from optimus_lens.passes import pattern_named
from optimus_lens.passes.profit import group_estimate


class TeachError(KeyError):
    """Unknown pattern, or a pattern without a teaching model; the message lists the known
    ones. A KeyError (as :func:`optimus_lens.passes.pattern_named` raises for an unknown name)
    whose text prints as written, not quoted."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def predefined() -> list[str]:
    """Every shipped pre-grad pattern's name, in registration order (what ``optimus passes``
    lists under the pre-grad graph): the patterns a lesson walks through on a teaching model
    (the post-grad ATen patterns run on AOTAutograd's graphs, which the lessons do not draw yet)."""
    from optimus_lens.passes import pass_catalogue

    return [c["name"] for c in pass_catalogue() if c.get("stage", "pre-grad") == "pre-grad"]


def teaching_model(pattern_name: str) -> str:
    """The sample model that teaches ``pattern_name``: the first model of kind "teaching"
    whose ``teaches`` names it. Raises TeachError (unknown pattern, or none teaches it)."""
    from optimus_lens import sample_models

    names = predefined()
    if pattern_name not in names:
        raise TeachError(f"unknown pattern {pattern_name!r}; known: {', '.join(names)}")
    for m in sample_models.REGISTRY.values():
        if m.kind == "teaching" and pattern_name in m.teaches:
            return m.name
    raise TeachError(
        f"no teaching model teaches {pattern_name!r} (a sample model of kind 'teaching' with it in its teaches field)"
    )


def predefined_pattern(name: str) -> Pattern:
    """The shipped pattern ``name``; raises TeachError for a name :func:`predefined` lacks."""
    if name not in predefined():
        raise TeachError(f"unknown pattern {name!r}; known: {', '.join(predefined())}")
    return pattern_named(name)


def lesson_pipeline(pattern: Pattern) -> Pipeline:
    """The one-pass pipeline a lesson runs: ``pattern`` alone, with its own search options."""
    return Pipeline([Pass(pattern.name, [pattern], description=pattern.description, estimate=group_estimate)])


def search_options(pattern: Pattern, search: str | None = None) -> SearchOptions:
    """``pattern``'s own search options (a rewrite pattern: the defaults), with ``search``
    ("global" or "upstream") instead of its own when given."""
    opts = getattr(pattern, "options", SearchOptions())
    return opts.replace(search=search) if search else opts
