"""Repro export: one step of a trace as a standalone script that needs no user model code.

:func:`repro_script` writes a Python file holding the step's before-graph (the trace's
snapshot: ops, args, shapes, strides, dtypes) and the step (pass, pattern, sites). Run
on any machine with this package installed, it rebuilds the graph
(:mod:`optimus_lens.debug.rebuild`), makes seeded random inputs and parameters of the recorded
metas, applies the step's pattern at the recorded sites (:func:`apply_step`), and checks
the rewritten graph against the unrewritten one (:func:`optimus_lens.core.verify.check`).

Exit status of the script (:func:`run_repro`): 0 the step keeps the graph's outputs;
1 the failure is reproduced (outputs differ, the graph no longer lints or runs, or the
pattern raised); 2 the repro could not be set up (the pattern no longer matches at the
sites, the graph cannot be rebuilt, or the outputs are not deterministic).

Steps of our passes apply the registered pattern (the module that defines it is
imported first, so a pattern of the user's own plugin module must be importable on the
machine that runs the repro). Steps observed from PyTorch's own passes
(:func:`optimus_lens.inductor.observe.observe_upstream`) apply upstream's group/batch fusion class
(``PRE_GRAD_FUSIONS[pass](graph_search_options=...)``) to the fused subset, or run
upstream's pattern pass letting only the recorded match through
(:func:`_apply_upstream_match`); changes upstream makes between rule calls
(``numpy_compat_normalization``, ``fuse_fx``) are refused.
"""

from __future__ import annotations

import importlib
import json
import pprint
import traceback
from collections.abc import Callable

from torch.fx import GraphModule

from optimus_lens.core.trace import GraphSnapshot, Trace

EXIT_OK, EXIT_REPRODUCED, EXIT_SETUP = 0, 1, 2


class ReproError(ValueError):
    """A step that cannot be turned into a repro, or a repro that cannot be set up."""


def step_spec(trace: Trace, index: int) -> dict:
    """Plain data for a repro of step ``index`` (1-based) of ``trace``: the before-graph
    records and what to apply. Raises IndexError for no such step, ReproError for an
    upstream pattern-pass step or an unknown pattern."""
    step = trace.step(index)
    spec = {
        "model": trace.model,
        "index": index,
        "pass": step.pass_name,
        "pattern": step.pattern,
        "sites": list(step.sites),
        "created": len(step.created),
        "erased": len(step.erased),
        "verify": None if step.verify is None else {"ok": step.verify.ok, "message": step.verify.message},
    }
    if trace.capture.get("upstream"):
        from optimus_lens.inductor.observe import known_pre_grad_passes

        if step.pass_name not in known_pre_grad_passes():
            raise ReproError(
                f"step {index} ({step.pass_name} / {step.pattern}) was made between upstream's rule "
                "calls, not by one pass's rule: it cannot be replayed alone"
            )
        opts = next((p.get("options", {}) for p in trace.passes if p.get("name") == step.pass_name), {})
        spec["upstream"] = {"pass": step.pass_name, "options": opts, "torch": trace.capture.get("torch")}
    else:
        from optimus_lens.passes import pattern_named

        try:
            spec["pattern_module"] = type(pattern_named(step.pattern)).__module__
        except KeyError as e:
            raise ReproError(e.args[0]) from None
    return spec


