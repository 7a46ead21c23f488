"""The Trace data model: an initial GraphSnapshot plus one delta per applied Step.

Everything here is plain data (str, int, float, list, dict): no torch objects, so a
trace saved by the CLI opens in the app, and any step's before/after graph is rebuilt
by replaying deltas from the initial snapshot (or from the nearest in-memory
checkpoint), keeping the trace O(graph + changes) instead of O(graph x steps).

JSON layout (``format_version`` 1)::

    {"format_version": 1, "model": str, "graph": "pre-grad", "nodes_before": int, "nodes_after": int,
     "passes": [{"name", "enabled", "patterns": [...], "options": {...}}],
     "capture": {...}, "initial_graph": {"nodes": [NodeRecord...]},
     "steps": [{"index", "graph", "pass", "pattern", "sites", "created", "erased", "replaced",
                "delta": {"upsert": [NodeRecord...], "remove": [name...]},
                "match_s", "rewrite_s", "nodes_after", "verify": {...} | null,
                "info": {...} (optional: pattern-specific figures, e.g. bytes_packed),
                "error": {...} (only on a rolled-back step)}],
     "graphs": [{"graph": "forward" | "backward", "initial_graph": ..., "steps": [...], ...}]}

One run, several graphs: the pre-grad (Dynamo) graph's steps are the top-level ``steps``;
the ATen graphs Inductor's post-grad passes see (``forward``, and ``backward`` in
training) are in ``graphs``, each a trace of its own (its own initial graph, passes,
steps numbered from 1, verification), laid out as above. Every step names its graph
(``graph``). A trace written before graphs existed has no ``graphs`` and no ``graph``
fields and loads as a pre-grad trace.

A NodeRecord is written as ``{"name", "op", "target", "args", "kwargs", "inputs",
"shape", "dtype", "module", "module_type", "source", "stride", "device", "seq_nr",
"from_node", "after", "effects", "target_module"}`` less the fields at their default
(empty or null) and less ``inputs`` where it follows from ``args``/``kwargs``
(:meth:`NodeRecord.to_json`); readers accept records with or without them. A step's
delta holds only the nodes the step created or rewired.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FORMAT_VERSION = 1
CHECKPOINT_SHARE = 4  # see Trace.graph_at
#: the graphs of a run: the Dynamo graph the pre-grad passes rewrite, and the ATen graphs
#: (AOTAutograd's forward and backward) Inductor's post-grad passes rewrite
PRE_GRAD, FORWARD, BACKWARD = "pre-grad", "forward", "backward"
GRAPHS = (PRE_GRAD, FORWARD, BACKWARD)


class TraceFormatError(ValueError):
    """A trace file that is not valid JSON, or not a trace of a supported format version."""


# --------------------------------------------------------------------------- nodes


#: the NodeRecord fields a record writes only when set
_WRITTEN_WHEN_SET = "shape dtype module module_type source stride device seq_nr from_node after target_module".split()


@dataclass(slots=True)
class NodeRecord:
    """One FX node as plain data.

    ``args``/``kwargs`` keep the node's arguments with node references written as
    ``{"node": name}``; ``inputs`` lists the referenced node names in argument order
    (the graph's edges). ``shape`` is the output shape (``list[int]``), or a list of
    shapes for tuple outputs such as split/unbind; symbolic sizes are strings.
    ``module`` is the ``nn_module_stack`` path that created the node and ``source``
    the user's code line (``file.py:12: code``) from ``stack_trace``. ``stride`` is
    the output's strides in elements, shaped like ``shape`` (None in traces written
    before it was recorded). ``device`` is the output's device (``"cpu"``,
    ``"cuda:0"``; the first output's for a tuple; None in traces written before it was
    recorded, and for non-tensor outputs). ATen nodes (the post-grad graphs) also carry
    AOTAutograd's ``seq_nr`` (the autograd node a forward op and the backward ops of its
    gradient share; None where the node has none) and ``from_node``, the names of the
    pre-grad nodes it came from (the roots of its ``meta["from_node"]`` chain, or None).

    Program order, where it matters: ``effects`` is True for a node with side effects (an
    in-place write, a custom op that mutates its arguments, ``_set_grad_enabled``, autocast
    enter/exit: :func:`optimus_lens.core.record.has_side_effects`), and ``after`` names
    the latest such node before this one in the live graph (None before the first). A
    graph rebuilt from records (:func:`optimus_lens.debug.rebuild.graph_order`) keeps
    every node between the same two nodes with side effects, so reads and writes stay in
    the order that ran. ``target_module`` names the module that registers a custom op
    target (``torch.ops.ns.name``), for a rebuild to import.
    """

    name: str
    op: str
    target: str
    args: list = field(default_factory=list)
    kwargs: dict = field(default_factory=dict)
    inputs: list[str] = field(default_factory=list)
    shape: list | None = None
    dtype: str | None = None
    module: str | None = None
    module_type: str | None = None
    source: str | None = None
    stride: list | None = None
    device: str | None = None
    seq_nr: int | None = None
    from_node: list[str] | None = None
    after: str | None = None
    effects: bool = False
    target_module: str | None = None

    def to_json(self) -> dict:
        """Compact JSON form: fields at their default (empty args/kwargs, None shape,
        dtype, module, source) are left out, and so is ``inputs`` when it is what
        :func:`refs_in` derives from ``args`` and ``kwargs`` (always, for records built by
        :func:`optimus_lens.core.record.node_record`). :meth:`from_json` restores both."""
        d: dict[str, Any] = {"name": self.name, "op": self.op, "target": self.target}
        if self.args:
            d["args"] = self.args
        if self.kwargs:
            d["kwargs"] = self.kwargs
        if self.inputs and self.inputs != refs_in(self.args, self.kwargs):
            d["inputs"] = self.inputs
        for k in _WRITTEN_WHEN_SET:
            v = getattr(self, k)
            if v is not None:
                d[k] = v
        if self.effects:
            d["effects"] = True
        return d

    @classmethod
    def from_json(cls, d: dict) -> NodeRecord:
        """Inverse of :meth:`to_json`; also reads records written with every field."""
        args, kwargs = d.get("args", []), d.get("kwargs", {})
        inputs = d.get("inputs")
        return cls(
            d["name"],
            d["op"],
            d["target"],
            args,
            kwargs,
            refs_in(args, kwargs) if inputs is None else inputs,
            d.get("shape"),
            d.get("dtype"),
            d.get("module"),
            d.get("module_type"),
            d.get("source"),
            d.get("stride"),
            d.get("device"),
            d.get("seq_nr"),
            d.get("from_node"),
            d.get("after"),
            bool(d.get("effects", False)),
            d.get("target_module"),
        )

    @property
    def short_target(self) -> str:
        """The last dotted component of the target (``torch._C._nn.linear`` -> ``linear``)."""
        return self.target.rsplit(".", 1)[-1]

    def args_text(self, limit: int = 60) -> str:
        """The arguments as Python-like text, node references by name, cut to ``limit`` chars."""
        parts = [arg_text(a) for a in self.args] + [f"{k}={arg_text(v)}" for k, v in self.kwargs.items()]
        text = ", ".join(parts)
        return text if len(text) <= limit else text[: limit - 1] + "…"


def refs_in(args: Any, kwargs: Any = None) -> list[str]:
    """Names referenced as ``{"node": name}`` in ``args`` then ``kwargs``, first occurrence
    order, no repeats: a node's inputs, as FX's ``all_input_nodes`` lists them."""
    out: dict[str, None] = {}

    def walk(a: Any) -> None:
        if isinstance(a, dict):
            if len(a) == 1 and isinstance(a.get("node"), str):
                out[a["node"]] = None
                return
            for v in a.values():
                walk(v)
        elif isinstance(a, list):
            for v in a:
                walk(v)

    walk(args)
    if kwargs:
        walk(kwargs)
    return list(out)


def arg_text(a: Any) -> str:
    """One argument as Python-like text: node references by name, slices as ``a:b:c``,
    lists and dicts element by element (never cut)."""
    if isinstance(a, dict):
        if "node" in a and len(a) == 1:
            return a["node"]
        if "slice" in a and len(a) == 1:
            s = a["slice"]
            return ":".join("" if v is None else str(v) for v in s)
        return "{" + ", ".join(f"{k}: {arg_text(v)}" for k, v in a.items()) + "}"
    if isinstance(a, list):
        return "[" + ", ".join(arg_text(v) for v in a) + "]"
    return str(a)


# --------------------------------------------------------------------------- snapshot


class GraphSnapshot:
    """An FX graph as plain data: ``nodes`` maps name -> NodeRecord in graph order.

    Built from a live ``torch.fx.Graph`` by :func:`optimus_lens.core.record.snapshot_graph`
    (this module stays free of torch). Edges are derived from each record's ``inputs``.
    """

    def __init__(self, nodes: Iterable[NodeRecord] = ()):
        self.nodes: dict[str, NodeRecord] = {n.name: n for n in nodes}

    def __len__(self) -> int:
        return len(self.nodes)

    def copy(self) -> GraphSnapshot:
        s = GraphSnapshot()
        s.nodes = dict(self.nodes)  # records are never mutated in place, so sharing them is safe
        return s

    def edges(self) -> list[tuple[str, str]]:
        """(producer, consumer) pairs, one per distinct input reference."""
        out = []
        for rec in self.nodes.values():
            for src in dict.fromkeys(rec.inputs):
                out.append((src, rec.name))
        return out

    def users(self) -> dict[str, list[str]]:
        """name -> the names of the nodes that consume it."""
        users: dict[str, list[str]] = {n: [] for n in self.nodes}
        for rec in self.nodes.values():
            for src in dict.fromkeys(rec.inputs):
                users.setdefault(src, []).append(rec.name)
        return users

    def apply(self, delta: Delta) -> None:
        """Replay one step's delta in place: drop removed nodes, insert or replace upserted ones."""
        for name in delta.remove:
            self.nodes.pop(name, None)
        for rec in delta.upsert:
            self.nodes[rec.name] = rec

    def signature(self) -> dict[str, tuple]:
        """name -> (op, target, inputs, shape, dtype): what two equal graphs must share."""
        return {n: (r.op, r.target, tuple(r.inputs), json.dumps(r.shape), r.dtype) for n, r in self.nodes.items()}

    def to_json(self) -> dict:
        return {"nodes": [r.to_json() for r in self.nodes.values()]}

    @classmethod
    def from_json(cls, data: dict) -> GraphSnapshot:
        return cls(NodeRecord.from_json(r) for r in data["nodes"])


