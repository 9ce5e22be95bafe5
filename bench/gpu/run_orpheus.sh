#!/usr/bin/env bash
# H200, one call: Orpheus server (random 3B weights), single user back to back, steady 1..128.
set -uo pipefail
T_START=${T_START:-$(date +%s)}
. bench/results/h200-orpheus-v2-2026-12-02/common.sh
mkdir -p /tmp/orph
PORT=8799; URL=ws://127.0.0.1:$PORT/v1/stream
NOTE1="H200, Orpheus-3B shapes, random audio-biased weights (write_random_orpheus): speed real, sound noise"
NOTE2="token budget 0.8 frames/char + 12 frames per segment (natural speech length)"
common=(--url $URL --voice orpheus:tara --load stream --fragment token --tokens-per-s 40
        --tags numbers,abbreviations --ttfa-p99-ms 120 --no-plots --note "$NOTE1" --note "$NOTE2")
export RTSERVER_ORPHEUS_MODEL_DIR=$CKPT RTSERVER_ORPHEUS_SNAC_DIR=$CKPT/snac
export RTSERVER_ORPHEUS_TOKEN_GUARD=none RTSERVER_ORPHEUS_DEVICE=cuda
export RTSERVER_ORPHEUS_BUDGET_FRAMES_PER_CHAR=0.8 RTSERVER_ORPHEUS_BUDGET_BASE_FRAMES=12
# admission as the earlier runs had it (none): one client address drives every stream
export RTSERVER_ADMISSION_CONNECTIONS_PER_MINUTE=0 RTSERVER_ADMISSION_CONTEXTS_PER_MINUTE=0 RTSERVER_ADMISSION_CHARS_PER_MINUTE=0 RTSERVER_ADMISSION_FIRST_HEARD_TARGET_MS=0
python3 -m rtserver serve --voice orpheus:tara --host 127.0.0.1 --port $PORT > /tmp/server.log 2>&1 < /dev/null &
SPID=$!
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
[ -n "${SINGLE_S:-}" ] && timeout $(( $(left) - 200 )) python3 -m rtserver.bench "${common[@]}" --concurrency 1 --back-to-back \
  --duration ${SINGLE_S:-20} --warmup 2 --out /tmp/orph/single 2>&1 | tail -30 | tee /tmp/orph/bench-single.log
timeout $(( $(left) - 15 )) python3 -m rtserver.bench "${common[@]}" --concurrency ${LEVELS:-1,8,32,64,128} \
  --duration ${DURATION:-18} --stagger-s ${STAGGER:-8} --warmup 0 --out /tmp/orph/stagger 2>&1 | tail -60 | tee /tmp/orph/bench-stagger.log
kill $SPID; sleep 2
tail -300 /tmp/server.log > /tmp/orph/server.log; cp $OUT/env-*.txt /tmp/orph/ 2>/dev/null; tar czf $OUT/orph.tgz -C /tmp orph
echo "done (left $(left) s)"