def repro_script(trace: Trace, index: int) -> str:
    """The text of a standalone repro script for step ``index`` of ``trace`` (see the
    module docstring). The before-graph's Python code is included as a comment.
    Raises IndexError / ReproError as :func:`step_spec`, and
    :class:`optimus_lens.debug.rebuild.RebuildError` when the graph cannot be rebuilt."""
    from optimus_lens.debug.rebuild import graph_module

    spec = step_spec(trace, index)
    before = trace.before(index)
    code = graph_module(before).code.strip("\n")
    where = (
        f"upstream fusion {spec['pass']} ({spec['pattern']})"
        if "upstream" in spec
        else f"pass {spec['pass']}, pattern {spec['pattern']}"
    )
    graph_json = json.dumps(before.to_json(), indent=None, separators=(",", ":"))
    return "\n".join(
        [
            "#!/usr/bin/env python",
            f'"""Repro of step {index} of a trace of {trace.model or "a model"}: {where},',
            f"at {', '.join(spec['sites'][:8])}{' ...' if len(spec['sites']) > 8 else ''}.",
            "",
            "Rebuilds the step's before-graph from the trace's snapshot with seeded random inputs",
            "and parameters, applies the step's pattern at its sites, and compares the result",
            "with the unrewritten graph. Needs only the optimus-lens package.",
            "Exit status: 0 the step keeps the outputs; 1 the failure is reproduced; 2 setup failed.",
            '"""',
            "import json",
            "import sys",
            "",
            "from optimus_lens.debug.repro import run_repro",
            "",
            "# The before-graph, as GraphModule code:",
            *("# " + line if line else "#" for line in code.splitlines()),
            "",
            f"STEP = {pprint.pformat(spec, sort_dicts=False, width=100)}",
            "",
            f"GRAPH = json.loads({graph_json!r})",
            "",
            'if __name__ == "__main__":',
            "    sys.exit(run_repro(GRAPH, STEP))",
            "",
        ]
    )


def apply_step(gm: GraphModule, spec: dict) -> None:
    """Apply the step of ``spec`` (:func:`step_spec`) to ``gm`` in place at its sites,
    then sort the graph topologically (as the engine's repair and upstream's final
    ``stable_topological_sort`` do). Raises ReproError when a site is missing or the
    pattern no longer matches; exceptions of the pattern itself propagate."""
    from torch._inductor.pattern_matcher import stable_topological_sort

    nodes = {n.name: n for n in gm.graph.nodes}
    missing = [s for s in spec["sites"] if s not in nodes]
    if missing:
        raise ReproError(f"site(s) {', '.join(missing)} are not in the rebuilt graph")
    sites = [nodes[s] for s in spec["sites"]]
    if "upstream" in spec:
        from torch._inductor.fx_passes.group_batch_fusion import PRE_GRAD_FUSIONS, graph_search_options

        from optimus_lens.inductor.watch import own_counters

        name = spec["upstream"]["pass"]
        with own_counters():  # upstream's counters of the caller are left as they were
            if name in PRE_GRAD_FUSIONS:
                options = {**graph_search_options, **spec["upstream"].get("options", {})}
                PRE_GRAD_FUSIONS[name](graph_search_options=options).fuse(gm.graph, sites)
            else:
                _apply_upstream_match(gm, spec)
    else:
        _apply_ours(gm, spec, sites)
    stable_topological_sort(gm.graph)
    gm.recompile()


def _apply_upstream_match(gm: GraphModule, spec: dict) -> None:
    """Run upstream's pattern pass ``spec["upstream"]["pass"]`` over ``gm`` letting only
    the one match of the step through: the entry named ``spec["pattern"]`` whose match
    nodes are the step's sites (every other match is skipped). Raises ReproError when
    that match is not found."""
    import torch._inductor.config as cfg
    from torch._inductor import pattern_matcher as pm
    from torch._inductor.fx_passes.pre_grad import PRE_GRAD_PATTERNS, lazy_init

    from optimus_lens.inductor.watch import entry_name, subclasses

    lazy_init()
    if spec["upstream"]["pass"] not in PRE_GRAD_PATTERNS:
        raise ReproError(f"this torch has no pre-grad pattern pass {spec['upstream']['pass']!r}")
    want, applied = set(spec["sites"]), []

    def wrap(orig):
        def apply(self, match, graph, node):
            if (
                graph is gm.graph
                and not applied
                and entry_name(self) == spec["pattern"]
                and {n.name for n in match.nodes} == want
            ):
                applied.append(True)
                return orig(self, match, graph, node)
            return None

        return apply

    saved = [(cls, cls.__dict__["apply"]) for cls in subclasses(pm.PatternEntry) if "apply" in cls.__dict__]
    try:
        for cls, orig in saved:
            cls.apply = wrap(orig)
        name = spec["upstream"]["pass"]  # handlers read their own options from the config
        with cfg.patch(pattern_matcher=True, pre_grad_fusion_options={name: spec["upstream"].get("options", {})}):
            PRE_GRAD_PATTERNS[name].apply(gm.graph)
    finally:
        for cls, orig in saved:
            cls.apply = orig
    if not applied:
        raise ReproError(f"upstream {spec['pattern']} no longer matches exactly the recorded sites")


