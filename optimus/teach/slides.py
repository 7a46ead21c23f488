"""A walkthrough's slides: the lines of text of each, derived from the walkthrough."""

from __future__ import annotations

from optimus_lens.teach.data import Slide, Walkthrough


def _fmt_ms(t: tuple[float, float, float]) -> str:
    return f"{t[0]:.3f} ms (p10-p90 {t[1]:.3f}-{t[2]:.3f})"


def lesson_slides(w: Walkthrough) -> list[Slide]:
    """The slides of ``w`` in order: what the pattern looks for, the search (and the
    dependent variant's), the match, the graph after, what it bought, the exercise. Every
    line is derived from ``w``; none is written per pattern."""
    words = (
        "a batch (horizontal) fusion: independent nodes of one kind become one"
        if w.kind == "batch"
        else "a rewrite (vertical): one pattern of connected nodes becomes another"
    )
    slides = [
        Slide(
            "before",
            f"{w.pattern}: what it looks for",
            [
                w.description,
                f"Kind: {words}.",
                "It fires only where all of these hold:",
                *[f"• {p}" for p in w.preconditions],
                f"Teaching model: {w.model} — {w.model_description}",
                f"Upstream counterpart: {w.upstream or '(none)'}; defined at {w.source}.",
            ],
        )
    ]
    if w.search is not None:
        slides.append(
            Slide(
                "search",
                f"The search ({w.search.mode})",
                [
                    f"{len(w.search.frames)} frames: scrub them to follow the search step by step.",
                    f"Groups handed to the fusion: {'; '.join(', '.join(g) for g in w.search.groups) or 'none'}.",
                ],
            )
        )
        if w.dependent is not None:
            slides.append(
                Slide(
                    "dependent",
                    "A member that depends on another",
                    [
                        f"The same search on a variant where {w.dependent.change}.",
                        f"Groups: {'; '.join(', '.join(g) for g in w.dependent.groups) or 'none'}.",
                    ],
                )
            )
    else:
        hits = [n for n, r in w.anchors.items() if r is None]
        slides.append(
            Slide(
                "search",
                "Where it looks",
                [
                    f"{len(w.anchors)} anchor node(s) (the targets the pattern can start from); "
                    f"{len(hits)} match: {', '.join(hits) or 'none'}.",
                    *[f"• {n}: {'matches' if r is None else r}" for n, r in w.anchors.items()],
                ],
            )
        )
    match = []
    for i, s in enumerate(w.sites, 1):
        match.append(f"Step {i}: sites {', '.join(s)}")
        if i <= len(w.why_sites):
            match.append(f"• {w.why_sites[i - 1]}")
    slides.append(Slide("match", "The match", match or ["No step."]))
    prov = [f"{o} → {n}" for s in w.trace.steps for o, n in s.replaced.items()]
    created = [c for s in w.trace.steps for c in s.created]
    slides.append(
        Slide(
            "after",
            "The graph after",
            [
                f"{w.trace.nodes_before} → {w.trace.nodes_after} nodes.",
                f"Created: {', '.join(created) or 'none'}.",
                f"Provenance (replaced → replacement): {', '.join(prov) or 'none'}.",
            ],
        )
    )
    if w.gain is not None:
        g = w.gain
        slides.append(
            Slide(
                "gain",
                "What it bought",
                [
                    f"Nodes: {g.nodes_before} → {g.nodes_after}.",
                    f"Latency before: {_fmt_ms(g.before_ms)}; after: {_fmt_ms(g.after_ms)} — "
                    f"{g.speedup:.2f}x, measured here ({g.device}, {g.method}, {g.repeats} samples each, "
                    f"round-robin in one run). Overlapping spreads mean no measurable difference.",
                    f"Peak memory ({g.peak_source}): {g.peak_before:,} → {g.peak_after:,} bytes.",
                ],
            )
        )
    if w.exercise is not None:
        e = w.exercise
        slides.append(Slide("exercise", "Exercise: why not?", [f"The variant: {e.change}.", e.question]))
    return slides
