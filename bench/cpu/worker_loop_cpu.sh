#!/usr/bin/env bash
# The GPU worker's event-loop CPU per second of audio, on the CPU (issue 24's lead: at 512
# streams the worker's one GIL is shared by its event loop, the engine thread and the decoder's
# threads). A tiny ChatTTS (random weights: speed real for the loop, noise for sound) behind
# `rtserver serve` with [gpu] worker = "process" and one front end; the bench runs STREAMS users
# for DURATION s; the worker's main thread (its event loop: ZMQ, the voices' streams, the
# decoder's batcher) is read from /proc before and after. Prints
#   loop_cpu_ms=... audio_s=... ms_per_audio_s=... chunks=...
# then the bench's two table rows for the level (TTFA and first heard; underruns).
# Run from the repository root with its venv: STREAMS=24 DURATION=25 bash bench/cpu/worker_loop_cpu.sh
# (CHATTTS_EXTRA='stream_interval = 8': a line added to the [chattts] table)
set -euo pipefail
STREAMS=${STREAMS:-24}; DURATION=${DURATION:-25}; SEED=${SEED:-loop}
PY=${PY:-.venv/bin/python}
W=$(mktemp -d); trap 'kill $SP 2>/dev/null || true; wait $SP 2>/dev/null || true; rm -rf "$W"' EXIT
read -r PORT MPORT WPORT < <($PY -c "
import socket
ss=[socket.socket() for _ in range(3)]
[s.bind(('127.0.0.1',0)) for s in ss]; print(*[s.getsockname()[1] for s in ss])")
$PY - "$W" "$MPORT" "$WPORT" "${CHATTTS_EXTRA:-}" <<'EOF'
import json, sys
from pathlib import Path
import numpy as np
from rtserver.tools.layouts.chattts import write_tiny_chattts
from rtserver.voices.chattts.speaker import encode_speaker
w, mport, wport = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
extra = sys.argv[4]  # CHATTTS_EXTRA: lines added to [chattts]
root = w / "chattts"
write_tiny_chattts(root)
vec = np.random.default_rng(5).standard_normal(32).astype(np.float32)
(root / "voices.json").write_text(json.dumps({"alice": encode_speaker(vec)}))
(w / "rt.toml").write_text(f'''[server]
metrics_port = {mport}
[voice]
default = "chattts:alice"
[chattts]
asset_dir = "{root}"
device = "cpu"
slots = 64
max_len = 512
voices_file = "{root / 'voices.json'}"
seeds = "1"
ignore_eos = true
warm_up_steps = 2
{extra}
[gpu]
worker = "process"
frontends = 1
metrics_port = {wport}
[admission]
first_heard_target_ms = 0
contexts_per_minute = 0
chars_per_minute = 0
connections_per_minute = 0
''')
EOF
$PY -m rtserver serve --config "$W/rt.toml" --port "$PORT" > "$W/serve.log" 2>&1 & SP=$!
until grep -q "workers ready" "$W/serve.log"; do
  kill -0 $SP 2>/dev/null || { tail -20 "$W/serve.log"; exit 1; }; sleep 1
done
WPID=$(pgrep -P $SP -f "rtserver worker" | head -1)  # the supervisor's child
ticks() { awk '{print $14 + $15}' /proc/$WPID/task/$WPID/stat; }
t0=$(ticks)
$PY -m rtserver.tools.bench --url "ws://127.0.0.1:$PORT/v1/stream" --voice chattts:alice --load stream \
  --fragment token --tokens-per-s 40 --concurrency "$STREAMS" --duration "$DURATION" --stagger-s 4 \
  --warmup 1 --no-plots --seed "$SEED" --out "$W/b" > "$W/bench.log" 2>&1
t1=$(ticks)
ttfa=$(grep -h "^| $STREAMS " "$W/b/summary.md" | head -1)  # TTFA and first heard, ms
row=$(grep -h "^| $STREAMS " "$W/b/summary.md" | tail -1)  # underruns, rtf, audio
audio=$(echo "$row" | awk -F'|' '{gsub(/ /, "", $12); print $12}')
chunks=$($PY -c "import urllib.request; print(next(l.split()[1] for l in urllib.request.urlopen(
  'http://127.0.0.1:$MPORT/metrics').read().decode().splitlines()
  if l.startswith('rtserver_gpu_worker_chunk_delay_seconds_count')))")
ms=$(( (t1 - t0) * 1000 / $(getconf CLK_TCK) ))
echo "loop_cpu_ms=$ms audio_s=$audio ms_per_audio_s=$($PY -c "print(round($ms / $audio, 2))") chunks=$chunks"
echo "| streams | contexts | TTFA p50 | p95 | p99 | max | first heard p50 | first heard p99 | ..."
echo "$ttfa"
echo "| level | contexts | underran | underruns | stalled p99 | max gap p99 | behind p99 | prebuffer p50 | playback start p50 | rtf p50 | audio s | errors |"
echo "$row"
