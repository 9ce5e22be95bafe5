#!/usr/bin/env bash
# SNAC's fused Triton kernels ([orpheus.vocoder] snake_conv, 437cae0) on a GPU, in the call
# after the eight vLLM parts (its header: run_orpheus_worker.sh):
#   1. SNAC alone at the real 24 kHz shape (random weights), CUDA graphs: ms a call of 1, 16
#      and 64 windows of 22 frames (a steady chunk of 16 with its context and lookahead),
#      torch's layers against the kernels (snac-timing-*.txt); the kernels' full decode against
#      float32 torch layers and their seams (snac-seams-triton.txt);
#   2. Orpheus through one worker and 4 front ends with SNAKE (default triton) at LEVELS
#      (run_orpheus_worker.sh's files: env.txt, worker-metrics.txt, gpu-util.txt, fe.tgz).
# T_START=$(date +%s) at the call's start counts the install into LIMIT (default 570).
# Then the baseline in the next call on the same machine, e.g.
#   SKIP_SNAC=1 SNAKE=torch LEVELS=128,192,256 BURST=0 OUT=$OUT bash bench/gpu/run_orpheus_snake.sh
T0=${T_START:-$(date +%s)}; OUT=${OUT:?OUT: where the results go}
. bench/gpu/lib.sh; vllm_wheels
export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore::SyntaxWarning
if [ "${SKIP_SNAC:-0}" != 1 ]; then
  snac_alone $OUT $T0
fi
RTSERVER_ORPHEUS_VOCODER_SNAKE_CONV=${SNAKE:-triton} OUT=$OUT \
  LIMIT=$(( ${LIMIT:-570} - ($(date +%s) - T0) )) LEVELS=${LEVELS:-1,128,192,256} \
  BURST=${BURST:-64} bash bench/gpu/run_orpheus_worker.sh
tar czf $OUT/fe.tgz -C /tmp fe 2>/dev/null; gzip -f $OUT/worker-metrics.txt $OUT/gpu-util.txt
echo "done ($(( $(date +%s) - T0 )) s)"
