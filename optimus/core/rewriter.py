"""The Rewriter: every graph change a pattern makes goes through it (MLIR's
``RewriterBase``, mlir/include/mlir/IR/PatternMatch.h).

A pattern's ``fuse``/``rewrite`` changes the graph only with the Rewriter's operations:
:meth:`Rewriter.create` (:meth:`Rewriter.call`, :meth:`Rewriter.getitems`),
:meth:`Rewriter.replace_all_uses`, :meth:`Rewriter.replace_input`, :meth:`Rewriter.replace_each`
(a fused group's members by its pieces), :meth:`Rewriter.erase` and :meth:`Rewriter.modify`.
Each is told to every :class:`~optimus_lens.core.listener.Listener` (recording, the engine's
indexes and the checks are listeners, not conventions) and written to the step's journal
(:mod:`optimus_lens.core.journal`), so :meth:`Rewriter.rollback` restores exactly the graph
before the step. :meth:`Rewriter.validate` checks what a step left where it changed the graph:
no use of an erased node or of another graph's, no cycle through a changed edge (bounded by
the engine's level numbering), no output node gone. While a step is open the GraphModule's own
create / erase / replace hooks refuse a change made around the Rewriter, so it is rolled back
instead of half-recorded.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx import Graph, GraphModule, Node
from torch.fx.node import map_arg

from optimus_lens.core import aliasing, meta
from optimus_lens.core import strides as _layout
from optimus_lens.core.argscan import nodes_in, scan, swap_in, target_text
from optimus_lens.core.hooks import node_hooks
from optimus_lens.core.index import find_cycle
from optimus_lens.core.journal import MISSING, undo
from optimus_lens.core.listener import LayoutCheck, Listener  # noqa: F401 - published here too


class InvalidGraph(RuntimeError):
    """A step left the graph invalid: a cycle, a use of an erased node, a missing output."""


class SymbolicSize(RuntimeError):
    """A rewrite tried to write a symbolic size (a SymInt read from an ``example_value``)
    into the graph as a constant, which would specialise the graph to the example's shape."""


class DirectMutation(RuntimeError):
    """A pattern changed the graph around the Rewriter (``graph.erase_node``, ``node.replace_all_uses_with`` ...)."""


