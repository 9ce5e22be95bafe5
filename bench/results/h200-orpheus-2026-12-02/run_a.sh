#!/usr/bin/env bash
# Call A on the H200 host (after the wheels are installed into /tmp/site):
# rtserver's Orpheus voice (Orpheus-3B shapes, random weights) behind its
# WebSocket server, the bench harness over loopback at 1..128 streams, then
# vLLM's own token timing (bench.gpu_orpheus, engine level) with the server
# stopped. Everything goes under $OUT. Run from the repository root.
set -uo pipefail
T0=${T_START:-$(date +%s)}; LIMIT=${LIMIT:-585}  # T_START: when the call's command began
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
export PYTHONUNBUFFERED=1 PYTHONPATH=.:/tmp/site
# SHAPE/DEV/LEVELS/DURATION/ENGINE_ARGS: overrides for a CPU dry run with the tiny shapes
SHAPE=${SHAPE:-3b} DEV=${DEV:-cuda}
export RTSERVER_ORPHEUS_DUMMY_WEIGHTS=1 RTSERVER_ORPHEUS_SHAPE=$SHAPE RTSERVER_ORPHEUS_DEVICE=$DEV
# Random weights never end speech: the token budget is set to natural speech
# length (~0.8 frames per character, TokenBudget's docstring) plus 1 s.
export RTSERVER_ORPHEUS_BUDGET_FRAMES_PER_CHAR=0.8 RTSERVER_ORPHEUS_BUDGET_BASE_FRAMES=12
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv;
  nproc; python3 -c "import sys, torch, vllm, transformers; print(sys.version.split()[0], torch.__version__, 'vllm', vllm.__version__, 'transformers', transformers.__version__)";
  git log -1 --format='commit %H' 2>/dev/null; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
echo "== bench (left $(left) s)"
timeout $(( $(left) - 10 )) python3 -m bench --spawn --voice orpheus:tara --ready-timeout 400 \
  --load stream,whole --fragment token --tokens-per-s 40 --concurrency ${LEVELS:-1,8,32,64,128} \
  --duration ${DURATION:-10} --warmup 2 --tags numbers,abbreviations --ttfa-p99-ms 120 --no-plots \
  --note "H200, Orpheus-3B shapes with random weights (vLLM load_format=dummy): speed real, sound noise" \
  --note "token budget 0.8 frames/char + 12 frames per segment (natural speech length)" \
  --out "$OUT/rt"
echo "bench exit $?"
# vLLM's own time to 7 and 28 tokens under this load: the server's
# rtserver_engine_time_to_{7,28}_tokens_seconds histograms (per step in
# rt/results.json). RUN_ENGINE=1 also runs bench.gpu_orpheus (bursts, engine
# level) once the server is gone, if time is left.
[ -n "${RUN_ENGINE:-}" ] && [ "$(left)" -gt 150 ] || exit 0
for i in $(seq 30); do  # the server's vLLM processes gone: the GPU free again
  used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1)
  [ "${used:-0}" -lt 4000 ] && break; sleep 1; done
echo "== gpu_orpheus engine (left $(left) s, GPU used ${used:-?} MiB)"
timeout $(( $(left) - 5 )) python3 -m bench.gpu_orpheus --dummy-weights --shape $SHAPE --device $DEV \
  --mode engine --levels ${LEVELS:-1,8,32,64,128} --tokens 140 --repeats 3 ${ENGINE_ARGS:-} \
  --out "$OUT/engine.json"
echo "gpu_orpheus exit $? (left $(left) s)"
