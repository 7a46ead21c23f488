"""The plain-text tables the commands print: a trace's steps, the sample models, the
HuggingFace architectures."""

from __future__ import annotations


def verify_text(v) -> str:
    """A :class:`optimus_lens.core.trace.VerifyResult` in a table cell: ``ok 1.2e-07``,
    ``FAIL 3.0e-01``, what was not checked, or ``-`` for no check (None)."""
    if v is None or v.ok is None:
        return "-" if v is None else v.checked
    if v.ok:
        return f"ok {v.max_abs_err:.1e}" if v.max_abs_err is not None else "ok"
    return "FAIL" + (f" {v.max_abs_err:.1e}" if v.max_abs_err is not None else "")


def steps_table(trace) -> str:
    """The steps of a trace as a plain-text table: index, pass, pattern, sites, created,
    erased, verify (ok / FAIL and the largest absolute error; "FAIL (from N)" for a step that
    fails only because step N broke the graph, :meth:`Trace.failure_runs`), ms (match + rewrite).
    Columns are as wide as their longest name."""
    wp = max([len("pass"), *(len(s.pass_name) for s in trace.steps)])
    wq = max([len("pattern"), *(len(s.pattern) for s in trace.steps)])
    head = (
        f"{'#':>4s}  {'pass':{wp}s} {'pattern':{wq}s} {'sites':>5s} {'created':>7s} {'erased':>6s}  "
        f"{'verify, max err':15s} {'ms':>7s}"
    )
    rows = [head, "-" * len(head)]
    inherited = trace.inherited_failures()  # failing only because an earlier step broke the graph
    for s in trace.steps:
        check = "rolled back" if s.error else verify_text(s.verify)
        if s.index in inherited:
            check = f"FAIL (from {inherited[s.index]})"
        rows.append(
            f"{s.index:4d}  {s.pass_name:{wp}s} {s.pattern:{wq}s} {len(s.sites):5d} {len(s.created):7d} "
            f"{len(s.erased):6d}  {check:15s} {(s.match_s + s.rewrite_s) * 1e3:7.2f}"
        )
    return "\n".join(rows)


def samples_text() -> str:
    """The sample models as an indented list: name, kind, description; then the HF
    architectures on one line."""
    from optimus_lens.frontend.run import sample_list

    rows = sample_list()
    w = max(len(n) for n, _, _ in rows)
    return (
        "sample models (MODEL sample:NAME):\n"
        + "\n".join(f"  {n:{w}s}  {k:9s}  {d}" for n, k, d in rows)
        + "\n"
        + hf_text(short=True)
    )


def hf_text(short: bool = False) -> str:
    """The HuggingFace architectures of ``hf:NAME`` (:mod:`optimus_lens.frontend.hf`): one line, or a table."""
    from optimus_lens.frontend.hf import PARAMS, hf_list

    rows = hf_list()
    if short:
        return (
            f"HF architectures (MODEL hf:NAME, built offline with random weights; `optimus sweep --list-hf`): "
            f"{', '.join(s.removeprefix('hf:') for s, _, _ in rows)}"
        )
    w = max(len(s) for s, _, _ in rows)
    return (
        "HF transformers architectures, built offline from small configs with random weights\n"
        "(full size: hf:NAME?layers=12&hidden=768; parameters "
        + ", ".join(PARAMS)
        + "):\n"
        + "\n".join(f"  {s:{w}s}  {f:28s}  inputs: {k}" for s, f, k in rows)
    )
