#!/usr/bin/env bash
# Set up (first run) and run every check CI runs: lint, types, all tests.
#   ./scripts/test.sh            everything (unit, integration, vLLM on CPU, browser)
#   ./scripts/test.sh -m "not slow"   extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test
. .venv/bin/activate
echo "test: ruff"; ruff check rtserver tests
echo "test: mypy"; mypy rtserver
echo "test: import-linter"; lint-imports
echo "test: pytest"
exec python -m pytest -q -ra --durations=15 "$@"
