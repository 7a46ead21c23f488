"""Watching upstream's pre-grad passes: every change they make to a graph, attributed to the
rule call that made it.

Upstream's rules are ``GroupBatchFusionBase.fuse(graph, subset)`` (one call per fused
group, ``torch/_inductor/fx_passes/group_batch_fusion.py``) and
``PatternEntry.apply(match, graph, node)`` (one call per match inside a
``PatternMatcherPass``, ``split_cat.py``). :func:`patched_rules` wraps, for the duration
of a block only, every subclass's ``fuse`` and ``apply``, ``PatternMatcherPass.apply``
(for the pass name) and ``torch.fx.Node._update_args_kwargs`` (upstream rewires some uses
by ``node.update_arg``, which fires no FX hook), so a :class:`Watcher` sees each call
and records what it changed (:func:`optimus_lens.core.record.recording`). Everything is
restored on exit, also when upstream raises. Also here: upstream's counters
(:func:`upstream_counters`, :func:`own_counters`) and its config for a run
(:func:`upstream_config`).
"""

from __future__ import annotations

import os
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.fx import GraphModule, Node

from optimus_lens.core.record import Recording, recording

#: the counter group upstream's split/cat passes write to (split_cat.py reads the same variable)
COUNTER_GROUP = os.environ.get("TORCHINDUCTOR_PATTERN_MATCH_BACKEND", "inductor")

OTHER_PASS = "pre_grad_passes"
OTHER_PATTERN = "other pre-grad rewrite"


@dataclass
class Application:
    """One upstream rule application: a ``fuse(graph, subset)`` call of a group/batch
    fusion, or an ``apply(match, graph, node)`` call of a pattern entry.

    ``counters`` holds the counter increments made during the call; ``changed`` says
    whether the graph changed at all; ``identity`` that it only replaced nodes by equal
    ones (same op, target, args and kwargs), as ``normalize_unbind_default`` /
    ``normalize_stack_default`` do for nodes already in normal form."""

    pass_name: str
    pattern: str
    sites: list[str]
    counters: dict[str, int]
    changed: bool
    identity: bool
    seconds: float
    match_s: float = 0.0


def _form(n: Node) -> tuple:
    return (n.op, n.target, n.args, dict(n.kwargs))


class Watcher:
    """Attributes every change upstream makes to ``gm``'s graph to the rule call that
    made it (or to :data:`OTHER_PASS` for changes made between rule calls).

    ``on_change(app, rec, touched)`` is called for every rule call or in-between span
    that changed the graph; ``touched`` holds the nodes whose args were reassigned.

    ``other`` names the in-between spans outside any named pass. Inside a named pass
    (:meth:`push_label`: upstream's ``GraphTransformObserver(gm, passname)`` blocks, with
    ``patched_rules(w, spans=True)``) the span is that pass: everything the pass changed
    outside rule calls becomes one application of it (``remove_noop_ops``,
    ``reinplace_inplaceable_ops``, ...)."""

    def __init__(
        self,
        gm: GraphModule,
        on_change: Callable[[Application, Recording, list[Node]], None],
        other: str = OTHER_PASS,
    ):
        self.gm, self.graph = gm, gm.graph
        self.on_change = on_change
        self.other = other
        self.labels: list[str] = []
        self.passes: list[str] = []
        self.depth = 0
        self.touched: dict[int, Node] = {}
        self.applications: list[Application] = []
        self._outside: Any = None
        self._outside_rec: Recording | None = None
        self._t_end = time.perf_counter()
        #: (application, recording, touched nodes, exception) of a rule call that raised
        self.failure: tuple[Application, Recording, list[Node], Exception] | None = None

    # ---- spans between rule calls
    def open_outside(self) -> None:
        """Start recording the changes made between rule calls."""
        self.touched = {}
        self._outside = recording(self.gm)
        self._outside_rec = self._outside.__enter__()

    def close_outside(self, emit: bool = True) -> None:
        """Stop recording between rule calls; with ``emit``, report what changed there as
        one application of :data:`OTHER_PASS` (through ``on_change``)."""
        if self._outside is None:
            return
        cm, rec = self._outside, self._outside_rec
        self._outside = self._outside_rec = None
        cm.__exit__(None, None, None)
        touched = self._drain()
        if emit and (self._changed(rec) or touched):
            label = self.labels[-1] if self.labels else None
            app = Application(label or self.other, label or OTHER_PATTERN, [], {}, True, False, 0.0)
            self.on_change(app, rec, touched)

    def push_label(self, name: str) -> None:
        """A named pass starts: what changed before it is emitted, and the changes from here
        on (outside rule calls) are the pass's."""
        if not self.depth:
            self.close_outside()
        self.labels.append(name)
        if not self.depth:
            self.open_outside()

    def pop_label(self) -> None:
        """The named pass of the last :meth:`push_label` ends: its changes are emitted."""
        if not self.depth:
            self.close_outside()
        if self.labels:
            self.labels.pop()
        if not self.depth:
            self.open_outside()

    # ---- rule calls
    def application(self, pass_name: str, pattern: str, sites: list, fn: Callable[[], Any]) -> Any:
        """Run one rule call ``fn`` (of ``pattern`` in ``pass_name`` at ``sites``), record
        what it changes as an :class:`Application` and return its result. A call nested in
        another belongs to the outer one. What ``fn`` raises propagates, after
        :attr:`failure` is set to what the call had changed."""
        if self.depth:  # a nested call (super().fuse, a pass inside a rule) belongs to the outer one
            return fn()
        self.close_outside()
        site_nodes = [n for n in sites if isinstance(n, Node)]
        forms = [_form(n) for n in site_nodes]
        before = dict(upstream_counters())
        t0 = time.perf_counter()
        match_s = t0 - self._t_end
        self.depth += 1
        self.touched = {}
        rec = Recording()
        try:
            with recording(self.gm) as rec:
                result = fn()
        except Exception as e:
            self.failure = (
                Application(
                    pass_name, pattern, [n.name for n in site_nodes], {}, True, False, time.perf_counter() - t0, match_s
                ),
                rec,
                self._drain(),
                e,
            )
            raise
        finally:
            self.depth -= 1
        seconds = time.perf_counter() - t0
        after = upstream_counters()
        delta = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
        touched = self._drain()
        changed = self._changed(rec) or any(not n._erased for n in touched)
        app = Application(
            pass_name,
            pattern,
            [n.name for n in site_nodes],
            delta,
            changed,
            self._identity(rec, site_nodes, forms),
            seconds,
            match_s,
        )
        self.applications.append(app)
        if changed:
            self.on_change(app, rec, touched)
        self._t_end = time.perf_counter()
        self.open_outside()
        return result

    def _drain(self) -> list[Node]:
        out = [n for n in self.touched.values() if not n._erased]
        self.touched = {}
        return out

    @staticmethod
    def _changed(rec: Recording) -> bool:
        return bool(rec.created or rec.erased or rec.rewired)

    @staticmethod
    def _identity(rec: Recording, sites: list[Node], forms: list[tuple]) -> bool:
        created = rec.created_alive()
        created_ids = {id(n) for n in rec.created}
        erased = [n for n in rec.erased if id(n) not in created_ids]
        if not erased or len(created) != len(erased):
            return False
        pool = [forms[sites.index(n)] for n in erased if n in sites]
        if len(pool) != len(erased):
            return False
        for c in created:
            f = _form(c)
            if f not in pool:
                return False
            pool.remove(f)
        return True