@dataclass
class Delta:
    """What one step changed: records of nodes created or rewired (``upsert``) and
    the names of erased nodes (``remove``). Applying it to the step's before-graph
    gives its after-graph."""

    upsert: list[NodeRecord] = field(default_factory=list)
    remove: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"upsert": [r.to_json() for r in self.upsert], "remove": list(self.remove)}

    @classmethod
    def from_json(cls, data: dict) -> Delta:
        return cls([NodeRecord.from_json(r) for r in data["upsert"]], list(data["remove"]))


# --------------------------------------------------------------------------- steps


@dataclass
class VerifyResult:
    """Outcome of checking a graph against the original model.

    ``ok`` is None when nothing was checked. ``max_abs_err``/``max_rel_err`` are over
    all outputs (and gradients when ``checked`` says so); ``checked`` names what was
    compared: "outputs", "outputs+grads", "lint", "layout" (same values, other output
    strides), "second-shape" (a graph with symbolic sizes failed on inputs of another
    shape; "outputs+second-shape" when it passed), or "not-checkable" with the reason
    in ``message``.
    """

    ok: bool | None
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    checked: str = "outputs"
    message: str = ""


@dataclass
class Step:
    """One applied match: pass and pattern, the matched site nodes, the nodes created
    and erased, old->new replacement map (provenance), seconds spent matching and
    rewriting, the delta it made, and its verification result.

    A step whose pattern raised or left the graph invalid is rolled back and kept with
    an empty delta and ``error``: ``{"kind": "raised" | "invalid" | "layout" |
    "direct-mutation" | "symbolic-size", "type": exception class, "message", "source": "path:line" of the
    pattern code that raised (or the pattern's class)}``. Traces written before this
    field existed load with ``error`` None. ``graph`` names the graph the step rewrote
    (``"pre-grad"``, ``"forward"`` or ``"backward"``); ``index`` counts from 1 within it."""

    index: int
    pass_name: str
    pattern: str
    sites: list[str]
    created: list[str]
    erased: list[str]
    replaced: dict[str, str]
    delta: Delta | None
    match_s: float
    rewrite_s: float
    nodes_after: int
    verify: VerifyResult | None = None
    #: pattern-specific figures, plain data (``prepack_weights``: ``bytes_packed``)
    info: dict = field(default_factory=dict)
    error: dict | None = None
    graph: str = PRE_GRAD

    @property
    def failed(self) -> bool:
        """True when the step was rolled back (``error`` says why) or failed verification."""
        return self.error is not None or (self.verify is not None and self.verify.ok is False)

    def to_json(self) -> dict:
        out = {
            "index": self.index,
            "graph": self.graph,
            "pass": self.pass_name,
            "pattern": self.pattern,
            "sites": self.sites,
            "created": self.created,
            "erased": self.erased,
            "replaced": self.replaced,
            "delta": self.delta.to_json() if self.delta is not None else None,
            "match_s": self.match_s,
            "rewrite_s": self.rewrite_s,
            "nodes_after": self.nodes_after,
            "verify": asdict(self.verify) if self.verify is not None else None,
        }
        if self.info:
            out["info"] = self.info
        if self.error is not None:
            out["error"] = self.error
        return out

    @classmethod
    def from_json(cls, d: dict, graph: str = PRE_GRAD) -> Step:
        """Inverse of :meth:`to_json`; a step without ``graph`` (written before graphs
        existed) belongs to ``graph``."""
        return cls(
            index=d["index"],
            pass_name=d["pass"],
            pattern=d["pattern"],
            sites=d["sites"],
            created=d["created"],
            erased=d["erased"],
            replaced=d.get("replaced", {}),
            delta=Delta.from_json(d["delta"]) if d.get("delta") is not None else None,
            match_s=d["match_s"],
            rewrite_s=d["rewrite_s"],
            nodes_after=d["nodes_after"],
            verify=VerifyResult(**d["verify"]) if d.get("verify") is not None else None,
            info=d.get("info", {}),
            error=d.get("error"),
            graph=d.get("graph", graph),
        )


