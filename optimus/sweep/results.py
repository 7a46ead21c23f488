"""A sweep directory's files: ``DIR/results.jsonl`` (:class:`Results`, one row per run, appended
by the driver alone) and ``DIR/configs.json`` (every config run into DIR), and reading
them back (:func:`load_sweep`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from optimus_lens.sweep.configs import SweepConfig, SweepError
from optimus_lens.sweep.task import TIMING_FIELDS


class Results:
    """``DIR/results.jsonl``: one JSON row per line, appended by the driver only. A key
    that appears more than once (a retried run) counts with its last row."""

    def __init__(self, out_dir: str | Path):
        self.path = Path(out_dir) / "results.jsonl"

    def rows(self) -> dict[str, dict]:
        """key -> last row; a line that is not JSON (a write cut short) is skipped."""
        out: dict[str, dict] = {}
        if not self.path.exists():
            return out
        for line in self.path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and "key" in row:
                out[row["key"]] = row
        return out

    def append(self, row: dict) -> None:
        """Append ``row`` as one line (after a newline, where a write was cut short) and sync."""
        with self.path.open("a+b") as f:
            f.seek(0, os.SEEK_END)
            cut = f.tell() > 0 and (f.seek(-1, os.SEEK_END), f.read(1))[1] != b"\n"
            f.write((("\n" if cut else "") + json.dumps(row, sort_keys=True) + "\n").encode())
            f.flush()
            os.fsync(f.fileno())


def comparable(row: dict) -> dict:
    """``row`` less :data:`TIMING_FIELDS`: what two runs of the same work agree on."""
    return {k: v for k, v in row.items() if k not in TIMING_FIELDS}


def save_configs(out: Path, configs: list[SweepConfig]) -> list[dict]:
    """Write ``DIR/configs.json``: every config any sweep into DIR ran, by name (the
    latest wins); returns its list."""
    path = out / "configs.json"
    try:
        known = {c["name"]: c for c in json.loads(path.read_text())}
    except (OSError, ValueError, TypeError, KeyError):
        known = {}
    known.update({c.name: c.to_json() for c in configs})
    path.write_text(json.dumps(list(known.values()), indent=1) + "\n")
    return list(known.values())


def load_sweep(out_dir: str | Path) -> tuple[list[dict], list[dict]]:
    """(rows, configs) of a sweep directory, rows in results.jsonl order (last row per
    key). Raises SweepError when ``out_dir`` holds no results.jsonl."""
    out = Path(out_dir)
    if not (out / "results.jsonl").is_file():
        raise SweepError(f"{out} is not a sweep directory: no results.jsonl in it")
    try:
        configs = json.loads((out / "configs.json").read_text())
    except (OSError, ValueError):
        configs = []
    return list(Results(out).rows().values()), configs
