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
# Two pytest-xdist workers by default, for CI's 2 cores: whole files to each (a
# file's module fixtures stay in one process); on 2 cores 540-600 s of pytest against
# 876 s in one (fresh clones, 2026-12-07). RTSERVER_TEST_WORKERS=0: one process
# (to read a failure's output in order). -v: progress.
exec python -m pytest -n "${RTSERVER_TEST_WORKERS:-2}" --dist loadfile -v -ra --durations=15 "$@"
