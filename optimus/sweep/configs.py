"""Sweep configurations (named pipeline settings) and the model specs a sweep runs.

A **configuration** (:class:`SweepConfig`) is a named pipeline setting: enabled passes,
passes switched off, pattern files added as last passes, the batch fusions' search
(``global`` / ``upstream``) and ``profitable_only``. A JSON list of them is read by
:func:`load_configs`; without one the sweep runs :data:`DEFAULT_CONFIG`. The models are
spec strings, expanded by :func:`expand_specs` (``sample:*``, ``hf:*``, a models file).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

CONFIG_KEYS = ("name", "passes", "skip", "pattern_files", "search", "profitable_only", "description")


class SweepError(ValueError):
    """Bad sweep input: a configs or models file that cannot be read or is malformed,
    duplicate config names, an unknown pass, or no model at all."""


@dataclass(frozen=True)
class SweepConfig:
    """A named pipeline setting. ``passes`` the enabled passes of the default pipeline
    (None: all; a pattern file's pass is named after its file), ``skip`` passes switched
    off, ``pattern_files`` files whose patterns run as extra last passes
    (:func:`optimus_lens.frontend.patternfile.pipeline_with`), ``search`` the batch fusions' search
    (None: each pattern's own, ``"global"``, ``"upstream"``), ``profitable_only`` skips
    fusions estimated to slow the graph down (:mod:`optimus_lens.passes.profit`)."""

    name: str = "default"
    passes: tuple[str, ...] | None = None
    skip: tuple[str, ...] = ()
    pattern_files: tuple[str, ...] = ()
    search: str | None = None
    profitable_only: bool = False
    description: str = ""

    @classmethod
    def from_json(cls, d: dict, where: str = "config") -> SweepConfig:
        """A config from its JSON object. Raises SweepError for unknown keys or wrong types."""
        if not isinstance(d, dict):
            raise SweepError(f"{where}: a config is a JSON object, not {type(d).__name__}")
        unknown = sorted(set(d) - set(CONFIG_KEYS))
        if unknown:
            raise SweepError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(CONFIG_KEYS)}")
        if not isinstance(d.get("name"), str) or not d["name"].strip():
            raise SweepError(f'{where}: every config needs a non-empty "name"')
        lists = {}
        for k in ("passes", "skip", "pattern_files"):
            v = d.get(k)
            if v is None:
                continue
            if not (isinstance(v, list) and all(isinstance(x, str) for x in v)):
                raise SweepError(f"{where} {d['name']!r}: {k} must be a list of strings")
            lists[k] = tuple(v)
        if d.get("search") not in (None, "global", "upstream"):
            raise SweepError(f'{where} {d["name"]!r}: search must be "global" or "upstream", not {d["search"]!r}')
        return cls(
            name=d["name"].strip(),
            search=d.get("search"),
            profitable_only=bool(d.get("profitable_only")),
            description=str(d.get("description", "")),
            **lists,
        )

    def to_json(self) -> dict:
        return {
            k: (list(v) if isinstance(v, tuple) else v)
            for k, v in asdict(self).items()
            if v not in (None, (), False, "") or k == "name"
        }

    def pipeline(self, cwd: str | None = None):
        """The :class:`optimus_lens.core.pipeline.Pipeline` this config runs; pattern files are read
        relative to ``cwd``. Raises KeyError (unknown pass) and PatternFileError."""
        from optimus_lens.frontend.patternfile import load_pattern_file, pipeline_with
        from optimus_lens.frontend.run import select_passes
        from optimus_lens.passes import default_pipeline

        pipe = default_pipeline(search=self.search, profitable_only=self.profitable_only)
        for f in self.pattern_files:
            pipe = pipeline_with(load_pattern_file(os.path.join(cwd or os.getcwd(), f)), base=pipe)
        if self.passes is not None or self.skip:
            pipe = pipe.only(
                select_passes(pipe.names(), list(self.passes) if self.passes is not None else None, list(self.skip))
            )
        return pipe


DEFAULT_CONFIG = SweepConfig("default", description="the default pipeline")


def load_configs(path: str | Path) -> list[SweepConfig]:
    """The configs of a JSON file: a list of config objects (or ``{"configs": [...]}``),
    each checked by building its pipeline. Raises SweepError naming the problem."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SweepError(f"cannot read configs {path}: {e}") from e
    if isinstance(data, dict) and "configs" in data:
        data = data["configs"]
    if not isinstance(data, list) or not data:
        raise SweepError(f"{path}: expected a non-empty JSON list of configs")
    configs = [SweepConfig.from_json(d, f"{path} entry {i}") for i, d in enumerate(data)]
    names = [c.name for c in configs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise SweepError(f"{path}: config names must be unique; repeated: {', '.join(dup)}")
    return configs


def check_configs(configs: list[SweepConfig], cwd: str | None = None) -> None:
    """Build every config's pipeline once, so a bad pass name or pattern file stops the
    sweep before any run. Raises SweepError."""
    from optimus_lens.frontend.patternfile import PatternFileError

    for c in configs:
        try:
            c.pipeline(cwd)
        except (KeyError, PatternFileError, ValueError) as e:
            raise SweepError(f"config {c.name!r}: {e.args[0] if isinstance(e, KeyError) else e}") from e


def _log_graphs(spec: str) -> list[str]:
    """``log:PATH#*``: one spec per Dynamo graph of the log (its frames, graph breaks
    included). Raises SweepError when the path holds no log."""
    from optimus_lens.frontend.compile_log import LogError, read_log

    path = spec.removeprefix("log:")[:-2]
    try:
        log = read_log(path)
    except LogError as e:
        raise SweepError(str(e)) from e
    graphs = log.graphs()
    if not graphs:
        raise SweepError(f"{path}: the log holds no dynamo_output_graph")
    return [f"log:{path}#{e.compile_id}" for e in graphs]


def expand_specs(specs: Iterable[str], models_file: str | None = None) -> list[str]:
    """The model specs of a sweep, in order, without repeats: ``specs`` then the lines of
    ``models_file`` (``#`` starts a comment). ``sample:*`` stands for every sample model
    and ``hf:*`` for every architecture of :mod:`optimus_lens.frontend.hf`, ``log:PATH#*`` for
    every Dynamo graph of a compile log. Raises SweepError for an
    unreadable models file, an unknown sample or HF architecture or a bad ``hf:`` size
    parameter (checked here, cheaply), or when no spec is left; other specs are loaded
    by their runs, where a failure is that run's row."""
    from optimus_lens.frontend.hf import HFSpecError, hf_list, parse_spec
    from optimus_lens.frontend.run import sample_list

    items = [s.strip() for s in specs]
    if models_file:
        try:
            text = Path(models_file).read_text()
        except OSError as e:
            raise SweepError(f"cannot read models file {models_file}: {e}") from e
        # `#` starts a comment at the start of a line or after a space (log:PATH#SELECTOR keeps its own)
        items += [re.split(r"(?:^|\s)#", line, maxsplit=1)[0].strip() for line in text.splitlines()]
    out: list[str] = []
    for s in filter(None, items):
        if s == "sample:*":
            out += [f"sample:{n}" for n, _, _ in sample_list()]
        elif s == "hf:*":
            out += [spec for spec, _, _ in hf_list()]
        elif s.startswith("log:") and s.endswith("#*"):
            out += _log_graphs(s)
        else:
            out.append(s)
    out = list(dict.fromkeys(out))
    samples = {n for n, _, _ in sample_list()}
    for s in out:
        if s.startswith("sample:") and s.removeprefix("sample:") not in samples:
            raise SweepError(f"unknown sample model {s!r}; `optimus samples` lists them")
        if s.startswith("hf:"):
            try:
                parse_spec(s)
            except HFSpecError as e:
                raise SweepError(str(e)) from e
    if not out:
        raise SweepError(
            "no model to sweep: give specs (sample:NAME, sample:*, hf:NAME, hf:*, pkg.mod:factory, "
            "file.py:factory, model.pt2) or --models-file"
        )
    return out