def upstream_counters() -> Counter:
    """Upstream's counter group ``counters[COUNTER_GROUP]`` (``torch._dynamo.utils.counters``),
    looked up afresh on each call (upstream may replace the Counter object)."""
    from torch._dynamo.utils import counters

    return counters[COUNTER_GROUP]


def subclasses(cls: type) -> list[type]:
    """``cls`` and every class derived from it, directly or not, each once: the classes
    whose own ``fuse`` / ``apply`` :func:`patched_rules` wraps."""
    out, todo = [], [cls]
    while todo:
        c = todo.pop()
        out.append(c)
        todo.extend(c.__subclasses__())
    return list(dict.fromkeys(out))


def entry_name(entry: Any) -> str:
    """The name a pattern entry's steps are recorded under: its handler function's name
    (through ``functools.partial``), else its ``pattern_name``, else its class name."""
    handler = getattr(entry, "handler", None)
    if handler is not None:
        while hasattr(handler, "func"):  # functools.partial
            handler = handler.func
        return getattr(handler, "__name__", type(entry).__name__)
    return getattr(entry, "pattern_name", None) or type(entry).__name__


_ACTIVE: list[Watcher] = []


@contextmanager
def patched_rules(w: Watcher, spans: bool = False) -> Iterator[None]:
    """Wrap upstream's rule entry points so each call runs through ``w.application``;
    restore every wrapped attribute on exit, also when the body raises. With ``spans``,
    also ``GraphTransformObserver``'s ``__enter__``/``__exit__`` (every named pass of
    ``post_grad_passes`` runs inside one), so each pass's other changes are one span
    (:meth:`Watcher.push_label`). Raises RuntimeError when another block of this process is
    already watching."""
    from torch._inductor import pattern_matcher as pm
    from torch._inductor.fx_passes import group_batch_fusion as gbf

    if _ACTIVE:
        raise RuntimeError("upstream passes are already being observed in this process")
    names = {cls: name for reg in (gbf.POST_GRAD_FUSIONS, gbf.PRE_GRAD_FUSIONS) for name, cls in reg.items()}
    saved: list[tuple[type, str, bool, Any]] = []

    def patch(owner: type, attr: str, new: Any) -> None:
        saved.append((owner, attr, attr in owner.__dict__, owner.__dict__.get(attr)))
        setattr(owner, attr, new)

    def wrap_fuse(orig):
        def fuse(self, graph, subset):
            if graph is not w.graph:
                return orig(self, graph, subset)
            cls = type(self)
            return w.application(
                names.get(cls, cls.__name__), cls.__name__, list(subset), lambda: orig(self, graph, subset)
            )

        return fuse

    def wrap_entry(orig):
        def apply(self, match, graph, node):
            if graph is not w.graph:
                return orig(self, match, graph, node)
            pass_name = w.passes[-1] if w.passes else "pattern_matcher"
            return w.application(pass_name, entry_name(self), list(match.nodes), lambda: orig(self, match, graph, node))

        return apply

    def wrap_pass(orig):
        def apply(self, gm):
            w.passes.append(self.pass_name or (w.labels[-1] if w.labels else "pattern_matcher"))
            try:
                return orig(self, gm)
            finally:
                w.passes.pop()

        return apply

    orig_update = Node._update_args_kwargs

    def update_args_kwargs(node, args, kwargs):
        orig_update(node, args, kwargs)
        if getattr(node, "graph", None) is w.graph:
            w.touched[id(node)] = node

    _ACTIVE.append(w)
    try:
        for cls in subclasses(gbf.GroupBatchFusionBase):
            if "fuse" in cls.__dict__:
                patch(cls, "fuse", wrap_fuse(cls.__dict__["fuse"]))
        for cls in subclasses(pm.PatternEntry):
            if "apply" in cls.__dict__:
                patch(cls, "apply", wrap_entry(cls.__dict__["apply"]))
        patch(pm.PatternMatcherPass, "apply", wrap_pass(pm.PatternMatcherPass.__dict__["apply"]))
        patch(Node, "_update_args_kwargs", update_args_kwargs)
        if spans:
            _patch_spans(w, patch)
        yield
    finally:
        for owner, attr, had, old in reversed(saved):
            if had:
                setattr(owner, attr, old)
            else:
                delattr(owner, attr)
        _ACTIVE.remove(w)


