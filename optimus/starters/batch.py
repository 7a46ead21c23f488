"""A horizontal (batch) pattern, written as a BatchPattern subclass.

``key(node)`` returns a group key (nodes with equal keys may fuse) or a ``Miss`` saying
why the node cannot take part; ``fuse(graph, nodes)`` rewrites one group of independent
nodes that the greedy search found. ``anchors`` lists the targets worth keying.
"""

import torch

from optimus.passes.common import call, replace_with_getitems
from optimus.pattern import BatchPattern, Miss


class BatchSigmoid(BatchPattern):
    name = "my_batch_sigmoid"
    description = "Independent sigmoids of one shape become one sigmoid over their stack."
    anchors = frozenset({torch.sigmoid, "sigmoid"})

    def key(self, node):
        v = node.meta.get("example_value")
        if not isinstance(v, torch.Tensor):
            return Miss("no tensor example value")
        return (tuple(v.shape), v.dtype)

    def fuse(self, graph, nodes):
        with graph.inserting_before(nodes[0]):
            stacked = call(graph, torch.stack, [n.args[0] for n in nodes])
            fused = call(graph, torch.sigmoid, stacked)
            pieces = call(graph, torch.unbind, fused)
        replace_with_getitems(graph, nodes, pieces)


PATTERNS = [BatchSigmoid]
