#!/usr/bin/env bash
# Orpheus's stream_interval A/B in ONE call (after the wheel parts): the worker with
# EngineCore in its own process at stream_interval SI_A (default 1: every token handed over),
# then a fresh one at SI_B (default 7: one SNAC frame a delta after the first token). Each pass
# is one run_orpheus_timeline.sh (PROFILE=0, py-spy at >= 128) at LEVELS (default 1,128,256;
# the second pass gets what time is left). vLLM's Triton sampler (VLLM_USE_FLASHINFER_SAMPLER=0:
# a ~60 s engine start instead of ~240 s on an H100, bench/results/h100-2026-12-05-s15) in both.
#   T_START=$(date +%s) OUT=$OUT bash bench/gpu/run_orpheus_si.sh
# $OUT: orpheus-timeline-si{A,B}-si{A,B}.tgz and the compile caches (jit-*.tgz).
set -uo pipefail
export T_START=${T_START:-$(date +%s)} LIMIT=${LIMIT:-590} VLLM_USE_FLASHINFER_SAMPLER=0
left() { echo $(( LIMIT - ($(date +%s) - T_START) )); }
for SI in ${SI_A:-1} ${SI_B:-7}; do
  if [ "$(left)" -lt "${MIN_PASS:-150}" ]; then echo "$(left) s left: no pass at $SI"; break; fi
  TAG=-si$SI INPROC=0 PROFILE=0 PYSPY=1 STREAM_INTERVAL=$SI LEVELS=${LEVELS:-1,128,256} \
    DURATION=${DURATION:-16} bash bench/gpu/run_orpheus_timeline.sh
done
echo "done (left $(left) s)"
