# `make app` starts the app on the default model; `make test` runs the lint and type checks
# and the test suite (which includes building the wheel and using it from a fresh
# virtualenv outside the checkout). Both set up what they need first (scripts/setup.sh:
# venv, pinned torch, graphviz; --browser adds chromium for the UI checks).
.PHONY: setup app test lint fmt wheel bench-search

setup:
	scripts/setup.sh

app: setup
	.venv/bin/optimus app --model sample:recsys_towers

test:
	scripts/setup.sh --browser
	$(MAKE) lint
	.venv/bin/python -m pytest -q -n 2

# ruff (lint + format check) and mypy on the public API; configuration in pyproject.toml
lint:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy

fmt: setup
	.venv/bin/ruff check --fix .
	.venv/bin/ruff format .

# the wheel built, installed outside the checkout and used from another directory
wheel: setup
	scripts/check_wheel.sh

bench-search: setup
	.venv/bin/python benchmarks/search_scale.py --sizes 5000,21000,85000 --json benchmarks/search_scale.json
