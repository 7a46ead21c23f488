"""Plain-text facts about a step and a trace, shared by the app, the HTML report and the CLI."""

from __future__ import annotations

from optimus_lens.core.trace import Step, Trace, VerifyResult


def verify_text(v: VerifyResult | None) -> str:
    """``ok (outputs, max abs err 0, max rel err 0)``, ``FAILED (...)``, or ``not checked``."""
    if v is None or v.ok is None:
        return "not checked" + (f" ({v.message})" if v is not None and v.message else "")
    errs = []
    if v.max_abs_err is not None:
        errs.append(f"max abs err {v.max_abs_err:.3g}")
    if v.max_rel_err is not None:
        errs.append(f"max rel err {v.max_rel_err:.3g}")
    detail = ", ".join([v.checked, *errs]) + (f"; {v.message}" if v.message else "")
    return f"{'ok' if v.ok else 'FAILED'} ({detail})"


def step_facts(step: Step, pattern_info: dict | None = None) -> list[tuple[str, str]]:
    """(label, text) rows describing a step: pattern and pass, the pattern's description,
    preconditions, upstream counterpart and source (from ``pattern_info``, an entry of
    :func:`optimus_lens.passes.pass_catalogue`), sites, created, erased, replacements
    (provenance old -> new), verification, and match / rewrite time in ms; first, for a
    step that was rolled back, the error, its kind and the pattern's source line."""
    info = pattern_info or {}
    rows = [("pattern", f"{step.pattern} (pass {step.pass_name})")]
    err = getattr(step, "error", None)
    if err:  # a rolled-back step: the graph is as it was before it
        rows.append(
            (
                "ROLLED BACK",
                f"{err.get('kind', 'raised')}: {err.get('type', '')}: {err.get('message', '')}"
                + (f" (at {err['source']})" if err.get("source") else ""),
            )
        )
    if info.get("description"):
        rows.append(("what it does", info["description"]))
    if info.get("preconditions"):
        rows.append(("preconditions", "; ".join(info["preconditions"])))
    if info.get("upstream"):
        rows.append(("upstream", info["upstream"]))
    if info.get("source"):
        rows.append(("defined at", info["source"]))
    rows += [
        ("sites", f"{len(step.sites)}: {', '.join(step.sites)}"),
        ("created", f"{len(step.created)}: {', '.join(step.created)}" if step.created else "none"),
        ("erased", f"{len(step.erased)}: {', '.join(step.erased)}" if step.erased else "none"),
        ("replaced", ", ".join(f"{a} → {b}" for a, b in step.replaced.items()) or "none"),
        ("verify", verify_text(step.verify)),
        ("time", f"match {step.match_s * 1e3:.2f} ms, rewrite {step.rewrite_s * 1e3:.2f} ms"),
        ("nodes after", str(step.nodes_after)),
    ]
    return rows


def trace_summary(trace: Trace) -> dict:
    """Headline numbers: model, nodes before/after, steps, failed steps, steps per pass,
    final verification text, capture graphs."""
    per_pass: dict[str, int] = {}
    for s in trace.steps:
        per_pass[s.pass_name] = per_pass.get(s.pass_name, 0) + 1
    return {
        "model": trace.model,
        "nodes_before": trace.nodes_before,
        "nodes_after": trace.nodes_after,
        "steps": len(trace.steps),
        "failed_steps": len(trace.failed_steps()),
        "steps_per_pass": per_pass,
        "final_verify": verify_text(trace.final_verify),
        "graphs": trace.capture.get("graphs", 1),
    }