# --------------------------------------------------------------------------- trace


@dataclass
class Trace:
    """The initial graph plus the ordered Steps of one pipeline run.

    ``graph_at(k)`` is the graph after the first ``k`` steps (``graph_at(0)`` is the
    captured graph); ``before(i)``/``after(i)`` are step ``i``'s graphs (steps count
    from 1). Rebuilds start from the nearest in-memory checkpoint at or before the
    step; one is taken whenever the deltas replayed since the last hold as many records
    as 1/``CHECKPOINT_SHARE`` of the graph's nodes (a copy costs about that much), so a
    rebuild replays at most that many records once its checkpoints exist, and the first
    rebuild of a late step replays every delta once.

    ``graph`` names the graph this trace's steps rewrite (``"pre-grad"`` for the Dynamo
    graph); ``graphs`` holds the other graphs of the same run, each a Trace of its own
    (``"forward"``, ``"backward"``: the ATen graphs of the post-grad passes), and
    :meth:`graph_named` picks one.
    """

    model: str
    initial_graph: GraphSnapshot
    steps: list[Step] = field(default_factory=list)
    passes: list[dict] = field(default_factory=list)
    capture: dict = field(default_factory=dict)
    final_verify: VerifyResult | None = None
    format_version: int = FORMAT_VERSION
    graph: str = PRE_GRAD
    graphs: list[Trace] = field(default_factory=list)

    def __post_init__(self):
        self._checkpoints: dict[int, GraphSnapshot] = {0: self.initial_graph}

    @property
    def nodes_before(self) -> int:
        return len(self.initial_graph)

    @property
    def nodes_after(self) -> int:
        return self.steps[-1].nodes_after if self.steps else len(self.initial_graph)

    def graph_at(self, k: int) -> GraphSnapshot:
        """The graph after ``k`` steps, 0 <= k <= len(steps). Raises IndexError outside that."""
        if not 0 <= k <= len(self.steps):
            raise IndexError(f"step {k} is outside 0..{len(self.steps)}")
        base = max(c for c in self._checkpoints if c <= k)
        snap = self._checkpoints[base].copy()
        replayed = 0
        for i in range(base, k):
            delta = self.steps[i].delta
            if delta is None:
                raise ValueError(
                    f"step {i + 1} was recorded without its delta (record=False): its graph cannot be replayed"
                )
            snap.apply(delta)
            replayed += len(delta.upsert) + len(delta.remove)
            if replayed * CHECKPOINT_SHARE >= len(snap):
                if i + 1 not in self._checkpoints:
                    self._checkpoints[i + 1] = snap.copy()
                replayed = 0
        return snap

    def before(self, index: int) -> GraphSnapshot:
        """Graph before step ``index`` (1-based)."""
        return self.graph_at(index - 1)

    def after(self, index: int) -> GraphSnapshot:
        """Graph after step ``index`` (1-based)."""
        return self.graph_at(index)

    def step(self, index: int) -> Step:
        """Step ``index`` (1-based); IndexError if there is no such step."""
        if not 1 <= index <= len(self.steps):
            raise IndexError(f"there is no step {index}; the trace has {len(self.steps)}")
        return self.steps[index - 1]

    def steps_of_pass(self, pass_name: str) -> list[Step]:
        return [s for s in self.steps if s.pass_name == pass_name]

    def failed_steps(self) -> list[Step]:
        """Steps that failed verification or were rolled back (:attr:`Step.failed`)."""
        return [s for s in self.steps if s.failed]

    # ---- the graphs of one run
    def graph_names(self) -> list[str]:
        """This trace's graph, then those of :attr:`graphs`, in run order."""
        return [self.graph, *(g.graph for g in self.graphs)]

    def graph_named(self, name: str) -> Trace:
        """The trace of graph ``name`` (this one, or one of :attr:`graphs`). Raises
        KeyError listing the graphs the run recorded."""
        for t in (self, *self.graphs):
            if t.graph == name:
                return t
        raise KeyError(f"the trace has no {name} graph (it has: {', '.join(self.graph_names())})")

    def traces(self) -> list[Trace]:
        """This trace and those of :attr:`graphs`, in run order."""
        return [self, *self.graphs]

    def all_steps(self) -> list[Step]:
        """Every step of every graph of the run, graph by graph (each Step names its ``graph``)."""
        return [s for t in self.traces() for s in t.steps]

    def all_failed(self) -> list[Step]:
        """The failed steps (:attr:`Step.failed`) of every graph of the run."""
        return [s for t in self.traces() for s in t.failed_steps()]

    def failure_runs(self) -> list[tuple[Step, list[Step]]]:
        """The steps that fail verification, grouped: (a step that fails where the graph
        before it passed or was the captured one, the failing steps after it that fail with
        the same first message line with no passing step in between). Once a step breaks
        the graph, every later graph fails the same way until a step repairs it: those
        steps inherit the failure rather than add one, so only the first of each run is a
        defect of its own."""
        runs: list[tuple[Step, list[Step]]] = []
        head: tuple[str, tuple[Step, list[Step]]] | None = None
        for s in self.steps:
            v = s.verify
            if not s.failed:
                if v is not None and v.ok:
                    head = None
                continue
            msg = (v.message or "").splitlines()[0] if v is not None and v.message else ""
            if head is not None and head[0] == msg:
                head[1][1].append(s)
            else:
                head = (msg, (s, []))
                runs.append(head[1])
        return runs

    def inherited_failures(self) -> dict[int, int]:
        """Step index -> the index of the step whose failure it only inherits, for every
        failing step that is not a defect of its own (:meth:`failure_runs`, the one source)."""
        return {x.index: s.index for s, rest in self.failure_runs() for x in rest}

    # ---- JSON
    def to_json(self) -> dict:
        return {
            "format_version": self.format_version,
            "model": self.model,
            "graph": self.graph,
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "passes": self.passes,
            "capture": self.capture,
            "final_verify": asdict(self.final_verify) if self.final_verify else None,
            "initial_graph": self.initial_graph.to_json(),
            "steps": [s.to_json() for s in self.steps],
            "graphs": [g.to_json() for g in self.graphs],
        }

    @classmethod
    def from_json(cls, data: dict) -> Trace:
        """Rebuild a Trace from its JSON form. Raises TraceFormatError on a wrong version or layout."""
        if not isinstance(data, dict) or "format_version" not in data:
            raise TraceFormatError("not an Optimus Lens trace: no format_version field")
        if data["format_version"] != FORMAT_VERSION:
            raise TraceFormatError(
                f"trace format_version {data['format_version']} is not supported (this build reads {FORMAT_VERSION})"
            )
        try:
            return cls._from_json(data)
        except (KeyError, TypeError, AttributeError) as e:
            raise TraceFormatError(f"malformed trace: {e!r}") from e

    @classmethod
    def _from_json(cls, data: dict) -> Trace:
        fv = data.get("final_verify")
        graph = data.get("graph", PRE_GRAD)
        return cls(
            model=data["model"],
            initial_graph=GraphSnapshot.from_json(data["initial_graph"]),
            steps=[Step.from_json(s, graph) for s in data["steps"]],
            passes=data.get("passes", []),
            capture=data.get("capture", {}),
            final_verify=VerifyResult(**fv) if fv else None,
            graph=graph,
            graphs=[cls._from_json(g) for g in data.get("graphs", [])],
        )

    def dumps(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"))

    def save(self, path: str | Path) -> int:
        """Write the trace as JSON; returns the number of bytes written."""
        text = self.dumps()
        Path(path).write_text(text)
        return len(text.encode())

    @classmethod
    def loads(cls, text: str | bytes) -> Trace:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise TraceFormatError(f"not JSON: {e}") from e
        return cls.from_json(data)

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        return cls.loads(Path(path).read_text())


_SRC_RE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')


@functools.lru_cache(maxsize=4096)
def source_of(stack_trace: str | None) -> str | None:
    """``file.py:LINE: code`` of the innermost frame of an FX ``stack_trace``, or None."""
    if not stack_trace:
        return None
    at = stack_trace.rfind('File "')
    while at >= 0:  # the innermost frame that parses (a frame's code line may itself hold 'File "')
        m = _SRC_RE.match(stack_trace, at)
        if m:
            file, line, _fn, code = m.groups()
            return f"{Path(file).name}:{line}: {code.strip()}"
        at = stack_trace.rfind('File "', 0, at)
    return None
