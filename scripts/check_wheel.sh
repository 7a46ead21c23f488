#!/usr/bin/env bash
# Build the wheel, install it into a fresh virtualenv outside the checkout next to the
# distributions that own the names `optimus`, `app` and `viz` on PyPI, and use it from another
# directory: the installed top-level names, a verified run, a report, the app's health check.
# Usage: scripts/check_wheel.sh [WORKDIR]   (default: a new temporary directory)
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-$REPO/.venv/bin/python}"
WORK="${1:-$(mktemp -d)}"
mkdir -p "$WORK"
echo "== building the wheel into $WORK/dist"
"$PY" -m pip wheel -q --no-deps -w "$WORK/dist" "$REPO"
WHEEL="$(ls "$WORK"/dist/optimus_lens-*.whl)"
echo "== fresh virtualenv $WORK/venv"
python3 -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
"$VPY" -m pip install -q -c "$REPO/constraints.txt" "$WHEEL"
# the PyPI distributions that install `optimus` (pyoptimus), `app` and `viz`: files only
"$VPY" -m pip install -q --no-deps pyoptimus app viz
cd "$WORK"   # not the checkout: only what the wheel installed is importable
echo "== installed top-level names"
"$VPY" - <<'PY'
import importlib.metadata as md
import sys
ours = md.distribution("optimus-lens")
tops = {str(f).split("/")[0] for f in ours.files if not str(f).startswith(("optimus_lens-", "../"))}
tops = {t.removesuffix(".py") for t in tops if not t.endswith(".dist-info")}
print("optimus-lens installs:", sorted(tops))
assert tops == {"optimus_lens"}, f"the wheel must install one top-level package, not {sorted(tops)}"
for name in ("pyoptimus", "app", "viz"):  # their files are intact next to ours
    d = md.distribution(name)
    bad = [str(f) for f in d.files if f.hash and f.locate().exists() is False]
    assert not bad, f"{name} lost files: {bad[:5]}"
import optimus_lens, optimus_lens.viz, optimus_lens.app, optimus_lens.sample_models  # noqa: E401
assert "site-packages" in optimus_lens.__file__, optimus_lens.__file__
print("imported from", optimus_lens.__file__)
PY
"$VPY" -c "import importlib.resources as r; f = r.files('optimus_lens') / 'frontend' / 'starters'; assert any(p.name.endswith('.py') for p in f.iterdir()), 'starters missing'"
echo "== optimus run / report from $WORK"
"$WORK/venv/bin/optimus" run sample:recsys_towers --verify step --trace "$WORK/t.json"
"$WORK/venv/bin/optimus" report "$WORK/t.json" -o "$WORK/report.html"
test -s "$WORK/report.html"
echo "== app health check"
PORT=$("$VPY" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
setsid "$WORK/venv/bin/optimus" app --headless --port "$PORT" > "$WORK/app.log" 2>&1 &
APP=$!
trap 'kill -- -$APP 2>/dev/null || true' EXIT
for i in $(seq 1 90); do
    if "$VPY" -c "import urllib.request, sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:$PORT/_stcore/health', timeout=2).read().strip() != b'ok')" 2>/dev/null; then
        echo "app healthy on :$PORT"; exit 0
    fi
    sleep 1
done
cat "$WORK/app.log"; echo "the installed app did not answer its health check"; exit 1
