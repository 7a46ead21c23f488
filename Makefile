# `make app` starts the app on the default model; `make test` runs the test suite.
# Both set up what they need first (scripts/setup.sh: venv, pinned torch, graphviz).
.PHONY: setup app test test-ui bench-search fuzz

setup:
	scripts/setup.sh

app: setup
	.venv/bin/optimus app --model sample:recsys_towers

# the suite includes one check that drives the app in headless chromium, so set-up
# installs Debian's chromium too
test:
	scripts/setup.sh --browser
	.venv/bin/python -m pytest -q

bench-search: setup
	.venv/bin/python benchmarks/search_scale.py --sizes 5000,21000,85000 --json benchmarks/search_scale.json
