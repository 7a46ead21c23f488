"""A pattern's walkthrough as plain data: what a lesson shows, and nothing that builds it.

:func:`optimus_lens.teach.walk.walkthrough` fills a :class:`Walkthrough`;
:mod:`optimus_lens.viz.lesson` draws one and the app's Teach page shows it. This module
imports only the core, so the drawing side never reaches the pattern catalogue.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch.fx import GraphModule

from optimus_lens.core.trace import GraphSnapshot, Trace


@dataclass
class Frame:
    """One move of the search, as a learner scrubs it.

    ``marks`` maps node name -> group index (colour) and ``labels[i]`` names group i
    (a depth ring, a key class, a fused group); ``left_out`` maps a node to why it is
    not (or no longer) in a group. ``groups`` is set on the frames that produce groups."""

    title: str
    text: str
    marks: dict[str, int] = field(default_factory=dict)
    labels: list[str] = field(default_factory=list)
    left_out: dict[str, str] = field(default_factory=dict)
    groups: list[list[str]] = field(default_factory=list)


@dataclass
class Search:
    """A replayed search: ``mode`` ("global" or "upstream"), the frames in order, and the
    groups the search hands to the pattern's ``fuse`` (the last frame's ``groups``)."""

    mode: str
    frames: list[Frame]
    groups: list[list[str]]
    root: str | None = None
    #: the graph searched when it is not the lesson's graph before (a variant), and how it differs
    graph: GraphSnapshot | None = None
    change: str = ""


@dataclass
class Gain:
    """What the pattern bought on the teaching model: node counts, latency in ms (median,
    p10, p90 over ``repeats`` samples, both graphs timed round-robin in one run), peak
    memory in bytes (``peak_source``: "estimate" = liveness of the graph on CPU, "cuda"
    = measured), ``method`` the timer and ``device``."""

    nodes_before: int
    nodes_after: int
    before_ms: tuple[float, float, float]
    after_ms: tuple[float, float, float]
    peak_before: int
    peak_after: int
    peak_source: str
    method: str
    device: str
    repeats: int

    @property
    def speedup(self) -> float:
        return self.before_ms[0] / self.after_ms[0] if self.after_ms[0] > 0 else float("nan")


@dataclass
class Exercise:
    """A variant of the teaching model's graph on which the pattern does not fire.

    ``change`` says in words how the variant differs, ``added`` names the nodes it added,
    ``graph`` is its snapshot, ``question`` asks about node ``node``, and ``answer`` is
    what :meth:`optimus_lens.debug.why.DryRun.explain` says for it (verbatim)."""

    change: str
    graph: GraphSnapshot
    added: list[str]
    node: str
    question: str
    answer: str
    #: the variant itself (a GraphModule with example values), to run it again
    gm: GraphModule | None = field(default=None, repr=False, compare=False)


@dataclass
class Slide:
    """One slide: ``kind`` ("before", "search", "dependent" (the search on a variant where
    one member depends on another), "match", "after", "gain", "exercise"),
    a title and its lines of text (every line derived, none written per pattern)."""

    kind: str
    title: str
    lines: list[str]


@dataclass
class Walkthrough:
    """Everything a lesson on ``pattern`` shows (see :mod:`optimus_lens.teach.walk`).
    ``trace`` holds only this pattern's steps on ``model``; ``sites`` lists each step's
    site nodes; ``anchors`` (rewrite patterns) maps each anchor node of the captured
    graph to None (it matched) or the pattern's reason."""

    pattern: str
    kind: str
    description: str
    preconditions: list[str]
    upstream: str
    source: str
    model: str
    model_description: str
    trace: Trace
    sites: list[list[str]]
    search: Search | None
    anchors: dict[str, str | None]
    #: batch patterns: the same search on a variant where one member depends on another
    dependent: Search | None
    #: per step, why its sites matched: the group key they share (batch) or the anchor ``match`` accepted
    why_sites: list[str] = field(default_factory=list)
    gain: Gain | None = None
    exercise: Exercise | None = None
    slides: list[Slide] = field(default_factory=list)
