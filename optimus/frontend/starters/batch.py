"""A horizontal (batch) pattern, written as a BatchPattern subclass.

``key(node)`` returns a group key (nodes with equal keys may fuse) or a ``Miss`` saying
why the node cannot take part; ``fuse(rw, nodes)`` rewrites one group of independent
nodes that the search found, changing the graph only through the Rewriter ``rw``. ``anchors`` lists the targets worth keying.
"""

import torch

from optimus_lens.core.miss import Miss
from optimus_lens.core.pattern import BatchPattern
from optimus_lens.passes.common import replace_with_getitems


class BatchSigmoid(BatchPattern):
    name = "my_batch_sigmoid"
    description = "Independent sigmoids of one shape become one sigmoid over their stack."
    anchors = frozenset({torch.sigmoid, "sigmoid"})

    def key(self, node):
        v = node.meta.get("example_value")
        if not isinstance(v, torch.Tensor):
            return Miss("no tensor example value")
        return (tuple(v.shape), v.dtype)

    def fuse(self, rw, nodes):
        with rw.inserting_before(nodes[0]):
            stacked = rw.call(torch.stack, [n.args[0] for n in nodes])
            fused = rw.call(torch.sigmoid, stacked)
            pieces = rw.call(torch.unbind, fused)
            replace_with_getitems(rw, nodes, pieces)


PATTERNS = [BatchSigmoid]
