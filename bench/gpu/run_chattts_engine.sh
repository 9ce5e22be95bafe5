#!/usr/bin/env bash
# H200, the ChatTTS engine alone (issue 25): new engine vs the previous one, bf16 vs float32,
# with and without hidden states. Real shapes, random weights (written by `gpu_chattts prepare`).
#
# The device call carries one ignored folder, B (e.g. .gpu/engine25), made here beforehand:
#   B/new = `git archive HEAD rtserver`, B/old = `git archive 141737c rtserver` (the engine before
#   the split), B/whl = wheels the host lacks (pybase16384 + cffi + pycparser, cp312 manylinux),
#   and this script. Then: run `bash B/run_chattts_engine.sh` with carry [B]. About 3.5 min there.
# Results of 2026-12-04: bench/results/h200-chattts-engine-2026-12-04/.
set -uo pipefail
export PYTHONUNBUFFERED=1
B=$(cd "$(dirname "$0")" && pwd); T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $B/whl/*.whl || exit 1
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader; nproc;
  python3 -c "import sys,torch,numpy; print(sys.version.split()[0], torch.__version__, 'numpy', numpy.__version__)"; } > $OUT/env.txt 2>&1
CK=/tmp/ck
E="python3 -m rtserver.tools.bench.gpu_chattts_engine --ckpt $CK --slots 512 --max-len 1536"
(cd $B/new && PYTHONPATH=.:/tmp/site python3 -m rtserver.tools.bench.gpu_chattts prepare --ckpt $CK) 2>&1 | tail -1
cd $B/new; export PYTHONPATH=.:/tmp/site
echo "== new engine, bf16 ($(( $(date +%s) - T0 )) s)"
timeout 260 $E --levels 1,64,128,256,512,256x512,512x512 --steps 64 --out $OUT/new.json > $OUT/new.log 2>&1
echo "rc $?"; grep '^{"streams"' $OUT/new.log | cut -c1-400
echo "== new engine, step loop profiled ($(( $(date +%s) - T0 )) s)"
timeout 100 $E --levels 256x512 --profile $OUT/prof-256.txt > /dev/null 2>&1; echo "rc $?"
echo "== new engine, no hidden states ($(( $(date +%s) - T0 )) s)"
timeout 100 $E --levels 1,256x512,512x512 --no-hidden --out $OUT/nohidden.json > /dev/null 2>&1; echo "rc $?"
echo "== new engine, float32 ($(( $(date +%s) - T0 )) s)"
timeout 150 $E --levels 1,256x256,512x256 --dtype float32 --out $OUT/fp32.json > /dev/null 2>&1; echo "rc $?"
echo "== bf16 vs float32 ($(( $(date +%s) - T0 )) s)"
timeout 150 python3 -m rtserver.tools.bench.chattts_precision --ckpt $CK --requests 64 --steps 512 \
  --out $OUT/precision.json > /dev/null 2>&1; echo "rc $?"
echo "== previous engine ($(( $(date +%s) - T0 )) s)"
cd $B/old
timeout 150 $E --levels 1,64,128,256,512 --steps 64 > $OUT/old.log 2>&1; echo "rc $?"
timeout 100 $E --levels 256,512 --steps 512 > $OUT/old-512.log 2>&1; echo "rc $?"
grep -h '^{"streams"' $OUT/old.log $OUT/old-512.log | cut -c1-300
echo "done in $(( $(date +%s) - T0 )) s"