class Rewriter:
    """The only way a pattern changes ``graph`` (see the module docstring).

    ``listeners`` are told of every change in order. ``level`` (optional, node -> int,
    increasing along every edge before the step) bounds :meth:`validate`'s cycle search.
    """

    def __init__(self, graph: Graph, listeners: Iterable[Listener] = (), level: dict | None = None):
        self.graph = graph
        self.listeners = list(listeners)
        self.level = level
        # the step's changes, newest last; argument tuples and FX's immutable keyword dicts are
        # kept as they are (FX replaces them on a change, never edits them)
        self._journal: list[tuple] = []
        self._users_saved: set[int] = set()
        self._meta_saved: set[tuple[int, str]] = set()
        self.created: list[Node] = []
        self.created_ids: set[int] = set()  # ids of ``created``: a rollback unlinks them, their metas need no journal
        self._first_args: dict[Node, tuple] = {}  # each node's arguments before the step first changed them
        self.changed: dict[Node, None] = {}  # nodes whose inputs this step changed
        self.same_strides: dict[tuple[Node, Node], tuple] = {}  # (old, new) -> what their equal strides were read from
        self.erased: list[Node] = []
        self._inside = 0
        self._guard: Callable | None = None  # the create hook of :meth:`guarding`, while open

    # ---------------------------------------------------------------- insertion point
    def inserting_before(self, node: Node | None = None):
        """Context manager: new nodes go before ``node`` (``Graph.inserting_before``)."""
        return self.graph.inserting_before(node)

    def inserting_after(self, node: Node | None = None):
        """Context manager: new nodes go after ``node`` (``Graph.inserting_after``)."""
        return self.graph.inserting_after(node)

    # ---------------------------------------------------------------- the operations
    def create(
        self,
        op: str,
        target: Any,
        args: tuple = (),
        kwargs: dict | None = None,
        name: str | None = None,
        infer: bool = True,
    ) -> Node:
        """Create a node at the insertion point; with ``infer`` compute its ``example_value``
        from its inputs' (:func:`optimus_lens.core.meta.infer`, which raises if the op rejects their
        shapes). Returns the node. Raises :class:`SymbolicSize` for a SymInt (or SymFloat,
        SymBool) among the arguments: a size read from a dynamic-shape example value must
        not become a constant."""
        args = tuple(args)
        kwargs = dict(kwargs or {})
        inputs: list[Node] = []
        sym = scan((args, kwargs), inputs)
        if sym is not None:
            raise SymbolicSize(
                f"the rewrite would write the symbolic size {sym} into a {target_text(target)} "
                f"node as a constant (the graph would hold for the example's shape only)"
            )
        # no users saved for the inputs: the new node is their last user, and a rollback's unlink
        # removes it from each, which leaves their users in the order they had
        if name is None and isinstance(target, torch._ops.OpOverload):
            name = target._opname  # ``cat``, as AOTAutograd names ATen nodes, not ``cat_default``
        self._inside += 1
        try:
            n = self._new_node(op, target, args, kwargs, name)
        finally:
            self._inside -= 1
        self._journal.append(("create", n))
        self.created.append(n)
        self.created_ids.add(id(n))
        self.changed[n] = None
        aliasing.touch(self.graph, (n,))
        if infer:
            with aliasing.state_before(self.graph, n):  # inside an autocast block: its dtype
                meta.infer(n)
        for lst in self.listeners:
            lst.notify_inserted(n)
        return n

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> Node:
        """``create("call_function", fn, args, kwargs)`` with its example value."""
        return self.create("call_function", fn, args, kwargs)

    def getitems(self, parent: Node, count: int) -> list[Node]:
        """``[parent[0], ..., parent[count - 1]]`` at the insertion point, each as :meth:`call` of
        ``operator.getitem`` makes it (same names, order, example values and notices). Where
        ``parent``'s example value is a tuple or list of at least ``count`` FakeTensors (the unbind or
        split a batch fusion writes), each piece's value is its element (what
        :func:`optimus_lens.core.meta.infer` derives), so the ``count`` nodes are made in one go: the
        per-node upkeep of :meth:`create` (users saved, the global-state replay, the effect analysis
        told) is paid once."""
        pieces = meta.value(parent)
        whole = isinstance(pieces, (tuple, list)) and 0 < count <= len(pieces)
        if not (whole and all(isinstance(pieces[i], FakeTensor) for i in range(count))):
            return [self.call(operator.getitem, parent, i) for i in range(count)]
        key = meta.value_key(parent)
        self._inside += 1
        try:
            # FX would name each from its target ("getitem"), a regex per node: the same name given
            out = [self._new_node("call_function", operator.getitem, (parent, i), {}, "getitem") for i in range(count)]
        finally:
            self._inside -= 1
        for i, n in enumerate(out):
            self._journal.append(("create", n))
            self.changed[n] = None
            n.meta[key] = pieces[i]
        self.created.extend(out)
        self.created_ids.update(map(id, out))
        aliasing.touch_pieces(self.graph, out)
        for lst in self.listeners:
            lst.notify_inserted_each(out)
        return out

    def _new_node(self, op: str, target: Any, args: tuple, kwargs: dict, name: str | None) -> Node:
        """``Graph.create_node``; with no keyword arguments and no create hook but the guard's, the arguments
        are set on the made node by FX's core of the ``args`` setter (what ``Node.__init__`` calls), so FX skips
        its walk for raw SymInts (:meth:`create` refuses them) and the setter's re-filing of the node in the
        graph's (op, target) table (~3 us a getitem)."""
        hooks = getattr(self.graph.owning_module, "_create_node_hooks", None)
        if kwargs or not args or hooks and any(h is not self._guard for h in hooks):
            return self.graph.create_node(op, target, args, kwargs, name)
        n = self.graph.create_node(op, target, None, None, name)
        n._update_args_kwargs(args, n._kwargs)
        return n

    def replace_all_uses(self, old: Node, new: Node, keep_layout: bool = True) -> Node:
        """Point every user of ``old`` at ``new`` (``old`` itself stays; erase it after).
        Downstream nodes whose strides change with it get their ``example_value`` updated.

        With ``keep_layout``, uses that would see other strides (:func:`optimus_lens.core.strides.broken_use`:
        a ``.view``, ``as_strided``, graph output ... reached from ``old``) get a copy of
        ``new`` laid out as ``old`` (``contiguous()``, or ``permute`` + ``contiguous`` +
        ``permute`` back for a dense transposed layout); when ``old`` is not dense no copy
        can, and :class:`optimus_lens.core.strides.LayoutError` names the user and both layouts.
        Returns the node the sensitive uses now read (``new`` when none)."""
        users = list(old.users)
        if not users:
            return new
        if not keep_layout:
            self._rewire(old, new, users)
            return new
        updates: list = []
        need = _layout.broken_use(old, new, users, updates=updates)
        if need is None:
            self._rewire(old, new, users)
            self._refresh(updates)
            return new
        copy = self._copy_as(old, new)
        if copy is None or _layout.broken_use(old, copy, users) is not None:
            raise _layout.LayoutError(_layout.mismatch_message(old, new, *need))
        sensitive = [u for u in users if _layout.broken_use(old, new, [u]) is not None]
        self._rewire(old, copy, sensitive)
        rest = [u for u in users if u not in sensitive]
        if rest:
            updates = []
            _layout.broken_use(old, new, rest, updates=updates)
            self._rewire(old, new, rest)
            self._refresh(updates)
        return copy

    def replace_each(self, olds: list[Node], news: list[Node]) -> None:
        """For each ``i``: ``news[i]`` takes ``olds[i]``'s source location and module path
        (:meth:`carry_meta`), every use of ``olds[i]`` moves to ``news[i]``
        (:meth:`replace_all_uses`, layouts kept the same way); then every ``olds[i]`` is
        erased. One operation for the ``k`` members of a fused group and the ``k`` pieces
        of its result: the graph, the journal and what the listeners learn are those of the
        ``k`` single operations in this order, told as one group each
        (:meth:`Listener.notify_replaced_each`, :meth:`Listener.notify_erased_each`), so a
        listener may do its upkeep once per group. Raises RuntimeError if an old node keeps
        a use (one of ``olds`` reads another) and what :meth:`replace_all_uses` raises."""
        if len(olds) != len(news):
            raise ValueError(f"replace_each: {len(olds)} nodes to replace, {len(news)} replacements")
        moves: list[tuple[Node, Node, list[Node]]] = []
        for old, new in zip(olds, news):
            self.carry_meta(old, new)
            users = list(old.users)
            if not users:
                continue
            if self._same_strides(old, new):  # no use can see a difference (broken_use's first test)
                moves.append((old, new, users))
                continue
            updates: list = []
            if _layout.broken_use(old, new, users, updates=updates) is not None or updates:
                self._flush_moves(moves)  # this one needs copies or new example values downstream
                self.replace_all_uses(old, new)
                continue
            moves.append((old, new, users))
        self._flush_moves(moves)
        self.erase_each(olds)

    def _same_strides(self, old: Node, new: Node) -> bool:
        """Whether ``old`` and ``new`` have equal static strides as eager mode lays them out;
        if so the pair is kept in ``same_strides`` with what that was read from (each node's
        arguments and example value), so the step's final layout check
        (:class:`~optimus_lens.core.listener.LayoutCheck`) need not read it again while those
        are the same objects."""
        vo, vn = _layout.value(old), _layout.value(new)
        if not _layout.same_static_strides(vo, vn):
            return False
        self.same_strides[(old, new)] = (old._args, meta.value(old), vo, new._args, meta.value(new), vn)
        return True

    def _flush_moves(self, moves: list[tuple[Node, Node, list[Node]]]) -> None:
        """Rewire every ``(old, new, users)`` of ``moves`` (as :meth:`_rewire` would, one move after
        the other; journaled as one entry) and tell the listeners once; empties ``moves``.

        A user that takes several of the replacements (the next layer's ``stack`` of all ``k``
        members) has its arguments rewritten once with all of them, not once per member (FX
        rebuilds a node's arguments and its inputs' users on each replacement: ``k`` times a
        ``k``-long list). That is the graph the moves make one after the other, users order
        included: each replacement re-adds its user as the last user of every input it reads,
        so the users are rewritten in the order of their last replacement (no new node is an
        old one here: ``replace_each`` replaces members by new pieces)."""
        if not moves:
            return
        saved = self._users_saved
        journal = self._journal
        swaps: dict[Node, dict[Node, Node]] = {}  # user -> {old: new}, in order of its last move
        everyone: list[Node] = []
        for old, new, users in moves:
            for n in (old, new):
                if id(n) not in saved:
                    saved.add(id(n))
                    journal.append(("users", n, list(n.users)))
            for u in users:
                swap = swaps.pop(u, None) or {}
                swap[old] = new
                swaps[u] = swap
            everyone.extend(users)
        journal.append(("args-each", [(u, u.args, u.kwargs) for u in swaps]))
        first, changed = self._first_args, self.changed
        replace = self._replace_input
        at_once = replace is not Node.replace_input_with  # no foreign replace hook to call per move
        self._inside += 1
        try:
            for u, swap in swaps.items():
                first.setdefault(u, u.args)
                if at_once and len(swap) > 1:
                    u._update_args_kwargs(map_arg(u._args, swap_in(swap)), map_arg(u._kwargs, swap_in(swap)))
                else:
                    for old, new in swap.items():
                        replace(u, old, new)
                changed[u] = None
        finally:
            self._inside -= 1
        aliasing.touch(self.graph, everyone)
        group = list(moves)
        moves.clear()
        for lst in self.listeners:
            lst.notify_replaced_each(group)

    @property
    def _replace_input(self) -> Callable[[Node, Node, Node], None]:
        """``Node.replace_input_with`` as a function of (user, old, new), or FX's core of it (what it
        calls after the GraphModule's replace hooks) where the only hook is this step's guard."""
        hooks = getattr(self.graph.owning_module, "_replace_hooks", None)
        core = getattr(Node, "_replace_input_with", None)
        if core is None or hooks and any(h is not self._guard for h in hooks):
            return Node.replace_input_with
        return core

    def erase_each(self, nodes: list[Node]) -> None:
        """:meth:`erase` of each of ``nodes`` in order (one already erased is passed over), as
        one operation: the listeners are told of all of them first
        (:meth:`Listener.notify_erased_each`, their inputs still readable), then each is erased,
        journaled as :meth:`erase` journals it. Raises RuntimeError, before any change, if a node
        has a user that is not erased before it (a user must come earlier in ``nodes``)."""
        nodes = [n for n in dict.fromkeys(nodes) if not n._erased]
        gone: set[Node] = set()
        for n in nodes:
            if n.users and any(u not in gone for u in n.users):
                kept = [u.name for u in n.users if u not in gone]
                raise RuntimeError(f"cannot erase {n.name}: it still has users {kept}")
            gone.add(n)
        saved = self._users_saved
        journal = self._journal
        for n in nodes:
            for i in n._input_nodes:  # as erase: an input with one user needs no saved order
                if id(i) not in saved and len(i.users) > 1:
                    saved.add(id(i))
                    journal.append(("users", i, list(i.users)))
        for lst in self.listeners:
            lst.notify_erased_each(nodes)
        changed = self.changed
        erase = self.graph.erase_node
        self._inside += 1
        try:
            for n in nodes:
                journal.append(("erase", n, n._prev, n._args, n._kwargs))  # what n.prev, .args, .kwargs read
                erase(n)
                changed.pop(n, None)
        finally:
            self._inside -= 1
        self.erased.extend(nodes)
        aliasing.touch(self.graph, nodes)

    def _refresh(self, updates: list) -> None:
        """Store the example values (FakeTensors) that a replacement changed downstream,
        so later steps read the strides the graph now computes."""
        for node, value in updates:
            self.set_meta(node, meta.value_key(node), value)

    def _copy_as(self, old: Node, new: Node) -> Node | None:
        """A copy of ``new`` with ``old``'s (dense) strides, created right after ``new``; None
        when ``old`` is not dense or its stride order is symbolic."""
        if not _layout.is_dense(old):
            return None
        order = _layout.stride_order(old)
        if order is None:
            return None
        with self.inserting_after(new):
            if order == sorted(order):
                c = self.create("call_method", "contiguous", (new,))
            else:
                inverse = sorted(range(len(order)), key=order.__getitem__)
                p = self.call(torch.permute, new, order)
                with self.inserting_after(p):
                    q = self.create("call_method", "contiguous", (p,))
                with self.inserting_after(q):
                    c = self.call(torch.permute, q, inverse)
        self.carry_meta(old, c)
        return c

    def replace_input(self, user: Node, old: Node, new: Node) -> None:
        """Point ``user``'s uses of ``old`` at ``new`` (``Node.replace_input_with``)."""
        self._rewire(old, new, [user])

    def modify(self, node: Node, args: tuple | None = None, kwargs: dict | None = None) -> None:
        """Change ``node``'s arguments in place (MLIR ``modifyOpInPlace``). None keeps one as it is."""
        old_inputs = list(node.all_input_nodes)
        self._journal.append(("args", node, node.args, node.kwargs))
        self._first_args.setdefault(node, node.args)
        new_args = node.args if args is None else tuple(args)
        new_kwargs = dict(node.kwargs) if kwargs is None else dict(kwargs)
        for i in {*old_inputs, *nodes_in((new_args, new_kwargs))}:
            self._save_users(i)
        node.args, node.kwargs = new_args, new_kwargs
        self.changed[node] = None
        aliasing.touch(self.graph, (node,))
        for lst in self.listeners:
            lst.notify_modified(node, old_inputs)

    def erase(self, node: Node) -> None:
        """Remove ``node`` from the graph. Raises RuntimeError if it still has users."""
        if node.users:
            raise RuntimeError(f"cannot erase {node.name}: it still has users {[u.name for u in node.users]}")
        if node._erased:
            return
        for i in node._input_nodes:  # FX's dict of inputs; an input it is the only user of needs no
            if len(i.users) > 1:  # saved order: the undo relinks it as that input's one user again
                self._save_users(i)
        for lst in self.listeners:
            lst.notify_erased(node)
        self._journal.append(("erase", node, node.prev, node.args, node.kwargs))
        self._inside += 1
        try:
            self.graph.erase_node(node)
        finally:
            self._inside -= 1
        self.erased.append(node)
        self.changed.pop(node, None)
        aliasing.touch(self.graph, (node,))

    def erase_if_unused(self, nodes: Iterable[Node]) -> None:
        """Erase each of ``nodes`` (in order) that is still alive and has no users."""
        for n in nodes:
            if not n._erased and not n.users:
                self.erase(n)

    def set_meta(self, node: Node, key: str, value: Any) -> None:
        """``node.meta[key] = value``, journaled (a rollback restores the old entry)."""
        self._save_meta(node, key)
        node.meta[key] = value
        aliasing.touch(self.graph, (node,))

    def _save_meta(self, node: Node, key: str) -> None:
        if (id(node), key) not in self._meta_saved:
            self._meta_saved.add((id(node), key))
            self._journal.append(("meta", node, key, node.meta.get(key, MISSING)))

    def carry_meta(self, old: Node, new: Node) -> None:
        """Give ``new`` the source location and module path of the node it replaces (where it
        has none), and in an ATen graph its provenance: AOTAutograd's ``seq_nr`` and FX's
        ``from_node``."""
        om, nm = old.meta, new.meta
        fresh = id(new) in self.created_ids  # a node of this step: its metas go with it on a rollback, and
        for k in [k for k in CARRIED_META if k in om and k not in nm]:  # no analysis reads these keys
            if not fresh:
                self._save_meta(new, k)
            nm[k] = om[k]

    def original_args(self, node: Node) -> tuple | None:
        """``node``'s arguments (``args``) before this step changed them, or None when the
        step did not change them."""
        return self._first_args.get(node)

    # ---------------------------------------------------------------- internals
    def _rewire(self, old: Node, new: Node, users: list[Node]) -> None:
        self._save_users(old)
        self._save_users(new)
        self._inside += 1
        try:
            for u in users:
                self._journal.append(("args", u, u.args, u.kwargs))
                self._first_args.setdefault(u, u.args)
                u.replace_input_with(old, new)
                self.changed[u] = None
        finally:
            self._inside -= 1
        aliasing.touch(self.graph, users)
        for lst in self.listeners:
            lst.notify_replaced(old, new, users)

    def _save_users(self, n: Node) -> None:
        if id(n) not in self._users_saved:
            self._users_saved.add(id(n))
            self._journal.append(("users", n, list(n.users)))

    # ---------------------------------------------------------------- step scope
    @contextmanager
    def guarding(self, gm: GraphModule) -> Iterator[Rewriter]:
        """While open, ``gm``'s create / erase / replace hooks raise :class:`DirectMutation`
        for a change that does not come from this Rewriter (before FX applies it, so
        nothing is half done)."""

        def guard(*_: object, **__: object) -> None:
            if not self._inside:
                raise DirectMutation("the pattern changed the graph without the Rewriter")

        self._guard = guard
        try:
            with node_hooks(gm, guard, guard, guard):
                yield self
        finally:
            self._guard = None  # no cycle through the closure: the step's Rewriter is freed at once

    @contextmanager
    def adopting(self, gm: GraphModule, keep_meta: Iterable[Node] = ()) -> Iterator[Rewriter]:
        """While open, changes that code other than a pattern of ours makes directly to
        ``gm``'s graph (Inductor's ``PatternEntry.apply``: ``graph.call_function``,
        ``Node.replace_all_uses_with``, ``graph.erase_node``) count as this Rewriter's own:
        read from the GraphModule's node hooks, journaled for :meth:`rollback`, told to the
        listeners (an erase before FX clears the node's arguments, so its inputs are still
        read) and allowed by :meth:`guarding`. Created nodes that have no example value
        when the block ends get one (:func:`optimus_lens.core.meta.infer`). ``keep_meta``: nodes
        whose whole ``meta`` a rollback restores (the foreign code may tag them). A change
        FX has no hook for (assigning ``node.args``) is not seen."""
        for n in keep_meta:
            self._journal.append(("meta-all", n, dict(n.meta)))
        mine: list[Node] = []

        def on_create(n: Node) -> None:
            self._journal.append(("create", n))
            self.created.append(n)
            self.created_ids.add(id(n))
            mine.append(n)
            self.changed[n] = None
            aliasing.touch(self.graph, (n,))
            for lst in self.listeners:
                lst.notify_inserted(n)

        def on_erase(n: Node) -> None:
            for i in n.all_input_nodes:
                self._save_users(i)
            for lst in self.listeners:
                lst.notify_erased(n)
            self._journal.append(("erase", n, n.prev, n.args, n.kwargs))
            self.erased.append(n)
            self.changed.pop(n, None)
            aliasing.touch(self.graph, (n,))

        def on_replace(old: Node, new: str, user: Node) -> None:
            target = next((c for c in reversed(mine) if c.name == new), None) or next(
                (c for c in self.graph.nodes if c.name == new and c is not old), None
            )
            if target is None:  # a rename, not a use moved
                return
            self._save_users(old)
            self._save_users(target)
            self._journal.append(("args", user, user.args, user.kwargs))
            self._first_args.setdefault(user, user.args)
            self.changed[user] = None
            aliasing.touch(self.graph, (user,))
            for lst in self.listeners:
                lst.notify_replaced(old, target, [user])

        self._inside += 1
        try:
            with node_hooks(gm, on_create, on_erase, on_replace):
                yield self
        finally:
            self._inside -= 1
        for n in mine:
            if not n._erased and meta.value(n) is None and n.op == "call_function":
                with aliasing.state_before(self.graph, n):
                    meta.infer(n)

    def validate(self) -> None:
        """Raise :class:`InvalidGraph` if the step left a use of an erased node (or of a
        node of another graph), a cycle through a node whose inputs it changed, or no
        output node. O(nodes the step changed and the ancestors between them)."""
        g = self.graph
        changed = [n for n in self.changed if not n._erased]
        for n in changed:
            for i in n._input_nodes:
                if i._erased or i.graph is not g:
                    raise InvalidGraph(f"{n.name} uses {i.name}, which is not in the graph")
        if any(n.op == "output" for n in self.erased):
            raise InvalidGraph("the output node was erased")
        cycle = find_cycle(changed, self.level)
        if cycle:
            raise InvalidGraph("cycle: " + " -> ".join(c.name for c in cycle))

    def rollback(self) -> None:
        """Undo every change of the step, newest first (:func:`optimus_lens.core.journal.undo`),
        then tell the listeners."""
        undo(self.graph, self._journal)
        self._journal.clear()
        self._first_args.clear()
        for lst in self.listeners:
            lst.rolled_back()


#: the metas :meth:`Rewriter.carry_meta` gives a replacement
CARRIED_META = ("stack_trace", "nn_module_stack", "seq_nr", "from_node")
