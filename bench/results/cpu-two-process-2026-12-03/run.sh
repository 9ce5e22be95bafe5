#!/usr/bin/env bash
# Issue 17 on the CPU: Piper streams 1/2/4/8 against `rtserver serve --workers 2`
# (two processes on one port, SO_REUSEPORT), then the same shapes against one
# process, from the same commit. Run from the repository root:
#   bash bench/results/cpu-two-process-2026-12-03/run.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
py="${PYTHON:-.venv/bin/python}"
port="${PORT:-18801}"
mport="${METRICS_PORT:-18811}"  # worker i serves its own /metrics on mport + i
shape=(--load stream --fragment word --concurrency 1,2,4,8 --duration 20 --warmup 2
       --ttfa-p99-ms 250 --no-plots)

# two processes behind one port; the bench connects to the port like any client
mkdir -p "$here/two-process"
RTSERVER_SERVER_METRICS_PORT=$mport nice -n 5 "$py" -m rtserver serve --workers 2 --port "$port" > "$here/two-process/server.log" 2>&1 &
sup=$!
trap 'kill -TERM $sup 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  grep -q "2 of 2 workers ready" "$here/two-process/server.log" && break
  kill -0 $sup || { cat "$here/two-process/server.log"; exit 1; }
  sleep 0.2
done
nice -n 5 "$py" -m rtserver bench --url "ws://127.0.0.1:$port/v1/stream" "${shape[@]}" \
  --note "server: rtserver serve --workers 2 --port $port (two Piper processes, SO_REUSEPORT)" \
  --out "$here/two-process"
# how the kernel spread the contexts: each process's own counters
for i in 0 1; do
  echo "## worker $i (/metrics on port $((mport + i)))"
  curl -s "http://127.0.0.1:$((mport + i))/metrics" \
    | grep -E '^rtserver_(worker_info|contexts_total|audio_seconds_total|ttfa_ms_count)'
done > "$here/two-process/per-worker-metrics.txt"
kill -TERM $sup; wait $sup || true
trap - EXIT

# one process, the same shapes
nice -n 5 "$py" -m rtserver bench --spawn "${shape[@]}" \
  --note "server: one process (rtserver serve), spawned by the bench" \
  --out "$here/one-process"
