#!/usr/bin/env bash
# One call on the H200 host (wheels installed into /tmp/site), from the repo root:
#  1. the vocoder's first lane against its main lane (SNAC alone, 24 kHz shape);
#  2. one rtserver (Orpheus-3B shapes, random audio-biased weights, V2 runner),
#     started once, then over loopback: a single user back to back (the 1-stream
#     TTFA, many turns) and the steady-traffic sweep 1..128 (users join spread
#     over STAGGER s and listen to each reply before their next turn).
# Everything goes under $OUT.
set -uo pipefail
. "$(dirname "$0")/common.sh"
echo "== lanes (left $(left) s)"
timeout 120 python3 -m rtserver.vocoder.measure lanes --device cuda --graphs --batch 64 \
  --frames 8 2>&1 | tee "$OUT/lanes.txt"
if [ "${PIPESTATUS[0]}" != 0 ] || [ -n "${NO_LANE:-}" ]; then
  echo "first lane off for this run" | tee -a "$OUT/lanes.txt"
  export RTSERVER_ORPHEUS_VOCODER_FIRST_LANE=false
fi
export RTSERVER_ORPHEUS_MODEL_DIR=$CKPT RTSERVER_ORPHEUS_SNAC_DIR=$CKPT/snac
export RTSERVER_ORPHEUS_TOKEN_GUARD=none RTSERVER_ORPHEUS_DEVICE=cuda
# Random weights never end speech: the token budget is natural speech length
# (~0.8 frames per character, TokenBudget's docstring) plus 1 s.
export RTSERVER_ORPHEUS_BUDGET_FRAMES_PER_CHAR=0.8 RTSERVER_ORPHEUS_BUDGET_BASE_FRAMES=12
PORT=${PORT:-8799}
python3 -m rtserver serve --voice orpheus:tara --host 127.0.0.1 --port $PORT \
  > "$OUT/server.log" 2>&1 &
SERVER=$!
t=$(date +%s)
python3 - "$PORT" <<'PY'
import sys, time, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}/ready"
for _ in range(420):
    try:
        if urllib.request.urlopen(url, timeout=1).status == 200: sys.exit(0)
    except Exception: pass
    time.sleep(1)
sys.exit("server not ready")
PY
echo "server ready in $(( $(date +%s) - t )) s (left $(left) s)"
URL=ws://127.0.0.1:$PORT/v1/stream
NOTE1="H200, Orpheus-3B shapes, random audio-biased weights (write_random_orpheus): speed real, sound noise"
NOTE2="token budget 0.8 frames/char + 12 frames per segment (natural speech length)"
common=(--url $URL --voice orpheus:tara --load stream --fragment token --tokens-per-s 40
        --tags numbers,abbreviations --ttfa-p99-ms 120 --no-plots --note "$NOTE1" --note "$NOTE2")
echo "== single (left $(left) s)"
timeout $(( $(left) - 10 )) python3 -m bench "${common[@]}" --concurrency 1 --back-to-back \
  --duration ${SINGLE_S:-40} --warmup 2 --out "$OUT/single" 2>&1 | tee "$OUT/bench.log"
echo "== stagger (left $(left) s)"
timeout $(( $(left) - 10 )) python3 -m bench "${common[@]}" --concurrency ${LEVELS:-1,8,32,64,128} \
  --duration ${DURATION:-18} --stagger-s ${STAGGER:-8} --warmup 0 --out "$OUT/stagger" 2>&1 \
  | tee -a "$OUT/bench.log"
echo "bench exit $? (left $(left) s)"
kill $SERVER; wait $SERVER
