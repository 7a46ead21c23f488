"""Patterns: the two kinds (horizontal BatchPattern, vertical RewritePattern) and the
registry they are added to (:func:`register`; the catalogue, :mod:`optimus_lens.passes`,
looks them up by name).

A pattern that does not match a node says why: ``key``/``match`` return a
:class:`~optimus_lens.core.miss.Miss` carrying a short reason naming the failed condition
(MLIR's ``notifyMatchFailure``), which the CLI's ``optimus why`` and the app's pattern view show.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torch.fx import Node

from optimus_lens.core.aliasing import region_miss
from optimus_lens.core.miss import Miss, Refused
from optimus_lens.core.outputs import output_chain
from optimus_lens.core.stepcheck import trial_miss
from optimus_lens.core.where import source_of

if TYPE_CHECKING:
    from optimus_lens.core.rewriter import Rewriter


@dataclass
class Match:
    """What a RewritePattern found: the anchor node, every node of the site, and any
    values the rewrite needs (``info``)."""

    anchor: Node
    nodes: list[Node]
    info: dict = field(default_factory=dict)


SEARCH_MODES = ("global", "upstream")


@dataclass(frozen=True)
class SearchOptions:
    """Search options; sizes as upstream's ``default_graph_search_options``
    (torch/_inductor/fx_passes/group_batch_fusion.py): fuse groups of 5..300 nodes.

    ``search`` picks how groups are found (:mod:`optimus_lens.core.search`):

    * ``"global"`` (default): every node of the graph with the pattern's group key is a
      candidate, wherever it lies; each key class is split into groups of mutually
      independent members (no member an ancestor of another). Finds every group that an
      exhaustive search finds, including candidates that lie behind other candidates and
      members that first meet far below them. ``max_fuse_search_depth`` is not used.
    * ``"upstream"``: upstream's bounded search, for parity: from each root, a
      breadth-first walk of at most ``max_fuse_search_depth`` producer hops that stops
      at matches, then greedy first-fit packing.

    ``profitable_only`` (global search): a group is fused only if the estimate of its pass
    (:attr:`optimus_lens.core.pipeline.Pass.estimate`; the catalogue's passes carry
    :func:`optimus_lens.passes.profit.group_estimate`) expects it to save time per call;
    its members are then left unfused.

    Raises ValueError for another ``search``."""

    min_fuse_set_size: int = 5
    max_fuse_set_size: int = 300
    max_fuse_search_depth: int = 5
    search: str = "global"
    profitable_only: bool = False

    def __post_init__(self):
        if self.search not in SEARCH_MODES:
            raise ValueError(f"search must be one of {SEARCH_MODES}, not {self.search!r}")

    def replace(self, **kw) -> SearchOptions:
        known = {k: v for k, v in kw.items() if k in self.__dataclass_fields__}
        return SearchOptions(**{**self.__dict__, **known})


class Pattern:
    """Base of both kinds. Subclasses set ``name``, ``description`` (one line) and
    ``preconditions`` (words); ``source`` ("path:line" where the class is defined) is
    filled in by :func:`register`. ``stage`` is the graph the pattern is written for:
    ``"pre-grad"`` (the Dynamo graph: torch functions, ``example_value``) or
    ``"post-grad"`` (the ATen graphs AOTAutograd hands Inductor: ``OpOverload`` targets,
    ``val``)."""

    stage: str = "pre-grad"
    name: str = ""
    description: str = ""
    preconditions: tuple[str, ...] = ()
    upstream: str = ""  # the upstream pass it mirrors, e.g. "PreGradBatchLinearFusion"
    source: str = ""
    kind: str = ""


class BatchPattern(Pattern):
    """Horizontal fusion: ``key(node)`` says which group a node may fuse with (or why it
    cannot, as a :class:`Miss`); ``fuse(rw, nodes)`` rewrites one independent group.

    ``fuse`` changes the graph only through ``rw``, an :class:`optimus_lens.core.rewriter.Rewriter`
    (``rw.call``/``create``, ``replace_all_uses``, ``replace_input``, ``modify``,
    ``erase``); a change made around it fails the step, which is rolled back. It may
    insert its nodes anywhere; the engine moves them (and rewired users) forward to keep
    the graph topologically valid. It rewires the uses of the fused nodes and erases them.

    ``anchors`` (targets, or method names for call_method) are the only targets whose
    nodes ``key`` may give a group; the engine then keys just those nodes at the start of
    a pass (O(candidates), not O(nodes)). Empty means every node may have a key.

    ``group_hint(node)``, optional, is a cheap identity that every member of a group
    shares (two nodes with different hints never have equal keys; None: no hint). The
    global search then keys only the nodes whose hint at least ``min_fuse_set_size``
    live nodes share: the same classes, without the legality checks of ``key`` for
    nodes no group can hold (each tower's linear reads its own input).
    """

    kind = "batch"
    options = SearchOptions()
    anchors: frozenset = frozenset()
    #: place in the default pipeline (``optimus_lens.passes.BATCH_PASSES`` sorts the registry by
    #: it); None keeps a pattern out of it (a user's pattern runs where its file puts it)
    pipeline_order: int | None = None

    def key(self, node: Node) -> Hashable | Miss:
        raise NotImplementedError

    def group_hint(self, node: Node) -> Hashable | None:
        """See the class docstring; this default gives none (every anchored node is keyed)."""
        return None

    def hints(self) -> bool:
        """Whether this pattern gives hints (overrides :meth:`group_hint`)."""
        return type(self).group_hint is not BatchPattern.group_hint

    def fuse(self, rw: Rewriter, nodes: list[Node]) -> None:
        raise NotImplementedError


class RewritePattern(Pattern):
    """Vertical rewrite: ``match(node)`` returns a :class:`Match` anchored at ``node``
    (or a :class:`Miss`); ``rewrite(rw, match)`` replaces it, changing the graph only
    through ``rw`` (an :class:`optimus_lens.core.rewriter.Rewriter`, as for :class:`BatchPattern`).

    ``anchors`` (targets, or method names for call_method) lets the engine skip nodes
    that cannot anchor a match without calling ``match``; empty means every node.
    """

    kind = "rewrite"
    anchors: frozenset = frozenset()

    def match(self, node: Node) -> Match | Miss:
        raise NotImplementedError

    def rewrite(self, rw: Rewriter, match: Match) -> None:
        raise NotImplementedError


def off_anchor(pattern: RewritePattern, node: Node) -> Miss | None:
    """A Miss when ``node``'s target (a function, or a method name for call_method) is
    not one of ``pattern.anchors``; None when it is, or when the pattern has no anchors."""
    if not pattern.anchors:
        return None
    t = node.target if node.op in ("call_function", "call_method") else None
    if t in pattern.anchors:
        return None
    return Miss(f"not an anchor ({targets_text(sorted(pattern.anchors, key=str)[:4])}...)")


class AnchoredPattern(RewritePattern):
    """A RewritePattern written as ``find(node)``: ``match`` first refuses a node outside
    ``anchors`` (so asking it about any node answers truthfully, not only about the nodes
    the engine offers), then runs ``find``, in which ``need(x)`` ends the match with
    ``x`` when ``x`` is a Miss. The shipped split/cat patterns are written this way."""

    def match(self, node: Node) -> Match | Miss:
        miss = off_anchor(self, node)
        if miss is not None:
            return miss
        try:
            m = self.find(node)
        except Refused as r:
            return r.miss
        if isinstance(m, Match):
            return region_miss(m.nodes) or _output_trial(self, m) or m
        return m

    def find(self, node: Node) -> Match | Miss:
        raise NotImplementedError


def _output_trial(pattern: RewritePattern, m: Match) -> Miss | None:
    """Where the match's site feeds a graph output: the step check's answer on a trial of
    the rewrite (:func:`optimus_lens.core.stepcheck.trial_miss`), so a rewrite that would make
    an output overlap an input or another output is refused with its reason. The site
    feeds an output when one of its nodes is an output or what an output views
    (:func:`optimus_lens.core.outputs.output_chain`)."""
    if not any(u.op == "output" for n in m.nodes for u in n.users):
        chain = output_chain(m.anchor.graph)
        if not any(n in chain for n in m.nodes):
            return None
    return trial_miss(pattern.rewrite, m, m.anchor.graph)


REGISTRY: dict[str, Pattern] = {}


def register(cls_or_obj):
    """Class decorator (or call on an instance): instantiate, record its source
    location, and add it to ``REGISTRY`` under its ``name``.

    Raises ValueError if the name is empty or already taken by another pattern.
    """
    obj = cls_or_obj() if isinstance(cls_or_obj, type) else cls_or_obj
    if not obj.name:
        raise ValueError(f"{cls_or_obj!r} has no name")
    prev = REGISTRY.get(obj.name)
    if prev is not None and type(prev) is not type(obj):
        raise ValueError(f"pattern name {obj.name!r} is already registered by {prev.source}")
    obj.source = obj.source or source_of(type(obj) if not isinstance(cls_or_obj, type) else cls_or_obj)
    REGISTRY[obj.name] = obj
    return cls_or_obj


def why_not(pattern: Pattern, node: Node) -> str | None:
    """None if ``pattern`` could apply at ``node``, else the reason it cannot (a
    :class:`Miss`; a match-language pattern's Miss has ``partial``, its best partial match)."""
    if isinstance(pattern, RewritePattern) and (off := off_anchor(pattern, node)):
        return off
    r = pattern.key(node) if isinstance(pattern, BatchPattern) else pattern.match(node)  # type: ignore[attr-defined]
    if r is None:
        return "no match"
    return r if isinstance(r, Miss) else None  # the Miss itself: it may carry its best partial match


def targets_text(targets: Iterable[Any]) -> str:
    """Targets as comma-separated text: a method name as it is, a function by its
    qualified name (``torch.cat, split``)."""
    out = []
    for t in targets:
        out.append(
            t if isinstance(t, str) else f"{getattr(t, '__module__', '') or ''}.{getattr(t, '__name__', t)}".lstrip(".")
        )
    return ", ".join(out)
