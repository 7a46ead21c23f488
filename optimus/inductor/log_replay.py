"""Does our replay of upstream's pre-grad passes reproduce what the logged compile did?

A compile log holds, per compile, the graph Inductor's ``pre_grad_passes`` received
(``before_pre_grad_graph``), the graph they returned (``after_pre_grad_graph``) and the
Inductor config they ran under (``compilation_metrics``' ``inductor_config``:
``pre_grad_fusion_options``). :func:`optimus_lens.inductor.observe.observe` on the
logged graph with the logged options replays those passes here, step by step;
:func:`check_replay` then matches the replay's final graph against the logged one node
for node (:func:`optimus_lens.core.graphmatch.match_nodes`: equal op, target and
arguments down to the inputs, names aside). A difference means this torch's passes are
not the logged run's (another version, config or custom pass), or the log's graph was
not read back as it ran.
"""

from __future__ import annotations

from dataclasses import dataclass

from optimus_lens.core.graphmatch import NodeMatch, match_nodes
from optimus_lens.core.record import snapshot_graph
from optimus_lens.core.trace import GraphSnapshot, Trace
from optimus_lens.frontend.compile_log import CompileLog, read_log
from optimus_lens.frontend.readable import graph_from_code

AFTER = "after_pre_grad_graph"
BEFORE = "before_pre_grad_graph"


def logged_options(info: dict | None) -> dict | None:
    """The ``pre_grad_fusion_options`` of the logged compile a loaded graph came from
    (``info``: ``Captured.log``, ``Trace.capture["log"]``); None when the graph is not from
    a log or the log records no Inductor config for its compile."""
    if not info:
        return None
    return read_log(info["path"]).pre_grad_options(info["compile_id"])


def _logged_graph(log: CompileLog, compile_id: str, artifact: str) -> GraphSnapshot | None:
    e = log.entry(compile_id, artifact)
    return None if e is None else snapshot_graph(graph_from_code(e.code).graph)


@dataclass
class ReplayCheck:
    """Our replay's final graph (``a`` in ``match``) against the log's
    ``after_pre_grad_graph`` (``b``) of compile ``compile_id``; ``options`` the
    ``pre_grad_fusion_options`` the replay ran with, ``logged_options`` the log's;
    ``start_differs``: the replay started from a graph that is not the log's
    ``before_pre_grad_graph`` node for node."""

    compile_id: str
    match: NodeMatch
    ours: int
    logged: int
    options: dict
    logged_options: dict | None
    start_differs: bool = False

    @property
    def reproduced(self) -> bool:
        """Node for node the same graph."""
        return self.match.identical

    def differing(self) -> tuple[list[str], list[str]]:
        """(the logged nodes, the replay's nodes) that are not the same computation as a
        node of the other graph: unpaired, or paired only by name or provenance."""
        loose = [a for a, h in self.match.how.items() if h != "structure"]
        return (
            self.match.only_b + [self.match.pairs[a] for a in loose],
            self.match.only_a + loose,
        )

    def text(self) -> str:
        """One paragraph for the CLI and the app."""
        head = f"the log's {AFTER} of compile {self.compile_id} ({self.logged} nodes)"
        if self.reproduced:
            out = f"our replay of upstream's pre-grad passes reproduces {head} node for node"
        else:
            logged, ours = self.differing()
            out = (
                f"our replay of upstream's pre-grad passes does NOT reproduce {head}: {len(logged)} logged node(s) "
                f"differ from the replay ({_names(logged)}), {len(ours)} of the replay's {self.ours} from the log "
                f"({_names(ours)})"
            )
        if self.logged_options is not None and self.options != self.logged_options:
            out += f"; the replay ran with other pre_grad_fusion_options than the log's ({self.logged_options})"
        if self.start_differs:
            out += f"; it started from a graph other than the log's {BEFORE}"
        return out


def _names(names: list[str], limit: int = 6) -> str:
    return ", ".join(names[:limit]) + (f", ... {len(names) - limit} more" if len(names) > limit else "") or "none"


def check_replay(trace: Trace, info: dict | None = None) -> ReplayCheck | None:
    """Match the final graph of ``trace`` (an :func:`optimus_lens.inductor.observe.observe`
    run on a graph read from a log) against the log's ``after_pre_grad_graph`` of the
    same compile. ``info`` defaults to ``trace.capture["log"]``. None when the trace is
    not of a logged graph or the log holds no ``after_pre_grad_graph`` for it. Raises
    :class:`optimus_lens.frontend.compile_log.LogError` when the log is gone."""
    info = info or trace.capture.get("log")
    if not info:
        return None
    log = read_log(info["path"])
    cid = info["compile_id"]
    logged = _logged_graph(log, cid, AFTER)
    if logged is None:
        return None
    before = _logged_graph(log, cid, BEFORE)
    start_differs = before is not None and not match_nodes(trace.initial_graph, before).identical
    final = trace.graph_at(len(trace.steps))
    return ReplayCheck(
        cid,
        match_nodes(final, logged),
        len(final),
        len(logged),
        dict(trace.capture.get("options") or {}),
        log.pre_grad_options(cid),
        start_differs,
    )
