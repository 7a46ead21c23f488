"""The wheel is what users install: built from this checkout, installed into a fresh
virtualenv outside it next to the PyPI distributions that own the import names
``optimus`` (pyoptimus), ``app`` and ``viz``, and used from another directory
(``scripts/check_wheel.sh``: one top-level package, their files intact, a verified run,
a report, the app's health check)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "check_wheel.sh"


@pytest.mark.wheel
def test_the_wheel_installs_one_namespace_beside_pyoptimus_app_and_viz_and_runs_from_elsewhere(tmp_path):
    p = subprocess.run([str(SCRIPT), str(tmp_path / "wheel")], capture_output=True, text=True, timeout=900)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    assert "optimus-lens installs: ['optimus_lens']" in out
    assert "app healthy" in out
