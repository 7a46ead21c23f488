"""A compile log as a model source: ``log:PATH[#SELECTOR]``.

``PATH`` is a ``TORCH_TRACE`` directory or one of its files (PyTorch's structured log,
``torch/_logging/structured.py``: one glog-prefixed JSON record per line, its payload on
the tab-indented lines after it), or a ``TORCH_COMPILE_DEBUG`` output directory (its
``torch_compile_debug/tlparse/*.log``; without one, the ``torchinductor/*/fx_graph_*.py``
files). :func:`read_log` lists the graphs it holds (:class:`LogEntry`: compile id, frame,
artifact, IR) and what the log says around them: graph breaks, the symbols' values,
which inputs are parameters, the Inductor config (``pre_grad_fusion_options``) and the
generated code. :func:`load_entry` turns one graph into a runnable GraphModule with
example inputs (:mod:`optimus_lens.frontend.readable`, :mod:`optimus_lens.frontend.log_inputs`).

Graph artifacts: ``dynamo_output_graph`` (what Dynamo hands the backend: one per frame,
so a graph break is one more), ``before_pre_grad_graph`` / ``after_pre_grad_graph``
(around Inductor's pre-grad passes) and one graph per upstream pre-grad pass that
changed something (``optimus_<FusionClass>``, ``<pass>_pre_grad``) — torch IR; the AOT
graphs ``aot_joint_graph``, ``aot_forward_graph``, ``aot_backward_graph``,
``aot_inference_graph``, ``before_post_grad_graph``, ``inductor_post_grad_graph`` — ATen IR.

Selectors (after ``#``): none, the first frame's ``dynamo_output_graph``; ``N``, entry N
of the listing (``optimus log PATH``); ``ARTIFACT``, the first graph of that artifact;
``COMPILE_ID`` (``1/0``, ``0/0_1`` for attempt 1, ``!0/1/0`` under compiled autograd),
that compile's ``dynamo_output_graph``; ``COMPILE_ID:ARTIFACT``, that artifact of that
compile. With several log files (ranks) a compile id names the first file's compile.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.fx import GraphModule

from optimus_lens.frontend.log_inputs import InputError, example_inputs, node_shape, sizes
from optimus_lens.frontend.readable import ReadableCodeError, graph_from_code, logged_meta

PREFIX = "log:"
#: graph artifacts in torch IR (pre-grad) and in ATen IR (AOT, post-grad)
TORCH_IR = ("dynamo_output_graph", "before_pre_grad_graph", "after_pre_grad_graph")
ATEN_IR = (
    "aot_joint_graph",
    "aot_forward_graph",
    "aot_backward_graph",
    "aot_inference_graph",
    "before_joint_graph",
    "after_joint_graph",
    "before_post_grad_graph",
    "inductor_post_grad_graph",
    "fx_graph_readable",
    "fx_graph_transformed",
)
DEFAULT_ARTIFACT = "dynamo_output_graph"
_GLOG = re.compile(r"^[VIWEC]\d{4} [\d:.]+ +\d+ [^\]]*\] (.*)$")
_RANK = re.compile(r"rank_(\d+)")
_COMPILE_ID = re.compile(r"^(!\d+/)?\d+/\d+(_\d+)?$")
_META_KEYS = {"frame_id", "frame_compile_id", "attempt", "has_payload", "compiled_autograd_id"}


class LogError(ValueError):
    """A path that holds no compile log, a log this reader cannot read, or a selector
    that names no graph of the log."""


@dataclass
class LogEntry:
    """One graph of a compile log: its place in the listing (``index``), the compile it
    belongs to (``compile_id``, tlparse's spelling), the artifact it was logged as, its
    IR (``"torch"``: pre-grad, Dynamo's; ``"aten"``: AOT / post-grad), the file and the
    payload (the graph's readable code)."""

    index: int
    compile_id: str
    artifact: str
    ir: str
    file: str
    line: int
    code: str = field(repr=False)
    rank: int | None = None

    @property
    def selector(self) -> str:
        """The selector naming this graph (``COMPILE_ID:ARTIFACT``)."""
        return f"{self.compile_id}:{self.artifact}"

    @property
    def nodes(self) -> int:
        """How many FX nodes the graph has (from its code; -1 when it cannot be read)."""
        try:
            return len(graph_from_code(self.code).graph.nodes)
        except ReadableCodeError:
            return -1


@dataclass
class CompileLog:
    """What a compile log holds (see the module doc). Per compile id: ``breaks`` (graph
    break reasons logged while compiling that frame), ``symbols`` (symbol -> value),
    ``described`` (placeholder name -> ``describe_tensor`` record), ``config``
    (``compilation_metrics``' ``inductor_config``), ``output_code`` (Inductor's generated
    code, one text per graph) and ``failures`` (``fail_type: fail_reason``)."""

    path: str
    files: list[str]
    entries: list[LogEntry] = field(default_factory=list)
    breaks: dict[str, list[str]] = field(default_factory=dict)
    symbols: dict[str, dict[str, int]] = field(default_factory=dict)
    described: dict[str, dict[str, dict]] = field(default_factory=dict)
    config: dict[str, dict] = field(default_factory=dict)
    output_code: dict[str, list[str]] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    torch_version: str | None = None

    def graphs(self, artifact: str = DEFAULT_ARTIFACT) -> list[LogEntry]:
        """The entries of one artifact, in log order (Dynamo's graphs: one per frame)."""
        return [e for e in self.entries if e.artifact == artifact]

    def entry(self, compile_id: str, artifact: str) -> LogEntry | None:
        """That compile's graph of that artifact, or None."""
        return next((e for e in self.entries if e.compile_id == compile_id and e.artifact == artifact), None)

    def pre_grad_options(self, compile_id: str) -> dict | None:
        """The ``pre_grad_fusion_options`` the logged compile ran with (None when the log
        holds no ``inductor_config`` for it)."""
        cfg = self.config.get(compile_id)
        return None if cfg is None else dict(cfg.get("pre_grad_fusion_options") or {})

    def select(self, selector: str | None) -> LogEntry:
        """The entry ``selector`` names (module doc). Raises LogError listing what there
        is when it names none."""
        if not self.entries:
            raise LogError(f"{self.path}: the log holds no graph")
        sel = (selector or "").strip()
        if not sel:
            found = self.graphs()
            if not found:
                raise LogError(
                    f"{self.path}: no {DEFAULT_ARTIFACT} in the log; pick a graph with log:PATH#N ({_available(self)})"
                )
            return found[0]
        if sel.isdigit():
            i = int(sel)
            if i >= len(self.entries):
                raise LogError(f"{self.path}: no graph {i}; the log holds graphs 0..{len(self.entries) - 1}")
            return self.entries[i]
        cid, _, art = sel.rpartition(":") if ":" in sel else (sel, "", "")
        if not art:
            if any(e.artifact == sel for e in self.entries):
                return next(e for e in self.entries if e.artifact == sel)
            if not _COMPILE_ID.match(sel) and not any(e.compile_id == sel for e in self.entries):
                raise LogError(
                    f"{self.path}: {sel!r} is no graph of the log: a selector is N, ARTIFACT, COMPILE_ID "
                    f"or COMPILE_ID:ARTIFACT ({_available(self)})"
                )
            cid, art = sel, DEFAULT_ARTIFACT
        e = self.entry(cid, art)
        if e is None:
            raise LogError(f"{self.path}: no graph {cid}:{art} ({_available(self)})")
        return e


def _available(log: CompileLog) -> str:
    shown = ", ".join(f"{e.index}: {e.selector}" for e in log.entries[:12])
    more = f", ... {len(log.entries) - 12} more" if len(log.entries) > 12 else ""
    return f"it holds {shown}{more}; `optimus log {log.path}` lists them"


# --------------------------------------------------------------------------- reading


def _compile_id(rec: dict) -> str:
    cid = f"{rec.get('frame_id')}/{rec.get('frame_compile_id')}"
    if rec.get("attempt"):
        cid += f"_{rec['attempt']}"
    if rec.get("compiled_autograd_id") is not None:
        cid = f"!{rec['compiled_autograd_id']}/{cid}"
    return cid


def _records(file: Path):
    """(line number, record, payload) of every structured record of a log file."""
    lines = file.read_text(errors="replace").split("\n")
    i = 0
    while i < len(lines):
        m = _GLOG.match(lines[i])
        start = i
        i += 1
        if not m:
            continue
        try:
            rec = json.loads(m.group(1))
        except json.JSONDecodeError:
            continue
        payload = []
        while i < len(lines) and lines[i].startswith("\t"):
            payload.append(lines[i][1:])
            i += 1
        yield start + 1, rec, "\n".join(payload)


def _graph_artifact(kind: str, rec: dict) -> str | None:
    """The artifact name of a record holding a graph as readable code, else None."""
    if kind in TORCH_IR or kind in ATEN_IR:
        return kind
    if kind == "artifact":
        name = (rec.get("artifact") or {}).get("name", "")
        if name in TORCH_IR or name in ATEN_IR:
            return name
        if name.startswith("optimus_") or name.endswith(("_pre_grad", "_post_grad")):
            return name  # upstream's passes log the graph after each pass that changed it
    return None


def _ir(artifact: str) -> str:
    if artifact in ATEN_IR or artifact.endswith("_post_grad"):
        return "aten"
    return "torch"


def _source_name(source: str) -> str:
    """Dynamo's placeholder name for a source (``L['x']`` -> ``L_x_``)."""
    return re.sub(r"[^a-zA-Z0-9]+", "_", source)


def _break_text(payload: str) -> str:
    """A logged graph break: where, the reason, the explanation and Dynamo's hints, without
    the debug context, the documentation link and the user traceback."""
    keep: list[str] = []
    for line in payload.splitlines():
        s = line.strip()
        if s.startswith(("Developer debug context", "For more details", "User code traceback")):
            break
        if s or (keep and keep[-1]):
            keep.append(line.rstrip())
    return "\n".join(keep).strip()


def _read_file(log: CompileLog, file: Path, rank: int | None) -> None:
    tensors: dict[tuple, dict] = {}
    for line, rec, payload in _records(file):
        kind = next((k for k in rec if k not in _META_KEYS), None)
        if kind is None:
            continue
        cid = _compile_id(rec)
        art = _graph_artifact(kind, rec)
        if art is not None:
            if payload.lstrip().startswith("class "):
                log.entries.append(LogEntry(len(log.entries), cid, art, _ir(art), str(file), line, payload, rank))
            continue
        body = rec[kind]
        if kind == "artifact":
            name = body.get("name")
            if name == "dynamo_graph_break_reason":
                log.breaks.setdefault(cid, []).append(_break_text(payload))
            elif name == "torch_version" and payload:
                try:
                    log.torch_version = json.loads(payload).get("pytorch_version")
                except json.JSONDecodeError:
                    pass
        elif kind == "create_symbol":
            try:
                log.symbols.setdefault(cid, {})[body["symbol"]] = int(body["val"])
            except (KeyError, ValueError, TypeError):
                pass
        elif kind == "describe_tensor":
            tensors[(cid, body.get("describer_id"), body.get("id"))] = body
        elif kind == "describe_source":
            t = tensors.get((cid, body.get("describer_id"), body.get("id")))
            if t is not None and "source" in body:
                log.described.setdefault(cid, {})[_source_name(body["source"])] = t
        elif kind == "inductor_output_code":
            log.output_code.setdefault(cid, []).append(payload)
        elif kind == "compilation_metrics":
            if body.get("fail_type"):
                log.failures[cid] = f"{body['fail_type']}: {body.get('fail_reason')}"
            try:
                cfg = json.loads(body.get("inductor_config") or "null")
            except json.JSONDecodeError:
                cfg = None
            if isinstance(cfg, dict):
                log.config[cid] = cfg


def _debug_graphs(log: CompileLog, root: Path) -> None:
    """A ``TORCH_COMPILE_DEBUG`` directory without a structured log: the graph files
    ``torchinductor/<graph>/fx_graph_readable.py`` (the ATen graph Inductor was given)
    and ``fx_graph_transformed.py`` (after its post-grad passes)."""
    dirs = [root, *sorted(root.glob("run_*")), *sorted(root.glob("torch_compile_debug/run_*"))]
    for f in (f for d in dirs for f in sorted(d.glob("torchinductor/*/fx_graph_*.py"))):
        art = f.stem
        if art in ("fx_graph_readable", "fx_graph_transformed"):
            log.entries.append(LogEntry(len(log.entries), f.parent.name, art, "aten", str(f), 1, f.read_text()))


def log_files(path: str | Path) -> list[Path]:
    """The structured log files at ``path``: the file itself, a ``TORCH_TRACE``
    directory's files, or a ``TORCH_COMPILE_DEBUG`` directory's ``tlparse`` logs (looked
    for in it, in its ``torch_compile_debug``, and beside a ``run_*`` directory). Raises
    LogError when the path does not exist."""
    p = Path(path)
    if not p.exists():
        raise LogError(f"no such compile log: {path}")
    if p.is_file():
        return [p]
    for d in (p, p / "tlparse", p / "torch_compile_debug" / "tlparse", p.parent / "tlparse"):
        files = sorted(f for f in d.glob("*.log") if f.is_file()) if d.is_dir() else []
        files = [f for f in files if _looks_structured(f)]
        if files:
            return files
    return []


def _looks_structured(f: Path) -> bool:
    with f.open(errors="replace") as fh:
        for line in fh:
            m = _GLOG.match(line)
            if m:
                return m.group(1).startswith("{")
    return False


_CACHE: dict[tuple, CompileLog] = {}


def read_log(path: str | Path) -> CompileLog:
    """Every graph and fact of the compile log at ``path`` (module doc), cached by the
    files' paths, sizes and modification times. Raises LogError when ``path`` does not
    exist or holds no log."""
    files = log_files(path)
    key = (str(path), *((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files))
    if key in _CACHE:
        return _CACHE[key]
    log = CompileLog(str(path), [str(f) for f in files])
    for f in files:
        m = _RANK.search(f.name)
        _read_file(log, f, int(m.group(1)) if m and len(files) > 1 else None)
    if not files:
        root = Path(path)
        if root.is_dir():
            _debug_graphs(log, root)
        if not log.entries:
            raise LogError(
                f"{path}: no compile log here (a TORCH_TRACE directory or file, or a TORCH_COMPILE_DEBUG "
                "directory with torch_compile_debug/tlparse/*.log)"
            )
    _CACHE[key] = log
    return log


def parse_spec(spec: str) -> tuple[str, str | None]:
    """``log:PATH#SELECTOR`` -> (PATH, SELECTOR or None)."""
    body = spec.strip().removeprefix(PREFIX)
    path, sep, sel = body.partition("#")
    return path, (sel if sep else None)


# --------------------------------------------------------------------------- loading


@dataclass
class LoggedGraph:
    """A graph of a log, runnable: ``gm`` (node names, ops and source lines as logged;
    ``example_value`` on every node of a torch-IR graph, ``val`` on an ATen one),
    ``example_inputs`` made from the recorded metas, and ``notes``: what was guessed
    (integer ranges, devices, constants) and where the log's metas and the graph's own
    disagree."""

    gm: GraphModule
    example_inputs: tuple
    entry: LogEntry
    log: CompileLog
    notes: list[str] = field(default_factory=list)

    def info(self) -> dict:
        """Plain data for a Trace's ``capture["log"]``."""
        e = self.entry
        return {
            "path": self.log.path,
            "compile_id": e.compile_id,
            "artifact": e.artifact,
            "ir": e.ir,
            "index": e.index,
            "graphs": len(self.log.graphs(e.artifact)),
            "breaks": sum(len(b) for b in self.log.breaks.values()),
            "notes": list(self.notes),
            "torch": self.log.torch_version,
        }


def _device_map(gm: GraphModule) -> dict[str, str]:
    """Logged devices this machine does not have -> ``cpu``."""
    out = {}
    for n in gm.graph.nodes:
        m = logged_meta(n)
        dev = m.device if m is not None else None
        if dev and dev not in out and dev != "cpu":
            d = torch.device(dev)
            ok = d.type == "cuda" and torch.cuda.is_available() and (d.index or 0) < torch.cuda.device_count()
            if not ok and d.type != "meta":
                out[dev] = "cpu"
    return out


def _remap_devices(gm: GraphModule, mapping: dict[str, str]) -> None:
    """Device arguments of the graph's nodes moved as ``mapping`` says."""
    types = {torch.device(k).type for k in mapping}

    def fix(a):
        if isinstance(a, torch.device) and (str(a) in mapping or a.type in types):
            return torch.device("cpu")
        if isinstance(a, (list, tuple)):
            return type(a)(fix(x) for x in a)
        if isinstance(a, dict):
            return {k: fix(v) for k, v in a.items()}
        return a

    for n in gm.graph.nodes:
        n.args, n.kwargs = fix(n.args), fix(dict(n.kwargs))
        if n.kwargs.get("device") in mapping or (
            isinstance(n.kwargs.get("device"), str) and n.kwargs["device"] in types
        ):
            n.kwargs = {**n.kwargs, "device": "cpu"}


def _constants(gm: GraphModule, symbols: dict[str, int], notes: list[str]) -> None:
    """Tensor constants the graph reads (``get_attr``) that the log does not hold: random
    values of their logged meta, said in ``notes``."""
    for n in gm.graph.nodes:
        if n.op != "get_attr":
            continue
        try:
            obj = gm
            for part in str(n.target).split("."):
                obj = getattr(obj, part)
            continue
        except AttributeError:
            pass
        m = logged_meta(n)
        if m is None or m.dtype is None:
            raise LogError(f"constant {n.target} is not in the log and has no recorded meta")
        shape, stride = sizes(m, symbols)
        t = torch.empty_strided(shape, stride, dtype=m.dtype)
        t.copy_(torch.randn(shape) if m.dtype.is_floating_point else torch.zeros(shape, dtype=m.dtype))
        *parents, leaf = str(n.target).split(".")
        owner = gm
        for p in parents:
            owner = getattr(owner, p)
        owner.register_buffer(leaf, t)
        notes.append(f"constant {n.target} is not in the log: filled with values of its recorded meta")


def _propagate(gm: GraphModule, inputs: tuple, ir: str) -> None:
    """Example values on every node: FakeTensor propagation, or, for ops it cannot run
    (data-dependent sizes), a real run whose values are turned into FakeTensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        FakeTensorProp(gm, mode).propagate(*inputs)
    except Exception:  # noqa: BLE001 - fall back to values from a real run
        values: dict = {}

        class _Record(torch.fx.Interpreter):
            def run_node(self, n):
                out = super().run_node(n)
                values[n] = out
                return out

        with torch.no_grad():
            _Record(gm).run(*inputs)
        for n, v in values.items():
            n.meta["val"] = torch.utils._pytree.tree_map_only(torch.Tensor, mode.from_tensor, v)
    if ir == "torch":  # Dynamo's graphs carry example_value, as capture gives them
        for n in gm.graph.nodes:
            if "val" in n.meta:
                n.meta["example_value"] = n.meta.pop("val")


def _mismatches(gm: GraphModule, symbols: dict[str, int]) -> list[str]:
    """Nodes whose computed sizes or strides differ from what the log recorded."""
    from optimus_lens.core import meta

    out = []
    for n in gm.graph.nodes:
        m = logged_meta(n)
        v = meta.tensor(n)
        if m is None or m.dtype is None or v is None:
            continue
        try:
            shape, stride = sizes(m, symbols)
        except InputError:
            continue
        got = (list(v.shape), list(v.stride()) if m.stride is not None else stride)
        if [int(x) for x in got[0]] != shape or [int(x) for x in got[1]] != stride:
            out.append(f"{n.name}: the log records {list(shape)} strides {stride}, it computes {got[0]} {got[1]}")
    return out


def _symbols_in(n) -> set[str]:
    m = logged_meta(n)
    if m is None:
        return set()
    texts = [m.sym or "", *m.shape, *(m.stride or ())]
    return {w for t in texts for w in re.findall(r"[A-Za-z_]\w*", t)}


def load_entry(log: CompileLog, entry: LogEntry, seed: int = 0) -> LoggedGraph:
    """``entry`` as a runnable GraphModule with example inputs (:class:`LoggedGraph`).
    Devices this machine lacks become ``cpu`` (noted). Raises LogError for code that
    cannot be read back, an input that cannot be made, or a graph that does not run on
    the inputs."""
    try:
        gm = graph_from_code(entry.code)
    except ReadableCodeError as e:
        raise LogError(f"{entry.selector} ({entry.file}:{entry.line}): {e}") from e
    symbols = dict(log.symbols.get(entry.compile_id, {}))
    notes: list[str] = []
    devices = _device_map(gm)
    if devices:
        _remap_devices(gm, devices)
        notes.append("the graph ran on " + ", ".join(devices) + "; loaded on cpu (this machine has no such device)")
    gm.recompile()
    used = sorted({sym for n in gm.graph.nodes if n.op == "placeholder" for sym in _symbols_in(n) if sym in symbols})
    if used:
        notes.append(
            "symbolic sizes at the values the log recorded: "
            + ", ".join(f"{k}={symbols[k]}" for k in used)
            + " (the graph is loaded with those sizes)"
        )
    _constants(gm, symbols, notes)
    try:
        inputs, input_notes = example_inputs(gm, symbols, log.described.get(entry.compile_id), devices, seed)
    except InputError as e:
        raise LogError(f"{entry.selector}: {e}") from e
    notes += input_notes
    try:
        _propagate(gm, inputs, entry.ir)
    except Exception as e:  # noqa: BLE001 - the log's graph does not run here: say why
        raise LogError(
            f"{entry.selector}: the graph does not run on inputs of its logged metas: {type(e).__name__}: {e}"
        ) from e
    notes += _mismatches(gm, symbols)
    out = LoggedGraph(gm, inputs, entry, log, notes)
    gm.meta["optimus_log"] = out.info()
    return out


def load_log(spec: str, seed: int = 0) -> LoggedGraph:
    """The graph ``log:PATH#SELECTOR`` names, loaded (:func:`read_log`, :meth:`CompileLog.select`,
    :func:`load_entry`). Raises LogError."""
    path, sel = parse_spec(spec)
    if not path:
        raise LogError("log: needs a path: log:PATH or log:PATH#SELECTOR")
    log = read_log(os.path.expanduser(path))
    return load_entry(log, log.select(sel), seed)


def is_logged(model) -> bool:
    """Whether ``model`` is a graph :func:`load_entry` read from a compile log."""
    return isinstance(model, GraphModule) and "optimus_log" in getattr(model, "meta", {})


__all__ = [
    "ATEN_IR",
    "PREFIX",
    "TORCH_IR",
    "CompileLog",
    "LogEntry",
    "LogError",
    "LoggedGraph",
    "is_logged",
    "load_entry",
    "load_log",
    "log_files",
    "node_shape",
    "parse_spec",
    "read_log",
]
