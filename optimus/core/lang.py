"""A small declarative match language for FX graphs.

A pattern is a tree of sub-patterns that describes an FX node and its arguments, in the
spirit of tinygrad's ``UPat`` and Inductor's ``CallFunction``::

    from optimus_lens.core.lang import Op, Pieces, Var

    # cat([split(x, sizes, d)[0], ..., split(x, sizes, d)[n-1]], d)  ->  x
    SPLIT_CAT = Op(CAT, Pieces(Op(SPLIT, Var("x"), dim=Var("d"))), dim=Var("d"))

``match(pattern, node)`` returns the :class:`Bindings` (named captures) or a
:class:`~optimus_lens.core.miss.Miss` that names the first sub-pattern that failed and why, as a
path from the root (``"cat.tensors: pieces 0..1 of 3 are taken"``). The reasons come from
the language itself, so every pattern written in it explains its near misses the same way.

The parts:

* :class:`Op` — a call_function / call_method / call_module node whose target is one of the
  given functions, method names or module types, with positional and keyword argument
  sub-patterns. Arguments are bound to the op's signature (``torch.cat(xs, 1)`` and
  ``torch.cat(xs, dim=1)`` both give ``dim=1``), defaults filled in; negative dims are *not*
  normalised (use :func:`require` for that).
* :class:`Var` — a named capture; the same name used twice must bind the same value (the
  same node, or equal constants).
* :data:`ANY` / :class:`Const` — anything / one constant value.
* :class:`Pieces` — a list that is *every* output of one tuple-producing node (split,
  unbind, chunk), ``getitem(P, 0) .. getitem(P, n-1)`` in order, with ``P`` matched by a
  sub-pattern; :class:`Each` — a list whose every element matches one sub-pattern.
* :func:`require` — a predicate over the bindings with the reason it gives when false;
  :func:`check` — a function of the bindings returning that reason (a Miss) or None.
* :class:`Rule` — a pattern and its replacement: one value for the root, or (``pieces``)
  one value per output of a tuple-valued root (a split or unbind replaced piece by piece).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.fx import Node

if TYPE_CHECKING:
    from optimus_lens.core.rewriter import Rewriter

from optimus_lens.core.aliasing import region_miss
from optimus_lens.core.callargs import bind
from optimus_lens.core.effects import writes_inputs
from optimus_lens.core.miss import Miss
from optimus_lens.core.pattern import Match, RewritePattern
from optimus_lens.core.stepcheck import identity_miss


class Bindings(dict):
    """Capture name -> bound value (an FX Node or a constant), plus ``nodes``: every node an
    :class:`Op` matched, root first (the match's site)."""

    def __init__(self, *a: Any, **kw: Any):
        super().__init__(*a, **kw)
        self.nodes: list[Node] = []
        self._seen: set[Node] = set()

    def add(self, node: Node) -> None:
        """Record ``node`` as matched (once; O(1): a cat of 128 pieces adds 128)."""
        if node not in self._seen:
            self._seen.add(node)
            self.nodes.append(node)

    def add_all(self, nodes: Iterable[Node]) -> None:
        """:meth:`add` each of ``nodes``, in order (one call for a list of pieces)."""
        seen, out = self._seen, self.nodes
        for n in nodes:
            if n not in seen:
                seen.add(n)
                out.append(n)


#: keyword spellings of one parameter across an op's spellings (``torch.split`` vs ``Tensor.split``)
ALIASES = {"input": ("self", "tensor"), "split_size": ("split_size_or_sections", "split_sizes")}


class Pat:
    """A sub-pattern. ``_match(value, b, path)`` returns None and extends ``b`` on success,
    or a Miss naming ``path`` on failure (``b`` may then hold partial captures)."""

    def _match(self, value: Any, b: Bindings, path: str) -> Miss | None:
        raise NotImplementedError

    def describe(self) -> str:
        """The pattern as short text, for error messages and the Pattern Lab."""
        return type(self).__name__


def _fail(path: str, why: str) -> Miss:
    return Miss(f"{path}: {why}" if path else why)


@dataclass(frozen=True)
class _Any(Pat):
    def _match(self, value, b, path):
        return None

    def describe(self) -> str:
        return "_"


#: matches any value
ANY = _Any()


@dataclass(frozen=True)
class Const(Pat):
    """Matches a value equal to ``value`` (``Const(0)``, ``Const(None)``)."""

    value: Any

    def _match(self, value, b, path):
        if isinstance(value, Node) or value != self.value:
            return _fail(path, f"is {_text(value)}, not {self.value!r}")
        return None

    def describe(self) -> str:
        return repr(self.value)


@dataclass(frozen=True)
class Var(Pat):
    """A named capture, optionally constrained by ``pat``: binds ``name`` to the value.
    A name bound earlier in the match must be bound to the same value again (the same FX
    node, or an equal constant) — ``cat(..., dim=Var("d"))`` and ``split(..., dim=Var("d"))``
    then require one dim."""

    name: str
    pat: Pat | None = None

    def _match(self, value, b, path):
        if self.name in b:
            old = b[self.name]
            same = old is value if isinstance(old, Node) or isinstance(value, Node) else old == value
            return None if same else _fail(path, f"{self.name} is {_text(value)} here but {_text(old)} before")
        if self.pat is not None:
            miss = self.pat._match(value, b, path)
            if miss is not None:
                return miss
        b[self.name] = value
        return None

    def describe(self) -> str:
        return self.name if self.pat is None else f"{self.name}={self.pat.describe()}"


def _text(value: Any) -> str:
    return value.name if isinstance(value, Node) else repr(value)


def _pat(x: Any) -> Pat:
    """Sub-pattern coercion: a Pat stays; a string is a :class:`Var`; a list or tuple a
    :class:`Seq` of its coerced elements; anything else a :class:`Const`."""
    if isinstance(x, Pat):
        return x
    if isinstance(x, str):
        return Var(x)
    if isinstance(x, (list, tuple)):
        return Seq(tuple(_pat(v) for v in x))
    return Const(x)


@dataclass(frozen=True)
class Seq(Pat):
    """A list or tuple of exactly ``len(items)`` elements, element ``i`` matching ``items[i]``."""

    items: tuple

    def _match(self, value, b, path):
        if not isinstance(value, (list, tuple)):
            return _fail(path, f"is {_text(value)}, not a list")
        if len(value) != len(self.items):
            return _fail(path, f"has {len(value)} elements, not {len(self.items)}")
        for i, (p, v) in enumerate(zip(self.items, value)):
            miss = p._match(v, b, f"{path}[{i}]")
            if miss is not None:
                return miss
        return None

    def describe(self) -> str:
        return "[" + ", ".join(p.describe() for p in self.items) + "]"


class Op(Pat):
    """An FX node calling ``target`` with arguments matching the sub-patterns ``args``
    (by position) and ``kwargs`` (by parameter name).

    ``target``: a function (call_function), method names (strings, call_method),
    ``nn.Module`` subclasses (call_module, matched against the submodule's type when a
    GraphModule is given to :func:`match`), or ``(functions, methods)`` pairs as
    :mod:`optimus_lens.passes.common` defines them (``CAT``, ``SPLIT``), or a tuple of any of
    these. ``args`` match the
    op's parameters by position, ``kwargs`` by name (after binding the node's own
    arguments to the op's signature, defaults filled in). ``name`` binds the node itself.
    ``where`` adds predicates (:func:`require`) checked after the arguments matched.
    A ``torch`` function that is also a Tensor method (``torch.sigmoid``) matches both
    spellings. Raises TypeError for a target of another kind.
    """

    def __init__(self, target: Any, *args: Any, name: str | None = None, where: Iterable[Require] = (), **kwargs: Any):
        fns, methods, modules = set(), set(), set()
        for t in _flatten_targets([target]):
            if isinstance(t, str):
                methods.add(t)
            elif isinstance(t, type) and issubclass(t, torch.nn.Module):
                modules.add(t)
            elif callable(t):
                fns.add(t)
            else:
                raise TypeError(f"Op target must be a function, a method name or an nn.Module type, not {t!r}")
        for f in list(fns):  # torch.sigmoid(x) and x.sigmoid() are one op
            n = getattr(f, "__name__", None)
            if n and getattr(torch, n, None) is f and hasattr(torch.Tensor, n):
                methods.add(n)
        for m in list(methods):
            f = getattr(torch, m, None)
            if callable(f) and hasattr(torch.Tensor, m):
                fns.add(f)
        self.functions, self.methods, self.modules = frozenset(fns), frozenset(methods), frozenset(modules)
        self.args = tuple(_pat(a) for a in args)
        self.kwargs = {k: _pat(v) for k, v in kwargs.items()}
        self.name = name
        self.where = tuple(where)

    @property
    def anchors(self) -> frozenset:
        """The targets a node must have to match (what the engine indexes candidates by)."""
        return self.functions | self.methods

    def label(self) -> str:
        fns = {getattr(f, "__name__", str(f)) for f in self.functions}
        names = sorted(fns | {f".{m}" for m in self.methods if m not in fns} | {m.__name__ for m in self.modules})
        return "|".join(names) or "op"

    def describe(self) -> str:
        parts = [a.describe() for a in self.args] + [f"{k}={v.describe()}" for k, v in self.kwargs.items()]
        return f"{self.label()}({', '.join(parts)})"

    def _target_ok(self, node: Node) -> bool:
        if node.op == "call_function":
            return node.target in self.functions
        if node.op == "call_method":
            return node.target in self.methods
        if node.op == "call_module" and self.modules:
            mod = _MODULE_OF.get(node)
            return mod is not None and isinstance(mod, tuple(self.modules))
        return False

    def _match(self, value, b, path):
        if not isinstance(value, Node):
            return _fail(path, f"is {_text(value)}, not a node")
        if not self._target_ok(value):
            what = (
                value.target
                if value.op in ("call_method", "placeholder", "output")
                else getattr(value.target, "__name__", value.target)
            )
            return _fail(path, f"{value.name} is {value.op} {what}, not {self.label()}")
        here = value.name  # reasons below name the matched node: "cat_1.dim: ..."
        if isinstance(b, Bindings):
            b.add(value)
        if self.args or self.kwargs:
            bound = bind(value)
            if isinstance(bound, Miss):
                return _fail(here, bound)
            names = list(bound)
            for i, p in enumerate(self.args):
                if i >= len(names):
                    return _fail(here, f"has no argument {i}")
                miss = p._match(bound[names[i]], b, f"{here}.{names[i]}")
                if miss is not None:
                    return miss
            for k, p in self.kwargs.items():
                key = next((a for a in (k, *ALIASES.get(k, ())) if a in bound), None)
                if key is None:
                    return _fail(here, f"has no argument {k}")
                miss = p._match(bound[key], b, f"{here}.{k}")
                if miss is not None:
                    return miss
        if self.name is not None:
            miss = Var(self.name)._match(value, b, here)
            if miss is not None:
                return miss
        for r in self.where:
            why = r.why(b)
            if why:
                return _fail(here, why)
        return None


def _flatten_targets(targets: Iterable[Any]) -> list[Any]:
    out = []
    for t in targets:
        if isinstance(t, (tuple, list, set, frozenset)):
            out.extend(_flatten_targets(t))
        else:
            out.append(t)
    return out


_MODULE_OF: dict[Node, Any] = {}  # call_module node -> submodule, filled by match(gm=...)


@dataclass(frozen=True)
class Require:
    """A condition over the bindings with the reason shown when it is false (``cond`` and
    ``reason``), or one function giving that reason or None when the condition holds
    (``check``)."""

    cond: Callable[[Bindings], bool] | None = None
    reason: str | Callable[[Bindings], str] = ""
    check: Callable[[Bindings], str | None] | None = None

    def why(self, b: Bindings) -> str | None:
        """None when the condition holds for ``b``, else the reason."""
        if self.check is not None:
            return self.check(b) or None
        if self.cond is None or self.cond(b):
            return None
        return self.reason(b) if callable(self.reason) else self.reason


def require(cond: Callable[[Bindings], bool], reason: str | Callable[[Bindings], str]) -> Require:
    """A predicate for ``Op(..., where=[...])``: ``require(lambda b: b["d"] == 1, "dim is not 1")``.
    ``reason`` may be a function of the bindings for a reason that names values."""
    return Require(cond, reason)


def check(fn: Callable[[Bindings], str | None]) -> Require:
    """A predicate for ``Op(..., where=[...])`` given as one function of the bindings that
    returns why the match fails (a Miss or a string), or None when it holds:
    ``check(lambda b: mutation_miss(b["cat"]))`` reuses a Miss-returning analysis as is."""
    return Require(check=fn)


@dataclass(frozen=True)
class Each(Pat):
    """A list or tuple (of at least ``min_len`` elements) whose every element matches ``pat``."""

    pat: Pat
    min_len: int = 1

    def _match(self, value, b, path):
        if not isinstance(value, (list, tuple)):
            return _fail(path, f"is {_text(value)}, not a list")
        if len(value) < self.min_len:
            return _fail(path, f"has {len(value)} elements, fewer than {self.min_len}")
        for i, v in enumerate(value):
            miss = self.pat._match(v, b, f"{path}[{i}]")
            if miss is not None:
                return miss
        return None

    def describe(self) -> str:
        return f"[{self.pat.describe()}, ...]"


@dataclass(frozen=True)
class Pieces(Pat):
    """Every output of one tuple-producing node, in order: ``[getitem(P, 0), ...,
    getitem(P, n-1)]`` where ``P`` (a split, unbind or chunk) has exactly ``n`` outputs
    (from its ``example_value``) and matches ``producer``. ``name`` binds the list of
    getitem nodes. The getitems are part of the match's site (a rule erases them with
    ``P`` once nothing else uses them)."""

    producer: Pat
    name: str | None = None

    def _match(self, value, b, path):
        if not isinstance(value, (list, tuple)) or not value:
            return _fail(path, f"is {_text(value)}, not a list of pieces")
        parent = _in_order(value)
        if parent is _UNSURE:  # the checks one by one, which say why one fails
            miss = self._order_miss(value, path)
            if miss is not None:
                return miss
            parent = value[0].args[0]
        total = parent.meta.get("example_value") if isinstance(parent, Node) else None
        if not isinstance(total, (list, tuple)):
            return _fail(path, f"producer {_text(parent)} has no tuple example value")
        if len(total) != len(value):
            return _fail(path, f"{len(value)} of {_text(parent)}'s {len(total)} pieces are taken")
        if isinstance(b, Bindings):
            b.add_all(value)
        miss = self.producer._match(parent, b, f"{path}[*]")
        if miss is not None:
            return miss
        if self.name is not None:
            return Var(self.name)._match(list(value), b, path)
        return None

    @staticmethod
    def _order_miss(value: list | tuple, path: str) -> Miss | None:
        """Why ``value`` (a non-empty list) is not ``getitem(P, 0) .. getitem(P, n-1)`` of
        one ``P``: the first entry that is no getitem, else pieces of two producers, else
        the indices out of order; None when it is."""
        bad = next(
            (
                v
                for v in value
                if not (isinstance(v, Node) and v.op == "call_function" and v.target is operator.getitem)
            ),
            None,
        )
        if bad is not None:
            return _fail(path, f"{_text(bad)} is not a getitem of a split/unbind")
        parent = value[0].args[0]
        if any(v.args[0] is not parent for v in value):
            return _fail(path, "pieces come from different producers")
        idx = [v.args[1] for v in value]
        if idx != list(range(len(value))):
            return _fail(path, f"pieces are not taken in order 0..{len(value) - 1} (indices {idx})")
        return None

    def describe(self) -> str:
        return f"pieces({self.producer.describe()})"


_UNSURE = object()  # what _in_order returns when the checks must be made one by one


def _in_order(value: list | tuple) -> Any:
    """``P`` when the non-empty ``value`` is plainly ``[getitem(P, 0), ..., getitem(P,
    n-1)]`` (every entry a getitem call with two arguments, all of one producer, the
    int ``i`` at place ``i``), else ``_UNSURE``: one pass instead of the three of
    :meth:`Pieces._order_miss`, which is asked whenever this is unsure (it accepts what
    this accepts, and says why it refuses)."""
    getitem = operator.getitem
    first = value[0]
    if not (isinstance(first, Node) and first.target is getitem and first.op == "call_function" and first._args):
        return _UNSURE
    parent = first._args[0]
    for i, v in enumerate(value):
        if not (isinstance(v, Node) and v.target is getitem and v.op == "call_function"):
            return _UNSURE
        args = v._args
        if len(args) != 2 or args[0] is not parent or type(args[1]) is not int or args[1] != i:
            return _UNSURE
    return parent


# --------------------------------------------------------------------------- matching


def match(pattern: Pat, node: Node, gm: torch.nn.Module | None = None) -> Bindings | Miss:
    """Match ``pattern`` at ``node``: the bindings (capture name -> value) or a Miss naming
    the first sub-pattern that failed, as a path from the root; the Miss's ``partial``
    lists the nodes matched before the failure (the best partial match, for drawing). ``gm`` resolves
    call_module targets for :class:`Op` patterns over module types."""
    if gm is not None:
        for n in node.graph.nodes:
            if n.op == "call_module":
                _MODULE_OF[n] = gm.get_submodule(n.target)
    try:
        b = Bindings()
        miss = pattern._match(node, b, "")
        if miss is not None:
            miss.partial = list(b.nodes)  # the best partial match: what matched before the failure
            return miss
        return b
    finally:
        _MODULE_OF.clear()


@dataclass
class Rule:
    """A rewrite rule of the declarative form: ``pattern`` (an :class:`Op`) and
    ``replace(rw, **bindings)``, which builds and returns the value that takes the root
    node's place (an existing node from the bindings, or one it creates through the
    :class:`~optimus_lens.core.rewriter.Rewriter` ``rw``: ``rw.call(fn, *args, **kwargs)``, or
    ``rw.create("call_method", name, args, kwargs)``). The root is
    then replaced and erased, and every other matched node nothing uses any more is
    erased. ``name`` and ``description`` are what ``optimus passes`` and the viewer show.

    ``pieces=True``: the root is tuple-valued (a split, an unbind) and ``replace`` returns
    a list of values, ``getitem(root, i)`` replaced by element ``i``; the rule matches only
    where every user of the root is such a getitem with a constant int index (at least
    one)."""

    name: str
    pattern: Op
    replace: Callable[..., Any]
    description: str = ""
    preconditions: tuple[str, ...] = ()
    pieces: bool = False

    @property
    def anchors(self) -> frozenset:
        return self.pattern.anchors


class RulePattern(RewritePattern):
    """A RewritePattern from a declarative :class:`Rule`: ``match`` is :func:`match` (so
    misses name the failed sub-pattern), ``rewrite`` calls
    the rule's ``replace`` with the bindings, replaces the root's uses with its result,
    erases the root and every other matched node left without users. A match whose nodes
    write in place is refused (a replacement would change what the write sees)."""

    def __init__(self, rule: Rule, source: str = "", upstream: str = ""):
        self.rule = rule
        self.name, self.description = rule.name, rule.description or rule.pattern.describe()
        self.preconditions = tuple(rule.preconditions) or (f"matches {rule.pattern.describe()}",)
        self.anchors = rule.anchors
        self.source, self.upstream = source, upstream

    def match(self, node: Node) -> Match | Miss:
        b = match(self.rule.pattern, node)
        if isinstance(b, Miss):
            return b
        nodes = _site(node, b)
        if self.rule.pieces:
            miss = _getitem_users(node)
            if miss is not None:
                return miss
            nodes += [u for u in node.users if u not in nodes]
        writer = next((n for n in nodes if writes_inputs(n)), None)
        if writer is not None:
            return Miss(f"{writer.name} writes in place")
        bound = {k: v for k, v in b.items() if not k.startswith("%")}
        miss = region_miss(nodes) or identity_miss(self.rule.replace, node, bound, self.rule.pieces)
        return miss or Match(node, nodes, {"bindings": b})

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        root = m.anchor
        b = {k: v for k, v in m.info["bindings"].items() if not k.startswith("%")}
        with rw.inserting_before(root):
            new = self.rule.replace(rw, **b)
        if isinstance(new, Miss) or new is None or self.rule.pieces != isinstance(new, (list, tuple)):
            raise ValueError(
                f"rule {self.name} matched {root.name} but its replacement returned {new!r}"
                + (" (a rule with pieces=True returns one value per piece)" if self.rule.pieces else "")
            )
        for old, value in [(g, new[g.args[1]]) for g in list(root.users)] if self.rule.pieces else [(root, new)]:
            if isinstance(value, Node) and value in rw.created:  # a node the rule made stands for the old one
                rw.carry_meta(old, value)
            rw.replace_all_uses(old, value)
        _erase_dead(rw, m.nodes)


def _getitem_users(node: Node) -> Miss | None:
    """A Miss unless every user of the tuple-valued ``node`` is ``getitem(node, i)`` with a
    constant int ``i`` in range (at least one user)."""
    n = len(node.meta.get("example_value") or ())
    if not node.users:
        return Miss(f"{node.name} has no users")
    for u in node.users:
        if not (
            u.op == "call_function"
            and u.target is operator.getitem
            and u.args[0] is node
            and type(u.args[1]) is int
            and -n <= u.args[1] < n
        ):
            return Miss(f"{u.name} uses {node.name} but is not a getitem with a constant index")
    return None


def _site(root: Node, b: Bindings) -> list[Node]:
    """The matched call nodes, root first (placeholders bound by a Var are inputs, not site)."""
    return list(dict.fromkeys([root, *b.nodes]))


def _erase_dead(rw: Rewriter, nodes: list[Node]) -> None:
    """Erase the matched nodes nothing uses any more, users before producers: sweeps of
    ``nodes`` in order, each taking every node whose users are all taken already, until a
    sweep takes none; then one :meth:`Rewriter.erase_each` in that order (the stack, the 128
    getitems and the unbind of an identity are one operation, not 130)."""
    order: list[Node] = []
    gone: set[Node] = set()
    changed = True
    while changed:
        changed = False
        for n in nodes:
            if (
                n not in gone
                and not n._erased
                and n.op not in ("placeholder", "output")
                and all(u in gone for u in n.users)
            ):
                order.append(n)
                gone.add(n)
                changed = True
    rw.erase_each(order)
