#!/usr/bin/env bash
# Idempotent set-up for a fresh machine: graphviz (apt, if `dot` is missing), a virtualenv
# in .venv, and the package with its dev, models and sweep (Ray) extras. torch is pinned to 2.13.0
# through constraints.txt so pip takes the local CPU wheel, not a multi-GB CUDA build.
# Usage: scripts/setup.sh [--browser]   (--browser also installs chromium for the UI check)
set -euo pipefail
cd "$(dirname "$0")/.."
want_browser=0
[ "${1:-}" = "--browser" ] && want_browser=1

apt_pkgs=()
command -v dot >/dev/null 2>&1 || apt_pkgs+=(graphviz)
if [ "$want_browser" = 1 ] && ! command -v chromium >/dev/null 2>&1; then apt_pkgs+=(chromium); fi
if [ ${#apt_pkgs[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${apt_pkgs[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# The editable install is a tree of links to the package's files (setuptools' strict
# mode, which mypy and every tool can read like an installed package); a file added or
# removed under the package's folders needs a new tree, so the stamp holds the file list.
stamp=.venv/.installed
files=$(find optimus app viz sample_models -name __pycache__ -prune -o -type f -print | LC_ALL=C sort | sha1sum | cut -c1-40)
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ setup.py -nt "$stamp" ] || [ constraints.txt -nt "$stamp" ] \
   || [ "$(cat "$stamp")" != "$files" ]; then
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -c constraints.txt -e '.[dev,models,sweep]' --config-settings editable_mode=strict
  echo "$files" > "$stamp"
fi
