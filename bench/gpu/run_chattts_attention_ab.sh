#!/usr/bin/env bash
# ChatTTS's decode attention on a GPU (issue 25; session 23 built it, session 29 ran it on an
# H100 and made it the default on CUDA, bench/results/h100-2026-12-07-s29): the Triton kernel
# against torch's masked SDPA, each named, in three parts in one call.
#   1. the self-check: both on one layer's cache of the real shapes, the largest difference
#      and each one's time a call at 1, 64, 256 and 512 rows (att-check.json);
#   2. the engine alone with each (--decode-attention), rows 1, 256 and 512 (engine-*.json);
#   3. with time left, fresh workers and 4 front ends at LEVEL (default 640: past what SDPA
#      holds on an H100), interleaved: Triton (t), SDPA (s), and the tree before the
#      decoder's graph buckets (b: 2ddaf03, carried as .gpu/base.tgz = `git archive 2ddaf03
#      rtserver bench/gpu | gzip`), RTSERVER_CHATTTS_SLOTS / _MAX_LEN 768 / 1024 (1,024 x
#      1,536 does not fit an H100); runs.md, one folder a run.
# Carry .gpu/srv3 (the server's wheels) and .gpu/base.tgz; run
#   OUT=$OUT bash bench/gpu/run_chattts_attention_ab.sh
# At most 8 files come back from a call: the runs' folders go in runs.tgz.
T0=$(date +%s); OUT=${OUT:?OUT: where the results go}; SRV=${SRV:-.gpu/srv3}
export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1
. bench/gpu/lib.sh; server_wheels $SRV
[ -d /tmp/ck/asset ] || python3 -m rtserver.tools.bench.gpu_chattts prepare --ckpt /tmp/ck 2>&1 | tail -1
# SKIP_CHECK=1: no self-check (a short call; session 24 ran it, bench/results/h100-2026-12-06-s24)
[ "${SKIP_CHECK:-0}" = 1 ] || { timeout 120 python3 -m rtserver.tools.selfcheck.chattts_attention \
  --device cuda --out $OUT/att-check.json > $OUT/att-check.log 2>&1
  echo "self-check: rc $? ($(( $(date +%s) - T0 )) s)"; }
python3 -c "
import json
for lv in json.load(open('$OUT/att-check.json'))['levels']: print(' ', lv)" 2>/dev/null
E="python3 -m rtserver.tools.bench.gpu_chattts_engine --ckpt /tmp/ck --slots 512 --max-len 1536"
for att in sdpa triton; do
  timeout 170 $E --levels ${ENGINE_LEVELS:-1x128,256x512,512x512} --decode-attention $att \
    --out $OUT/engine-$att.json > $OUT/engine-$att.log 2>&1
  echo "engine, $att: rc $? ($(( $(date +%s) - T0 )) s)"
  grep '^{"streams"' $OUT/engine-$att.log | python3 -c "
import json, sys
for line in sys.stdin:
    d = json.loads(line)
    print(' ', {k: d.get(k) for k in ('streams', 'steps', 'real_time_x_min', 'first_step_ms_p50',
          'host_cpu_ms_per_step', 'gpu_ms_per_step', 'gpu_busy')})"
done
LEFT=$(( ${LIMIT:-570} - ($(date +%s) - T0) ))
if [ $LEFT -ge 130 ]; then
  L=${LEVEL:-640}
  RTSERVER_CHATTTS_SLOTS=768 RTSERVER_CHATTTS_MAX_LEN=1024 \
    RUNS=${RUNS:-$'t1|.|decode_attention = "triton"\ns1|.|decode_attention = "sdpa"\nb1|base|\nt2|.|decode_attention = "triton"\ns2|.|decode_attention = "sdpa"\nb2|base|'} \
    LEVEL=$L OUT=/tmp/att-runs timeout $(( LEFT - 15 )) bash bench/gpu/run_chattts_trees.sh
  cp /tmp/att-runs/runs.md $OUT/ 2>/dev/null
  for d in /tmp/att-runs/*/; do gzip -f $d/worker-metrics.txt $d/gpu-util.txt 2>/dev/null; done
  tar czf $OUT/runs.tgz -C /tmp/att-runs .
else
  echo "no server runs: $LEFT s left"
fi
echo "done ($(( $(date +%s) - T0 )) s)"
