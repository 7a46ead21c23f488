"""What a :class:`optimus_lens.core.rewriter.Rewriter` tells about each change it makes
(MLIR's ``RewriterBase::Listener``, mlir/include/mlir/IR/PatternMatch.h), and the layout
check, the listener that fails a step whose replacement changed strides a use depends on."""

from __future__ import annotations

from torch.fx import Node

from optimus_lens.core import meta
from optimus_lens.core import strides as _layout


class Listener:
    """Told of every change a Rewriter makes (MLIR ``RewriterBase::Listener``). Methods
    default to doing nothing; ``rolled_back`` is called after a rollback so a listener
    that buffers the step's changes drops them."""

    def notify_inserted(self, node: Node) -> None:
        pass

    def notify_erased(self, node: Node) -> None:
        """Called before ``node`` is removed (its inputs are still readable)."""

    def notify_replaced(self, old: Node, new: Node, users: list[Node]) -> None:
        """``users`` now read ``new`` where they read ``old``."""

    def notify_modified(self, node: Node, old_inputs: list[Node]) -> None:
        """``node``'s arguments were changed in place; ``old_inputs`` were its input nodes before."""

    def rolled_back(self) -> None:
        pass

    def notify_inserted_each(self, nodes: list[Node]) -> None:
        """Several nodes created as one operation (:meth:`Rewriter.getitems`): the same as
        :meth:`notify_inserted` for each in order, which is what this default does."""
        for n in nodes:
            self.notify_inserted(n)

    def notify_replaced_each(self, moves: list[tuple[Node, Node, list[Node]]]) -> None:
        """Several replacements made as one operation (:meth:`Rewriter.replace_each`): the same
        as :meth:`notify_replaced` for each ``(old, new, users)`` in order, which is what this
        default does; a listener may take the group at once."""
        for old, new, users in moves:
            self.notify_replaced(old, new, users)

    def notify_erased_each(self, nodes: list[Node]) -> None:
        """Several nodes about to be erased, in this order, as one operation
        (:meth:`Rewriter.erase_each`), all still in the graph with their inputs: the same as
        :meth:`notify_erased` for each in order, which is what this default does."""
        for n in nodes:
            self.notify_erased(n)


def swapped_input(node: Node, old_inputs: list[Node]) -> tuple[Node, Node] | None:
    """``(old, new)`` when a change of ``node``'s arguments replaced exactly one input node
    (``old_inputs``) by one other: the move of one use, as a listener records it; else None."""
    now = node.all_input_nodes
    gone = [i for i in old_inputs if i not in now]
    came = [i for i in now if i not in old_inputs]
    return (gone[0], came[0]) if len(gone) == 1 and len(came) == 1 else None


class LayoutCheck(Listener):
    """The engine-level layout check, a Rewriter listener: collects every replacement of
    one step (all uses moved, one use moved, arguments changed in place) and, in
    :meth:`verify`, fails the step with :class:`optimus_lens.core.strides.LayoutError` if the new
    value's strides (from its FakeTensor ``example_value``) differ from the old one's and
    a moved use sees the difference (:func:`optimus_lens.core.strides.broken_use`)."""

    def __init__(self):
        self.moves: list[tuple[Node, Node, list[Node]]] = []

    def notify_replaced(self, old: Node, new: Node, users: list[Node]) -> None:
        self.moves.append((old, new, users))

    def notify_modified(self, node: Node, old_inputs: list[Node]) -> None:
        swap = swapped_input(node, old_inputs)
        if swap is not None:
            self.moves.append((*swap, [node]))

    def rolled_back(self) -> None:
        self.moves = []

    def verify(self, same_strides: dict | None = None) -> None:
        """Raise :class:`~optimus_lens.core.strides.LayoutError` for the first move whose new value
        a moved use would see with other strides. ``same_strides``: the Rewriter's pairs it found
        with equal strides when it made the move (:attr:`Rewriter.same_strides`); one of them is
        not read again while both nodes' arguments and example values are the objects it read
        (then eager mode lays them out as it did: a node's answer to which input it returns is a
        function of those, an erased node's is kept as it was)."""
        same_strides = same_strides or {}
        for old, new, users in self.moves:
            if new._erased:
                continue
            seen = same_strides.get((old, new))
            if seen is not None and _unchanged(old, seen[:3]) and _unchanged(new, seen[3:]):
                continue
            live = [u for u in users if not u._erased and new in u._input_nodes]  # a dict: O(1)
            bad = _layout.broken_use(old, new, live)
            if bad is not None:
                raise _layout.LayoutError(_layout.mismatch_message(old, new, *bad))


def _unchanged(n: Node, seen: tuple) -> bool:
    """Whether ``n``'s eager value is still the one read when ``seen`` = (arguments, example
    value, eager value) was taken: the same example value, and the same arguments (or an erased
    node, whose answer is kept), so the same input returned (if any) with the same value."""
    args, value, eager = seen
    if meta.value(n) is not value or not (n._erased or n._args is args):
        return False
    return eager is value or _layout.value(n) is eager