def _apply_ours(gm: GraphModule, spec: dict, sites: list) -> None:
    from optimus_lens.core.pattern import BatchPattern, Match
    from optimus_lens.core.rewriter import Rewriter
    from optimus_lens.passes import pattern_named

    if spec.get("pattern_module"):
        importlib.import_module(spec["pattern_module"])
    pattern = pattern_named(spec["pattern"])
    if isinstance(pattern, BatchPattern):
        pattern.fuse(Rewriter(gm.graph), sites)
        return
    want = set(spec["sites"])
    misses = []
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    for anchor in sorted(sites, key=order.__getitem__, reverse=True):  # the engine tries the last node first
        m = pattern.match(anchor)
        if isinstance(m, Match) and {n.name for n in m.nodes} == want:
            pattern.rewrite(Rewriter(gm.graph), m)
            return
        misses.append(f"{anchor.name}: {m if not isinstance(m, Match) else 'matches other nodes'}")
    raise ReproError(f"{spec['pattern']} no longer matches at the recorded sites ({'; '.join(misses)})")


def run_repro(graph_json: dict, spec: dict, seed: int = 0, out: Callable[[str], None] = print) -> int:
    """Run a repro: rebuild ``graph_json`` (a GraphSnapshot's JSON), apply ``spec``'s
    step to a copy, compare with the unrewritten graph on seeded random inputs.
    Prints what happened through ``out``; returns the exit status (module docstring)."""
    from optimus_lens.core import verify
    from optimus_lens.core.engine import copy_graph_module
    from optimus_lens.debug.rebuild import RebuildError, graph_module, propagate, random_inputs

    where = f"step {spec['index']} ({spec['pass']} / {spec['pattern']})"
    try:
        snap = GraphSnapshot.from_json(graph_json)
        gm = graph_module(snap)
        inputs = random_inputs(snap, seed)
        propagate(gm, inputs)
    except (RebuildError, RuntimeError, TypeError) as e:
        out(f"repro: cannot rebuild the before-graph: {type(e).__name__}: {e}")
        return EXIT_SETUP
    ref = verify.reference(gm, inputs)
    after = copy_graph_module(gm)
    n_before = len(after.graph.nodes)
    try:
        apply_step(after, spec)
    except ReproError as e:
        out(f"repro: {e}")
        return EXIT_SETUP
    except Exception as e:  # noqa: BLE001 - the pattern raising is the failure being reproduced
        out(f"repro: {where} raised {type(e).__name__}: {e}")
        out(traceback.format_exc())
        return EXIT_REPRODUCED
    out(
        f"repro: applied {where} at {len(spec['sites'])} site(s): {n_before} -> {len(after.graph.nodes)} nodes "
        f"(in the trace: {spec['created']} created, {spec['erased']} erased)"
    )
    res = verify.check(after, inputs, ref)
    if res.ok is None:
        out(f"repro: cannot check: {res.message}")
        return EXIT_SETUP
    if res.ok:
        err = f" (max abs error {res.max_abs_err:.1e})" if res.max_abs_err is not None else ""
        out(f"repro: OK: the rewritten graph matches the unrewritten one{err}")
        return EXIT_OK
    out(f"repro: FAILED: {res.checked}: {res.message}")
    return EXIT_REPRODUCED
