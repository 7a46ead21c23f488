"""Everything a trace knows about one FX node: the node inspector's data.

:func:`node_info` answers, for a node of the graph after step ``k`` of a trace: op,
target, args and kwargs, shape, strides, dtype, device, module path, inputs (with their shapes),
users, the model source line with the code around it (when the file can be found), and
its provenance through the whole trace — created at step i by pattern p from the step's
sites, a site of steps ..., rewired at steps ..., erased at step j and replaced by ...,
following replacements to the nodes that hold its value at the end.

Device is recorded with shape and strides (traces written before it was recorded load
without it: "(not recorded)"). Source lines are recorded as
``file.py:LINE: code`` (the file's base name); the file is looked up in the current
directory, then among the modules loaded in this process, then in ``search``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from optimus_lens.core.trace import GraphSnapshot, NodeRecord, Trace, arg_text


class NodeNotFound(KeyError):
    """No node of that name in the requested graph (the message lists close matches)."""


@dataclass
class Event:
    """One step that concerned the node. ``kind``: ``created`` (the step made it; ``nodes``
    the step's sites it was made from), ``site`` (it was matched), ``rewired`` (its
    arguments were changed), ``erased`` (``nodes``: what replaced it)."""

    step: int
    kind: str
    pass_name: str
    pattern: str
    nodes: list[str] = field(default_factory=list)

    def text(self) -> str:
        where = f"step {self.step} ({self.pass_name} / {self.pattern})"
        listed = ", ".join(self.nodes[:8]) + (" ..." if len(self.nodes) > 8 else "")
        return {
            "created": f"created at {where} from {listed or 'no site'}",
            "site": f"a site of {where}",
            "rewired": f"arguments rewired at {where}",
            "erased": f"erased at {where}, replaced by {listed or 'nothing'}",
        }[self.kind]


@dataclass
class NodeInfo:
    """The node ``record`` as it is in the graph after ``step`` steps (0: the captured
    graph). ``inputs`` are (name, shape) pairs; ``code`` the source lines around the
    recorded one as (line number, text), with ``source_file`` the file they came from;
    ``events`` its provenance in step order; ``becomes`` the live nodes its value ended
    in when it was erased (following replacements), empty while it is alive at the end;
    ``changes`` the inputs that step ``step`` changed (:func:`input_changes`); when that
    step failed verification the graph after it is run for real (:func:`replay`), adding
    the inputs' real strides, and ``failure`` is this node's error if it is the node
    that raised."""

    record: NodeRecord
    step: int
    inputs: list[tuple[str, object]]
    users: list[str]
    events: list[Event]
    alive_at_end: bool
    becomes: list[str] = field(default_factory=list)
    source_file: str | None = None
    code: list[tuple[int, str]] = field(default_factory=list)
    changes: list[InputChange] = field(default_factory=list)
    failure: str | None = None


def find_nodes(snap: GraphSnapshot, text: str, limit: int = 20) -> list[str]:
    """Names of nodes of ``snap`` whose name, op or target contains ``text``
    (case-insensitive), exact name first."""
    t = text.lower()
    hits = [n for n, r in snap.nodes.items() if t in n.lower() or t in r.target.lower() or t == r.op]
    hits.sort(key=lambda n: (n.lower() != t, n))
    return hits[:limit]


def lifetime(trace: Trace, name: str) -> tuple[int | None, int | None]:
    """(first, last) k such that ``name`` is in ``trace.graph_at(k)``, or (None, None)."""
    first = 0 if name in trace.initial_graph.nodes else None
    last = len(trace.steps) if first == 0 else None
    for s in trace.steps:
        if first is None and name in s.created:
            first, last = s.index, len(trace.steps)
        elif first is not None and name in s.erased:
            return first, s.index - 1
    return first, last


def events(trace: Trace, name: str) -> list[Event]:
    """Every step that created, matched, rewired or erased ``name``, in order."""
    out = []
    for s in trace.steps:
        if name in s.created:
            out.append(Event(s.index, "created", s.pass_name, s.pattern, list(s.sites)))
            continue
        if name in s.erased:
            repl = s.replaced.get(name)
            out.append(Event(s.index, "erased", s.pass_name, s.pattern, [repl] if repl else list(s.created)))
            continue
        if name in s.sites:
            out.append(Event(s.index, "site", s.pass_name, s.pattern))
        elif s.delta is not None and any(r.name == name for r in s.delta.upsert):
            out.append(Event(s.index, "rewired", s.pass_name, s.pattern))
    return out


def becomes(trace: Trace, name: str) -> list[str]:
    """The nodes holding ``name``'s value at the end of the trace: follow each step's
    old -> new replacement map from the step that erased it (an erased node with no
    recorded replacement ends the chain). Empty if ``name`` is alive at the end."""
    final = trace.graph_at(len(trace.steps)).nodes
    todo, out, seen = [name], [], set()
    while todo:
        n = todo.pop(0)
        if n in seen:
            continue
        seen.add(n)
        if n in final:
            if n != name:
                out.append(n)
            continue
        for s in trace.steps:
            if n in s.erased:
                if n in s.replaced:
                    todo.append(s.replaced[n])
                break
    return out


def _find_file(base: str, search: list[str]) -> str | None:
    cands = [os.path.join(os.getcwd(), base)]
    cands += [
        m.__file__
        for m in list(sys.modules.values())
        if isinstance(getattr(m, "__file__", None), str) and os.path.basename(m.__file__) == base
    ]
    cands += [os.path.join(d, base) for d in search]
    return next((c for c in cands if os.path.isfile(c)), None)


def source_context(
    source: str | None, around: int = 3, search: list[str] | None = None
) -> tuple[str | None, list[tuple[int, str]]]:
    """(file path, [(line number, text)]) of the ``around`` lines either side of a
    recorded ``file.py:LINE: code`` source, or (None, []) when the file is not found or
    its line no longer holds the recorded code (the file changed)."""
    if not source or source.count(":") < 2:
        return None, []
    base, line, code = source.split(":", 2)
    try:
        no = int(line)
    except ValueError:
        return None, []
    path = _find_file(base, search or [])
    if path is None:
        return None, []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None, []
    if not 1 <= no <= len(lines) or lines[no - 1].strip() != code.strip():
        return None, []
    lo, hi = max(1, no - around), min(len(lines), no + around)
    return path, [(i, lines[i - 1]) for i in range(lo, hi + 1)]


@dataclass
class InputChange:
    """One input of a node that a step rewired: input ``position`` (in argument order)
    read ``before`` (name, shape, stride) in the graph before the step and ``after`` in
    the graph after it. ``layout`` is set when the node reads its input's strides
    (:mod:`optimus_lens.core.strides`'s table: ``view``, ``as_strided``, ``stride()``, ...) and the
    step changed them: the table's reason, e.g. "view needs strides compatible with the
    new shape" — why such a step breaks the node. ``actual`` is the new input's stride
    when the graph after the step is run for real (:func:`replay`; None if not run):
    a pass that leaves stale metadata records one stride and computes another."""

    position: int
    before: tuple[str, object, object]
    after: tuple[str, object, object]
    layout: str | None = None
    actual: object = None

    def text(self) -> str:
        (a, sa, ta), (b, sb, tb) = self.before, self.after
        line = f"input {self.position}: {a} {sa} stride {ta} -> {b} {sb} stride {tb}"
        if self.actual is not None and self.actual != tb:
            line += f" (recorded; the tensor has stride {self.actual} when run)"
        return line + (f"  [LAYOUT: {self.layout}; the strides changed]" if self.layout else "")


def layout_reason(rec: NodeRecord) -> str | None:
    """Why a node reads its input's strides, from :mod:`optimus_lens.core.strides`'s table of
    layout-sensitive uses (None if it does not)."""
    from optimus_lens.core import strides as layout

    if rec.op == "call_method":
        return layout.SENSITIVE_METHODS.get(rec.target)
    if rec.op == "call_function":
        for fn, why in layout.SENSITIVE_FUNCTIONS.items():
            if rec.target.rsplit(".", 1)[-1] == fn.__name__:
                return why
    return None


def input_changes(trace: Trace, name: str, step: int, run: Replay | None = None) -> list[InputChange]:
    """The inputs of ``name`` that step ``step`` (1-based) changed: an argument that now
    reads another node, or the same node with another shape or stride; empty when the
    node is not in both graphs around the step or nothing it reads changed. ``run`` (a
    :func:`replay` of the graph after the step) adds each new input's real stride."""
    before, after = trace.before(step).nodes, trace.after(step).nodes
    if name not in before or name not in after:
        return []
    old, new = before[name], after[name]
    sensitive = layout_reason(new)
    out = []
    for i, (a, b) in enumerate(zip(old.inputs, new.inputs)):
        ra, rb = before.get(a), after.get(b)
        ma = (a, ra.shape if ra else None, ra.stride if ra else None)
        mb = (b, rb.shape if rb else None, rb.stride if rb else None)
        real = run.strides.get(b) if run is not None else None
        if ma != mb or (real is not None and real != ma[2]):
            now = real if real is not None else mb[2]
            changed = ma[2] is not None and now is not None and ma[2] != now
            out.append(InputChange(i, ma, mb, sensitive if changed else None, real))
    return out


def node_info(trace: Trace, name: str, step: int | None = None, search: list[str] | None = None) -> NodeInfo:
    """What ``trace`` knows about node ``name`` in the graph after ``step`` steps
    (default: the last graph that holds it). Raises NodeNotFound (a KeyError) naming
    when the node exists, or close matches when it never does; IndexError for a step
    outside 0..len(steps)."""
    first, last = lifetime(trace, name)
    if first is None:
        close = find_nodes(trace.graph_at(len(trace.steps)), name) or find_nodes(trace.initial_graph, name)
        raise NodeNotFound(
            f"no node {name!r} in this trace" + (f"; did you mean {', '.join(close[:10])}?" if close else "")
        )
    k = last if step is None else step
    snap = trace.graph_at(k)
    if name not in snap.nodes:
        raise NodeNotFound(f"{name!r} is not in the graph after step {k}: it exists after steps {first}..{last}")
    rec = snap.nodes[name]
    path, code = source_context(rec.source, search=search)
    run, failure = None, None
    if k >= 1 and trace.step(k).verify is not None and trace.step(k).verify.ok is False:
        from optimus_lens.debug.rebuild import RebuildError

        try:
            run = replay(trace, k)
        except RebuildError:
            run = None
        if run is not None and run.failed_at == name:
            failure = run.error
    return NodeInfo(
        record=rec,
        step=k,
        inputs=[(i, snap.nodes[i].shape if i in snap.nodes else None) for i in rec.inputs],
        users=snap.users().get(name, []),
        events=events(trace, name),
        alive_at_end=last == len(trace.steps),
        becomes=becomes(trace, name),
        source_file=path,
        code=code,
        changes=input_changes(trace, name, k, run) if k >= 1 else [],
        failure=failure,
    )


def node_info_text(info: NodeInfo) -> str:
    """The inspector's data as plain text (what ``optimus inspect`` prints)."""
    r = info.record
    args = ", ".join([arg_text(a) for a in r.args] + [f"{k}={arg_text(v)}" for k, v in r.kwargs.items()])
    rows = [
        f"{r.name} = {r.op} {r.target}({args})   [graph after step {info.step}]",
        f"  shape   {r.shape}",
        f"  stride  {r.stride}",
        f"  dtype   {r.dtype}",
        f"  device  {r.device if r.device is not None else '(not recorded)'}",
    ]
    if r.module:
        rows.append(f"  module  {r.module} ({r.module_type})")
    rows.append("  inputs  " + (", ".join(f"{n} {s}" for n, s in info.inputs) or "-"))
    rows.append("  users   " + (", ".join(info.users) or "-"))
    if r.source:
        rows.append(f"  source  {r.source}")
        if info.code:
            line = int(r.source.split(":", 2)[1])
            rows.append(f"          ({info.source_file})")
            rows += [f"    {'>' if no == line else ' '}{no:5d}  {text}" for no, text in info.code]
    if info.changes:
        rows.append(f"  inputs changed by step {info.step}:")
        rows += [f"    {c.text()}" for c in info.changes]
    if info.failure:
        rows.append(f"  raises  {info.failure}   (the graph after step {info.step}, run on random inputs)")
    rows.append("  provenance:")
    if not any(e.kind == "created" for e in info.events):
        rows.append("    in the captured graph")
    rows += [f"    {e.text()}" for e in info.events]
    if info.alive_at_end:
        rows.append("    alive in the final graph")
    elif info.becomes:
        rows.append(f"    its value ends in {', '.join(info.becomes)}")
    else:
        rows.append("    no recorded replacement of it is in the final graph")
    return "\n".join(rows)


@dataclass
class Replay:
    """The graph after a step run for real on random inputs of the recorded metas:
    ``strides`` of every value computed (name -> strides, shaped like
    :attr:`NodeRecord.stride`), and the node that raised with its error (None if the run
    finished). The recorded strides are what the passes' metadata claims; these are what
    the tensors have — where a pass left stale metadata, they differ."""

    strides: dict[str, object]
    failed_at: str | None = None
    error: str | None = None


def replay(trace: Trace, k: int) -> Replay:
    """Run the graph after ``k`` steps (:mod:`optimus_lens.debug.rebuild`: random inputs and
    parameters of the recorded shapes, strides and dtypes) node by node with an FX
    Interpreter, stopping at the first node that raises. Raises
    optimus_lens.debug.rebuild.RebuildError for a graph that cannot be rebuilt."""
    import torch
    from torch.fx import Interpreter

    from optimus_lens.core import meta
    from optimus_lens.debug.rebuild import graph_module, random_inputs

    snap = trace.graph_at(k)
    gm = graph_module(snap)
    out = Replay({})

    class _Run(Interpreter):
        def run_node(self, n):
            try:
                v = super().run_node(n)
            except Exception as e:  # noqa: BLE001 - the failure is the finding
                out.failed_at, out.error = n.name, f"{type(e).__name__}: {str(e).splitlines()[0]}"
                raise
            s = meta.strides(v)
            if s is not None:
                out.strides[n.name] = s
            return v

    with torch.no_grad():
        try:
            _Run(gm).run(*random_inputs(snap))
        except Exception:  # noqa: BLE001 - recorded in out
            if out.failed_at is None:
                raise
    return out
