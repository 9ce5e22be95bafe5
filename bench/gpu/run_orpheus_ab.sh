#!/usr/bin/env bash
# Issue 24's Orpheus question in ONE call: vLLM's EngineCore in the GPU worker's process with
# SNAC on the same CUDA context (run_orpheus_timeline.sh INPROC=1: a tiny preflight first), then,
# if that served inproc and time is left, the same worker with EngineCore in its own process,
# on the same machine. Each pass is one run_orpheus_timeline.sh (PROFILE=0, py-spy at >= 128):
#   T_START=$(date +%s) OUT=$OUT bash bench/gpu/run_orpheus_ab.sh     (after the wheel parts)
# LEVELS_A (default 1,128,192,256) and LEVELS_B (default 128,256); the second pass starts only
# with MIN_B s left (default 220: an engine start with the compile caches restored, lib.sh, and
# two levels). $OUT: orpheus-timeline-inproc-si1.tgz, orpheus-timeline-separate-si1.tgz and the
# compile caches (jit-*.tgz).
set -uo pipefail
export T_START=${T_START:-$(date +%s)} LIMIT=${LIMIT:-590}
left() { echo $(( LIMIT - ($(date +%s) - T_START) )); }
TAG=-inproc INPROC=1 PROFILE=0 PYSPY=1 LEVELS=${LEVELS_A:-1,128,192,256} DURATION=${DURATION:-16} \
  bash bench/gpu/run_orpheus_timeline.sh
if ! grep -q "engine_process inproc" /tmp/otl-inproc/env.txt 2>/dev/null; then
  echo "the first pass served with EngineCore in its own process: no A/B"
elif [ "$(left)" -lt "${MIN_B:-220}" ]; then
  echo "$(left) s left: no second pass"
else
  TAG=-separate INPROC=0 PROFILE=0 PYSPY=1 LEVELS=${LEVELS_B:-128,256} DURATION=${DURATION:-16} \
    bash bench/gpu/run_orpheus_timeline.sh
fi
echo "done (left $(left) s)"
