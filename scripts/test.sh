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
# -n 2 --dist loadfile: two pytest-xdist workers, each taking whole files (a file's
# module fixtures stay in one process); two for CI's 2 cores. Most of the suite's time
# is servers and vLLM engines starting, so a 2-core machine runs two files at once
# about 1.5x faster (876 -> 570 s of pytest, 2026-12-07). `-n 0` (after) runs in one
# process. One process by default until two-worker runs prove green on fresh clones
# (three flakes in eight, 2026-12-07); RTSERVER_TEST_WORKERS=2 runs two. -v: progress.
exec python -m pytest -n "${RTSERVER_TEST_WORKERS:-0}" --dist loadfile -v -ra --durations=15 "$@"
