#!/usr/bin/env bash
# ChatTTS deep chunks A/B through one GPU worker (issue 25): the same levels with
# `[chattts] decoder_deep_steps` 0 (the default) and 63, a fresh worker each, in one call.
# Carry .gpu/srv3 (the server's wheels, py-spy among them) and run
#   T_START=$(date +%s) SRV=.gpu/srv3 OUT=$OUT LEVELS=384,512 bash bench/gpu/run_chattts_deep_ab.sh
# Per pass ($OUT/deep0, $OUT/deep63): fe.tgz (the bench's folders and logs), worker-metrics.txt,
# gpu-util.txt: six files. What to read: underran and first heard per level in each pass's
# summary (printed), the decode thread's busy seconds a second and the GPT's GPU ms a step
# (`python -m rtserver.tools.measure.worker_intervals deepN/worker-metrics.txt --every 2`).
# FRONTENDS (default 4), DURATION (default 16), STAGGER (default 8), PYSPY_AT (a level both
# passes profile, as run_frontends.sh does); each pass gets half of what is left of LIMIT
# (default 585 s from T_START).
set -uo pipefail
T0=${T_START:-$(date +%s)}; LIMIT=${LIMIT:-585}
for DEEP in 0 63; do
  LEFT=$(( LIMIT - ($(date +%s) - T0) ))
  [ "$DEEP" = 0 ] && BUDGET=$(( LEFT / 2 )) || BUDGET=$(( LEFT - 5 ))
  [ "$BUDGET" -lt 120 ] && { echo "no time left for deep=$DEEP"; break; }
  mkdir -p "$OUT/deep$DEEP"
  echo "== decoder_deep_steps = $DEEP ($BUDGET s)"
  OUT=$OUT/deep$DEEP FE=/tmp/fe-deep$DEEP T_START=$(date +%s) LIMIT=$BUDGET \
    FRONTENDS=${FRONTENDS:-4} SINGLE_S=0 BURST=0 LEVELS=${LEVELS:-384,512} \
    DURATION=${DURATION:-16} STAGGER=${STAGGER:-8} \
    CHATTTS_EXTRA="decoder_deep_steps = $DEEP" bash bench/gpu/run_chattts_worker_levels.sh
done
echo "done $(( $(date +%s) - T0 )) s"
