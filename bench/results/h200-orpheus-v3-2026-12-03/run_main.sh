#!/usr/bin/env bash
# On the H200 host (wheels installed into /tmp/site), from the repo root, one
# phase per `run` call (the server outlives a call: setsid):
#   PHASE=start   the vocoder's first lane against its main lane (lanes.txt), then
#                 one rtserver (Orpheus-3B shapes, random audio-biased weights,
#                 V2 runner) started and warmed, then a single user back to back
#                 (the 1-stream TTFA over many turns: single/)
#   PHASE=stagger steady traffic 1..128 users (joining spread over STAGGER s,
#                 listening to each reply before the next turn: stagger/)
#   PHASE=burst   all users of a level at one instant (burst/)
# Everything goes under $OUT.
set -uo pipefail
# versions, time left, the random checkpoint: the second session's common.sh
. "$(dirname "$0")/../h200-orpheus-v2-2026-12-02/common.sh"
PORT=${PORT:-8799}
URL=ws://127.0.0.1:$PORT/v1/stream
NOTE1="H200, Orpheus-3B shapes, random audio-biased weights (write_random_orpheus): speed real, sound noise"
NOTE2="token budget 0.8 frames/char + 12 frames per segment (natural speech length)"
common=(--url $URL --voice orpheus:tara --load stream --fragment token --tokens-per-s 40
        --tags numbers,abbreviations --ttfa-p99-ms 120 --no-plots --note "$NOTE1" --note "$NOTE2")
case ${PHASE:-start} in
start)
  lanes_rc=0
  if [ -z "${SKIP_LANES:-}" ]; then
    echo "== lanes (left $(left) s)"
    timeout 120 python3 -m rtserver.vocoder.measure lanes --device cuda --graphs --batch 64 \
      --frames 8 2>&1 | tee "$OUT/lanes.txt"
    lanes_rc=${PIPESTATUS[0]}
  fi
  if [ "$lanes_rc" != 0 ] || [ -n "${NO_LANE:-}" ]; then
    echo "first lane off for this run" | tee -a "$OUT/lanes.txt"
    export RTSERVER_ORPHEUS_VOCODER_FIRST_LANE=false
  fi
  export RTSERVER_ORPHEUS_MODEL_DIR=$CKPT RTSERVER_ORPHEUS_SNAC_DIR=$CKPT/snac
  export RTSERVER_ORPHEUS_TOKEN_GUARD=none RTSERVER_ORPHEUS_DEVICE=cuda
  # Random weights never end speech: the token budget is natural speech length
  # (~0.8 frames per character, TokenBudget's docstring) plus 1 s.
  export RTSERVER_ORPHEUS_BUDGET_FRAMES_PER_CHAR=0.8 RTSERVER_ORPHEUS_BUDGET_BASE_FRAMES=12
  setsid python3 -m rtserver serve --voice orpheus:tara --host 127.0.0.1 --port $PORT \
    > /tmp/server.log 2>&1 < /dev/null &
  t=$(date +%s)
  python3 - "$PORT" <<'PY'
import sys, time, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}/ready"
for _ in range(400):
    try:
        if urllib.request.urlopen(url, timeout=1).status == 200: sys.exit(0)
    except Exception: pass
    time.sleep(1)
sys.exit("server not ready")
PY
  echo "server ready in $(( $(date +%s) - t )) s (left $(left) s)"
  echo "== single (left $(left) s)"
  timeout $(( $(left) - 10 )) python3 -m bench "${common[@]}" --concurrency 1 --back-to-back \
    --duration ${SINGLE_S:-30} --warmup 2 --out "$OUT/single" 2>&1 | tee "$OUT/bench-single.log"
  ;;
stagger)
  timeout $(( $(left) - 10 )) python3 -m bench "${common[@]}" --concurrency ${LEVELS:-1,8,32,64,128} \
    --duration ${DURATION:-18} --stagger-s ${STAGGER:-8} --warmup 0 --out "$OUT/stagger" 2>&1 \
    | tee "$OUT/bench-stagger.log"
  ;;
burst)
  timeout $(( $(left) - 10 )) python3 -m bench "${common[@]}" --concurrency ${LEVELS:-1,8,32,64,128} \
    --duration ${DURATION:-8} --warmup 0 --out "$OUT/burst" 2>&1 | tee "$OUT/bench-burst.log"
  ;;
esac
echo "phase ${PHASE:-start} done (left $(left) s)"
cp /tmp/server.log "$OUT/server.log" 2>/dev/null || true
