#!/usr/bin/env bash
# Set up (first run) and serve on the embedded default voice:
#   ./scripts/serve.sh [--host 0.0.0.0] [--port 8765] [--voice ...]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh serve
exec .venv/bin/rtserver serve "$@"
