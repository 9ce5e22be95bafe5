#!/usr/bin/env bash
# Carry the vLLM wheel parts (stage.sh with vllm-wheels.txt plus websockets opuslib av httptools h11
# click pybase16384 cffi pycparser py-spy soxr), one run call per part, this script last.
# Orpheus through ONE GPU worker + 4 front ends (issue 24). After the 8 vLLM parts arrived.
T0=$(date +%s)
# a machine that has the vLLM set in /tmp/site already (the last part's call installed it) skips it
. bench/gpu/lib.sh; vllm_wheels
export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore::SyntaxWarning
# MPS=1: the worker and vLLM's EngineCore under NVIDIA's Multi-Process Service (lib.sh mps_start)
[ "${MPS:-0}" = 1 ] && { mps_start /tmp/mps && echo "mps: on" > $OUT/mps.txt || echo "mps: could not start" > $OUT/mps.txt; }
CK=/tmp/rnd3b
python3 -m rtserver.voices.orpheus.layout $CK --shape 3b --weights audio-biased | tail -1
python3 -m rtserver.tools.layouts.snac $CK/snac --shape 24khz | tail -1
echo "checkpoint $(( $(date +%s) - T0 )) s"
python3 -c "import sys, torch, vllm, transformers; print(sys.version.split()[0], torch.__version__, 'vllm', vllm.__version__, 'transformers', transformers.__version__)" > $OUT/env.txt 2>&1
python3 -m rtserver.tools.measure.host_cpu >> $OUT/env.txt 2>&1  # the host's one-thread speed, steal
export RTSERVER_ORPHEUS_MODEL_DIR=$CK RTSERVER_ORPHEUS_SNAC_DIR=$CK/snac
export RTSERVER_ORPHEUS_TOKEN_GUARD=none RTSERVER_ORPHEUS_DEVICE=cuda
export RTSERVER_ORPHEUS_BUDGET_FRAMES_PER_CHAR=0.8 RTSERVER_ORPHEUS_BUDGET_BASE_FRAMES=12
export RTSERVER_ADMISSION_CONNECTIONS_PER_MINUTE=0 RTSERVER_ADMISSION_CONTEXTS_PER_MINUTE=0 RTSERVER_ADMISSION_CHARS_PER_MINUTE=0 RTSERVER_ADMISSION_FIRST_HEARD_TARGET_MS=0
printf '[voice]\ndefault = "orpheus:tara"\n[gpu]\nmetrics_port = 9100\n%s\n' "${ORPH_EXTRA:-}" > /tmp/or.toml
worker_scrapes $OUT/worker-metrics.txt 1 & S=$!
( nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -lms 200 > $OUT/gpu-util.txt ) & N=$!
CONFIG=/tmp/or.toml VOICE=orpheus:tara FRONTENDS=4 O=/tmp/fe T_START=$T0 LIMIT=${LIMIT:-590} \
  LEVELS=${LEVELS:-1,64,128,192,256,320} DURATION=18 STAGGER=8 BURST=${BURST:-64} bash bench/gpu/run_frontends.sh
kill $S $N 2>/dev/null; mps_stop
for d in /tmp/fe/f*/; do sed -n '/^| streams/,/^$/p;/^| level/,/^$/p' $d/summary.md; done
tail -5 /tmp/fe/logs/worker.log
echo "done $(( $(date +%s) - T0 )) s"
