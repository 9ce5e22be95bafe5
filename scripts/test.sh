#!/usr/bin/env bash
# Set up (first run) and run every check CI runs: lint, types, all tests.
#   ./scripts/test.sh            everything (unit, integration, vLLM on CPU, browser)
#   ./scripts/test.sh -m "not slow"   extra arguments go to pytest
#   ./scripts/test.sh --count 5 tests/integration tests/browser   repeat (hunting flakes)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test
. .venv/bin/activate
echo "test: ruff"; ruff check rtserver tests integrations
echo "test: mypy"; mypy rtserver
mypy integrations/pipecat/rtserver_pipecat integrations/livekit/rtserver_livekit
echo "test: import-linter"; lint-imports
echo "test: pytest"
# -v: each test's name as it starts, so a slow or stuck test is seen while it runs
exec python -m pytest -v -ra --durations=15 "$@"
