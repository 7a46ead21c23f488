"""The GraphModule's node hooks, registered for one block: the one place the package
listens to FX's own record of graph changes.

``torch.fx.GraphModule`` calls its ``_create_node_hooks`` after a node is created,
its ``_erase_node_hooks`` before a node is erased and its ``_replace_hooks`` before a
use is moved (``Node.replace_all_uses_with`` / ``replace_input_with``), the hooks
``torch.fx.passes.graph_transform_observer`` uses. The upstream observer records
through them (:func:`optimus_lens.core.record.recording`); the Rewriter refuses through
them any change a pattern makes around it (:meth:`optimus_lens.core.rewriter.Rewriter.guarding`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from torch.fx import GraphModule, Node


@contextmanager
def node_hooks(
    gm: GraphModule,
    on_create: Callable[[Node], None],
    on_erase: Callable[[Node], None],
    on_replace: Callable[[Node, str, Node], None],
) -> Iterator[None]:
    """Register the three hooks on ``gm`` for the block: ``on_create(node)`` after a node
    is created, ``on_erase(node)`` before one is erased (its inputs still readable),
    ``on_replace(old=, new=, user=)`` (called with these keywords; ``new`` is a name)
    before ``user``'s use of ``old`` moves to the node named ``new``, or ``old`` is renamed. A hook that raises stops the change before FX makes it. The hooks
    are removed on exit, also when the block raises."""
    gm._register_create_node_hook(on_create)
    gm._register_erase_node_hook(on_erase)
    gm._register_replace_node_hook(on_replace)
    try:
        yield
    finally:
        gm._unregister_create_node_hook(on_create)
        gm._unregister_erase_node_hook(on_erase)
        gm._unregister_replace_node_hook(on_replace)
