"""Patterns: the two kinds (horizontal BatchPattern, vertical RewritePattern) and their registry.

A pattern that does not match a node says why: ``key``/``match`` return a
:class:`Miss` carrying a short reason naming the failed condition (MLIR's
``notifyMatchFailure``), which the CLI's ``optimus why`` and the app's pattern view show.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torch.fx import Node

from optimus_lens.core.where import source_of

if TYPE_CHECKING:
    from optimus_lens.core.rewriter import Rewriter


class Miss(str):
    """Why a pattern does not apply at a node: a short reason, e.g. ``"input is not 2-D"``.

    A ``str`` subclass so patterns can ``return Miss("...")`` cheaply in the hot path.
    ``partial`` (set by :mod:`optimus_lens.core.lang`) lists the nodes matched before the failure.
    """

    partial: list


def is_miss(x: Any) -> bool:
    return x is None or isinstance(x, Miss)


class Refused(Exception):
    """Raised by :func:`need` to end a match early; :meth:`AnchoredPattern.match` returns its ``miss``."""

    def __init__(self, miss: Miss):
        super().__init__(miss)
        self.miss = miss


def need(value: Any) -> Any:
    """``value``, unless it is a :class:`Miss`: then the match in progress ends with it
    (raises :class:`Refused`, which :meth:`AnchoredPattern.match` turns back into the
    Miss). ``p = need(parts_of(node))`` replaces ``p = parts_of(node); if isinstance(p,
    Miss): return p``."""
    if isinstance(value, Miss):
        raise Refused(value)
    return value


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

    ``profitable_only`` (global search): a group is fused only if
    :func:`optimus_lens.passes.profit.group_estimate` expects it to save time per call; its members
    are then left unfused.

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
    filled in by :func:`register`."""

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
    """

    kind = "batch"
    options = SearchOptions()
    anchors: frozenset = frozenset()
    #: place in the default pipeline (``optimus_lens.passes.BATCH_PASSES`` sorts the registry by
    #: it); None keeps a pattern out of it (a user's pattern runs where its file puts it)
    pipeline_order: int | None = None

    def key(self, node: Node) -> Hashable | Miss:
        raise NotImplementedError

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
            return self.find(node)
        except Refused as r:
            return r.miss

    def find(self, node: Node) -> Match | Miss:
        raise NotImplementedError


REGISTRY: dict[str, Pattern] = {}


_UNCHANGED: dict[str, dict] | None = None  # memo tables, only inside graph_unchanged()


@contextmanager
def graph_unchanged() -> Iterator[None]:
    """A block in which the graph is not changed, so a pattern's ``key``/``match`` may
    memoise graph-wide facts in :func:`unchanged_memo` tables (the engine keys every node
    of a pass inside one block). Nested blocks share the outer block's tables; all are
    dropped when the outermost block ends."""
    global _UNCHANGED
    if _UNCHANGED is not None:
        yield
        return
    _UNCHANGED = {}
    try:
        yield
    finally:
        _UNCHANGED = None


def unchanged_memo(name: str) -> dict | None:
    """The memo table ``name`` of the current :func:`graph_unchanged` block (created empty
    on first use), or None outside one: then nothing may be memoised."""
    if _UNCHANGED is None:
        return None
    return _UNCHANGED.setdefault(name, {})


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


def get(name: str) -> Pattern:
    """The registered pattern ``name``; KeyError listing the known names otherwise."""
    import optimus_lens.passes  # noqa: F401  (registers the shipped patterns)

    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown pattern {name!r}; known: {', '.join(sorted(REGISTRY))}") from None


def all_patterns() -> list[Pattern]:
    import optimus_lens.passes  # noqa: F401

    return list(REGISTRY.values())


def why_not(pattern: Pattern, node: Node) -> str | None:
    """None if ``pattern`` could apply at ``node``, else the reason it cannot (a
    :class:`Miss`; a match-language pattern's Miss has ``partial``, its best partial match)."""
    if isinstance(pattern, RewritePattern) and (off := off_anchor(pattern, node)):
        return off
    r = pattern.key(node) if isinstance(pattern, BatchPattern) else pattern.match(node)  # type: ignore[attr-defined]
    if r is None:
        return "no match"
    return r if isinstance(r, Miss) else None  # the Miss itself: it may carry its best partial match


def explain(node: Node, patterns: Iterable[Pattern] | None = None) -> dict[str, str | None]:
    """For every pattern (default: all registered), None if it could apply at ``node``
    or the reason it cannot — the "why not" of the pattern lab and ``optimus why``.
    A pattern that raises is reported as ``"raised <Error>: <message>"``, not propagated."""
    out: dict[str, str | None] = {}
    for p in patterns if patterns is not None else all_patterns():
        try:
            out[p.name] = why_not(p, node)
        except Exception as e:  # noqa: BLE001 - a broken pattern is itself the answer
            out[p.name] = f"raised {type(e).__name__}: {e}"
    return out


def group_size(pattern: BatchPattern, node: Node) -> int:
    """How many nodes of ``node``'s graph (``node`` included) share its group key under
    ``pattern`` (0 when ``node`` has none). A group fuses only with at least
    ``options.min_fuse_set_size`` independent members found within
    ``options.max_fuse_search_depth`` producer hops of one search root, so this is an
    upper bound on the group ``node`` can join. O(nodes) key calls."""
    k = pattern.key(node)
    if k is None or isinstance(k, Miss):
        return 0
    size = 0
    with graph_unchanged():  # keys may memoise graph-wide facts, as when the engine keys a pass
        for n in node.graph.nodes:
            try:
                m = pattern.key(n)
            except Exception:  # noqa: BLE001 - a node the key cannot read is not in the group
                continue
            size += m is not None and not isinstance(m, Miss) and m == k
    return size


def targets_text(targets: Iterable[Any]) -> str:
    out = []
    for t in targets:
        out.append(
            t if isinstance(t, str) else f"{getattr(t, '__module__', '') or ''}.{getattr(t, '__name__', t)}".lstrip(".")
        )
    return ", ".join(out)
