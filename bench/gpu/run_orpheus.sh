#!/usr/bin/env bash
# H200, one call: Orpheus (random 3B weights), steady traffic 1..128 on one spawned server.
# On a CPU, for a dry run: SHAPE=tiny SNAC_SHAPE=tiny CKPT=/tmp/x DEVICE=cpu LEVELS=1 OUT=/tmp/o
set -uo pipefail
T_START=${T_START:-$(date +%s)}
. bench/results/h200-orpheus-v2-2026-12-02/common.sh
mkdir -p /tmp/orph
NOTE1="H200, Orpheus-3B shapes, random audio-biased weights (write_random_orpheus): speed real, sound noise"
NOTE2="token budget 0.8 frames/char + 12 frames per segment (natural speech length)"
common=(--voice orpheus:tara --load stream --fragment token --tokens-per-s 40
        --tags numbers,abbreviations --ttfa-p99-ms 120 --no-plots --note "$NOTE1" --note "$NOTE2")
export RTSERVER_ORPHEUS_MODEL_DIR=$CKPT RTSERVER_ORPHEUS_SNAC_DIR=$CKPT/snac
export RTSERVER_ORPHEUS_TOKEN_GUARD=none RTSERVER_ORPHEUS_DEVICE=${DEVICE:-cuda}
export RTSERVER_ORPHEUS_BUDGET_FRAMES_PER_CHAR=0.8 RTSERVER_ORPHEUS_BUDGET_BASE_FRAMES=12
# admission as the earlier runs had it (none): one client address drives every stream
export RTSERVER_ADMISSION_CONNECTIONS_PER_MINUTE=0 RTSERVER_ADMISSION_CONTEXTS_PER_MINUTE=0 RTSERVER_ADMISSION_CHARS_PER_MINUTE=0 RTSERVER_ADMISSION_FIRST_HEARD_TARGET_MS=0
# One server for the steady sweep, started by the bench itself (--spawn): it stops at once,
# with the server log's tail, if the server exits before /ready (an engine start takes ~3 min).
timeout $(( $(left) - 15 )) python3 -m rtserver.tools.bench "${common[@]}" --spawn \
  --ready-timeout 400 --concurrency ${LEVELS:-1,8,32,64,128} \
  --duration ${DURATION:-18} --stagger-s ${STAGGER:-8} --warmup 0 --out /tmp/orph/stagger 2>&1 \
  | tail -60 | tee /tmp/orph/bench-stagger.log
cp $OUT/env-*.txt /tmp/orph/ 2>/dev/null; tar czf $OUT/orph.tgz -C /tmp orph
echo "done (left $(left) s)"