def _patch_spans(w: Watcher, patch: Callable[[type, str, Any], None]) -> None:
    """Wrap ``GraphTransformObserver.__enter__``/``__exit__`` (torch/fx/passes/graph_transform_observer.py)
    so each named block of ``w``'s graph is a span of ``w`` (:meth:`Watcher.push_label`)."""
    from torch.fx.passes.graph_transform_observer import GraphTransformObserver as GTO

    enter, exit_ = GTO.__dict__["__enter__"], GTO.__dict__["__exit__"]

    def mine(self) -> bool:
        return getattr(getattr(self, "gm", None), "graph", None) is w.graph

    def __enter__(self):
        out = enter(self)
        if mine(self):
            w.push_label(str(self.passname))
        return out

    def __exit__(self, *exc):
        if mine(self):
            w.pop_label()
        return exit_(self, *exc)

    patch(GTO, "__enter__", __enter__)
    patch(GTO, "__exit__", __exit__)


@contextmanager
def upstream_config(options: dict) -> Iterator[None]:
    """``pre_grad_fusion_options=options`` with no user ``pre_grad_custom_pass`` (only
    Optimus runs) and the pattern matcher on; the previous config is restored on exit."""
    import torch._inductor.config as cfg

    with cfg.patch(pre_grad_fusion_options=options, pre_grad_custom_pass=None, pattern_matcher=True):
        yield


@contextmanager
def own_counters() -> Iterator[None]:
    """Clear ``counters[COUNTER_GROUP]`` for the body and put the caller's back after.

    The Counter object is looked up afresh each time: upstream's pattern-matcher
    ``lazy_init`` replaces ``counters[backend]`` with a copy on first use."""
    saved = dict(upstream_counters())
    upstream_counters().clear()
    try:
        yield
    finally:
        upstream_counters().clear()
        upstream_counters().update(saved)


def raised_text(e: BaseException, pass_name: str | None = None, pattern: str | None = None) -> str:
    """What an upstream pass raised, for a person: which pass (``pass_name`` and the
    ``pattern`` of the rule call when it raised in one; else the innermost function of
    ``torch/_inductor`` on the traceback, e.g. ``pre_grad_passes``), where (its file and
    line), the exception type and its message; an exception with no message (a bare
    ``assert``) is described by the source line that raised it."""
    frames = traceback.extract_tb(e.__traceback__)
    upstream = [f for f in frames if "/torch/_inductor/" in f.filename.replace("\\", "/")]
    where = upstream[-1] if upstream else (frames[-1] if frames else None)
    if pass_name:
        who = f"pass {pass_name}" + (f" ({pattern})" if pattern and pattern != pass_name else "")
    elif where is not None:
        who = where.name
    else:
        who = "an upstream pass"
    at = f" at {Path(where.filename).name}:{where.lineno}" if where is not None else ""
    msg = str(e).strip()
    if not msg:
        last = frames[-1] if frames else None
        msg = "(no message)"
        if last is not None:
            msg += f"; raised by {Path(last.filename).name}:{last.lineno}" + (
                f": {last.line.strip()}" if last.line else ""
            )
    return f"{who}{at} raised {type(e).__name__}: {msg}"
