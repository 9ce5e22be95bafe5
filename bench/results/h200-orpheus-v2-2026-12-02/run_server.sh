#!/usr/bin/env bash
# Call A: rtserver's Orpheus voice behind its WebSocket server (V2 model runner:
# no logits mask, token_guard none, wrong-slot tokens re-slotted), the bench
# harness over loopback at 1..128 streams, each fed a two-sentence reply
# token by token. Run from the repository root; everything goes under $OUT.
set -uo pipefail
. "$(dirname "$0")/common.sh"
export RTSERVER_ORPHEUS_MODEL_DIR=$CKPT RTSERVER_ORPHEUS_SNAC_DIR=$CKPT/snac
export RTSERVER_ORPHEUS_TOKEN_GUARD=${GUARD:-none} RTSERVER_ORPHEUS_DEVICE=${DEV:-cuda}
export RTSERVER_ORPHEUS_STREAM_INTERVAL=${STREAM_INTERVAL:-1}
# Random weights never end speech: the token budget is set to natural speech
# length (~0.8 frames per character, TokenBudget's docstring) plus 1 s.
export RTSERVER_ORPHEUS_BUDGET_FRAMES_PER_CHAR=0.8 RTSERVER_ORPHEUS_BUDGET_BASE_FRAMES=12
# py-spy (carried in .whl/) samples the server and its vLLM processes at the
# two top levels: where the time goes in Python. Non-blocking: no pauses.
if ls .whl/py_spy*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/pyspy .whl/py_spy*.whl
  ( for i in $(seq 900); do
      pid=$(grep -o 'started server pid [0-9]*' "$OUT/bench.log" 2>/dev/null | awk '{print $4}')
      [ -n "$pid" ] && break; sleep 1; done
    for n in ${PROFILE_LEVELS:-64 128}; do
      for i in $(seq 900); do grep -q "sweep $n: start" "$OUT/bench.log" && break; sleep 1; done
      sleep 3
      timeout 30 /tmp/pyspy/bin/py-spy record --pid "$pid" --subprocesses --nonblocking \
        --rate 50 --duration 8 --format raw -o "$OUT/pyspy-$n.txt" > "$OUT/pyspy-$n.log" 2>&1
    done ) &
fi
echo "== bench (left $(left) s)"
timeout $(( $(left) - 10 )) python3 -m bench --spawn --voice orpheus:tara --ready-timeout 400 \
  --load ${LOADS:-stream} --fragment token --tokens-per-s 40 --concurrency ${LEVELS:-1,8,32,64,128} \
  --duration ${DURATION:-8} --stagger-s ${STAGGER:-0} --warmup 2 --tags numbers,abbreviations --ttfa-p99-ms 120 --no-plots \
  --note "H200, Orpheus-3B shapes, random audio-biased weights (write_random_orpheus): speed real, sound noise" \
  --note "token budget 0.8 frames/char + 12 frames per segment (natural speech length)" \
  --out "$OUT/${TAG:-rt}" 2>&1 | tee "$OUT/bench.log"
echo "bench exit $? (left $(left) s)"
