#!/usr/bin/env bash
# ChatTTS through one GPU worker and F front ends (issue 24/25), one sweep of levels, with the
# worker's /metrics scraped every 2 s and the GPU's utilization sampled every 200 ms beside it.
# Carry .gpu/srv2 (`bash ../shared/gpu/stage.sh bench/gpu/server-wheels.txt .gpu/srv2`: the
# server's wheels with its FastAPI stack) and this script; run
#   FRONTENDS=4 LEVELS=1,64,128,256,320,384 DURATION=15 CHATTTS_EXTRA='decoder_hold_ms = 0' \
#     bash bench/gpu/run_chattts_worker_levels.sh
# Results land in $OUT (fe.tgz: the bench's folders and logs; worker-metrics.txt; gpu-util.txt);
# FE: the bench's working folder (default /tmp/fe).
# SRV: the staged folder (default .gpu/srv2); any .gpu/extra/*.whl and a libopus0 .deb beside
# the parts are installed too (the server's FastAPI stack must be among the wheels).
T0=$(date +%s); SRV=${SRV:-.gpu/srv2}
. bench/gpu/lib.sh; server_wheels $SRV  # the server's wheels, extras and libopus (lib.sh)
export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore::SyntaxWarning
# the check needs /tmp/site on the path (above)
python3 -c "import fastapi, opuslib, zmq; print('server deps ok')" 2>&1 | tail -1
python3 -m rtserver.tools.bench.gpu_chattts prepare --ckpt /tmp/ck 2>&1 | tail -1
# the shared config, with CHATTTS_EXTRA (one `key = value` line) added to its [chattts] table
sed "/^\[chattts\]/a ${CHATTTS_EXTRA:-# no extra}" bench/gpu/chattts_worker.toml > /tmp/ct.toml
worker_scrapes $OUT/worker-metrics.txt & S=$!
( nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -lms 200 > $OUT/gpu-util.txt ) & N=$!
CONFIG=/tmp/ct.toml VOICE=chattts:seed_1 FRONTENDS=${FRONTENDS:-4} O=${FE:-/tmp/fe} T_START=$T0 \
  LIMIT=${LIMIT:-585} bash bench/gpu/run_frontends.sh
kill $S $N 2>/dev/null
for d in ${FE:-/tmp/fe}/f*/; do sed -n '/^| level/,/^$/p' $d/summary.md; done
echo "done $(( $(date +%s) - T0 )) s"
