"""Expectations on a run, for CI: ``batch_linear>=2``, ``remove_split_cat=0``.

An expectation counts the steps of a trace whose pattern has a name (a step's
``pattern``; where no pattern of the run has that name, the steps of the pass of that
name) and compares the count with a number: ``>=``, ``<=``, ``>``, ``<``, ``=`` (or
``==``), ``!=``. :func:`check_trace` checks a list of them against a trace, plus every
step's and the final graph's verification (a step that failed verification or was
rolled back fails the check: a fusion that fires but breaks the model is no pass), and
says in one line why each failed. :func:`junit_xml` writes the result as JUnit XML,
one test case per expectation and one for verification, which CI systems display.

A name that is neither a pattern nor a pass the run knows is an error, not a count of
0: a misspelt ``remove_split_cats=0`` would otherwise always hold.
"""

from __future__ import annotations

import difflib
import operator
import re
from collections import Counter
from dataclasses import dataclass, field
from xml.etree import ElementTree as ET

from optimus_lens.core.trace import Trace

_OPS = {
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    "=": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    "<": operator.lt,
}
_EXPECT = re.compile(r"^\s*([A-Za-z_][\w.:-]*)\s*(>=|<=|==|!=|=|>|<)\s*(\d+)\s*$")


class ExpectationError(ValueError):
    """An expectation that cannot be read, or that names no pattern or pass of the run."""


@dataclass(frozen=True)
class Expectation:
    """``name op n``: the count of steps of pattern (or pass) ``name`` compared by ``op``
    with ``n``; ``text`` as written."""

    name: str
    op: str
    n: int
    text: str

    def holds(self, count: int) -> bool:
        return _OPS[self.op](count, self.n)


def parse_expectation(text: str) -> Expectation:
    """``'batch_linear>=2'`` -> Expectation. Raises ExpectationError naming the form."""
    m = _EXPECT.match(text)
    if not m:
        raise ExpectationError(
            f"cannot read expectation {text!r}: write PATTERN>=N, PATTERN=N, PATTERN<=N, PATTERN>N, PATTERN<N "
            "or PATTERN!=N (PATTERN a pattern or pass name, N a count of steps)"
        )
    name, op, n = m.groups()
    return Expectation(name, "==" if op == "=" else op, int(n), text.strip())


@dataclass
class Outcome:
    """One expectation checked: the steps it counted, whether it holds and, if not, why
    (one line)."""

    expectation: Expectation
    count: int
    ok: bool
    counted: str  # "pattern" or "pass"
    reason: str = ""

    def to_json(self) -> dict:
        e = self.expectation
        return {
            "expect": e.text,
            "name": e.name,
            "op": e.op,
            "n": e.n,
            "count": self.count,
            "counted": self.counted,
            "ok": self.ok,
            "reason": self.reason,
        }


@dataclass
class CheckResult:
    """Every expectation's outcome, and the verification failures (one line each: a
    step that failed verification or was rolled back, or the final graph)."""

    model: str
    outcomes: list[Outcome] = field(default_factory=list)
    verify_failures: list[str] = field(default_factory=list)
    verify: str = "end"

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outcomes) and not self.verify_failures

    def failure_lines(self) -> list[str]:
        """One line per failed expectation and per verification failure."""
        return [o.reason for o in self.outcomes if not o.ok] + self.verify_failures

    def to_json(self) -> dict:
        return {
            "model": self.model,
            "ok": self.ok,
            "verify": self.verify,
            "expectations": [o.to_json() for o in self.outcomes],
            "verify_failures": list(self.verify_failures),
        }


def step_counts(trace: Trace) -> tuple[Counter, Counter]:
    """(steps per pattern name, steps per pass name) of a trace, rolled-back steps left out
    (a rolled-back step changed nothing)."""
    done = [s for s in trace.steps if not s.error]
    return Counter(s.pattern for s in done), Counter(s.pass_name for s in done)


def known_names(trace: Trace) -> tuple[set[str], set[str]]:
    """(pattern names, pass names) the run could have made steps of: its passes'
    patterns as the trace records them, and the steps' own."""
    patterns = {p for entry in trace.passes for p in entry.get("patterns", [])} | {s.pattern for s in trace.steps}
    passes = {entry.get("name") for entry in trace.passes} | {s.pass_name for s in trace.steps}
    return patterns, passes - {None}  # type: ignore[return-value]


def check_trace(trace: Trace, expectations: list[Expectation], verify: str = "end") -> CheckResult:
    """Check ``expectations`` against ``trace`` (module doc). Raises ExpectationError for a
    name that is neither a pattern nor a pass of the run, listing the known ones."""
    patterns, passes = known_names(trace)
    by_pattern, by_pass = step_counts(trace)
    out = CheckResult(trace.model, verify=verify)
    for e in expectations:
        if e.name in patterns:
            count, counted = by_pattern[e.name], "pattern"
        elif e.name in passes:
            count, counted = by_pass[e.name], "pass"
        else:
            close = difflib.get_close_matches(e.name, sorted(patterns | passes), n=3)
            raise ExpectationError(
                f"{e.text}: {e.name!r} is no pattern or pass of this run"
                + (f" (did you mean {', '.join(close)}?)" if close else "")
                + f"; patterns: {', '.join(sorted(patterns))}"
            )
        ok = e.holds(count)
        reason = "" if ok else f"{e.text} failed: {e.name} made {count} step(s)" + _where(trace, e.name, counted)
        out.outcomes.append(Outcome(e, count, ok, counted, reason))
    for s in trace.steps:
        if s.error:
            out.verify_failures.append(
                f"step {s.index} ({s.pattern} at {', '.join(s.sites[:3])}) was rolled back: "
                f"{s.error.get('type')}: {s.error.get('message')}"
            )
        elif s.verify is not None and s.verify.ok is False:
            msg = s.verify.message.splitlines()[0] if s.verify.message else s.verify.checked
            out.verify_failures.append(f"step {s.index} ({s.pattern}) fails verification: {msg}")
    fv = trace.final_verify
    if (
        fv is not None
        and fv.ok is False
        and not any(s.verify is not None and s.verify.ok is False for s in trace.steps)
    ):
        msg = fv.message.splitlines()[0] if fv.message else fv.checked
        out.verify_failures.append(f"the final graph fails verification: {msg}")
    return out


def _where(trace: Trace, name: str, counted: str) -> str:
    steps = [s for s in trace.steps if (s.pattern if counted == "pattern" else s.pass_name) == name and not s.error]
    return f" (steps {', '.join(str(s.index) for s in steps[:8])})" if steps else ""


def junit_xml(result: CheckResult, suite: str | None = None) -> str:
    """The check as JUnit XML: one ``testsuite`` named ``suite`` (default ``optimus check
    MODEL``), one ``testcase`` per expectation and one ``verify`` case, a failed one with
    a ``failure`` element whose message is the one-line reason."""
    name = suite or f"optimus check {result.model}"
    cases = [(o.expectation.text, o.reason if not o.ok else None) for o in result.outcomes]
    cases.append((f"verify ({result.verify})", "; ".join(result.verify_failures) or None))
    root = ET.Element(
        "testsuite",
        name=name,
        tests=str(len(cases)),
        failures=str(sum(1 for _, f in cases if f)),
        errors="0",
    )
    for case, failure in cases:
        tc = ET.SubElement(root, "testcase", classname=name, name=case)
        if failure:
            ET.SubElement(tc, "failure", message=failure).text = failure
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
