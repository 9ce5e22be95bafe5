#!/usr/bin/env bash
# The ChatTTS hidden-state store (issue 25) on the H200: the engine alone with each step's
# hidden states copied to the host and with them kept in the device store (host time a step at
# 256 and 512 rows), then ChatTTS through one GPU worker and F front ends with the store on
# (`[chattts] hidden_store = true`). Random weights of the real shapes (`gpu_chattts prepare`).
# Carry .gpu/srv2 and .gpu/extra as for run_chattts_worker_levels.sh; run
#   SRV=.gpu/srv2 OUT=$OUT LEVELS=1,256,512 LIMIT=560 bash bench/gpu/run_chattts_store.sh
# (PROFILE=0 skips the cProfile run of the store's step loop.)
T0=$(date +%s); SRV=${SRV:-.gpu/srv2}; export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1
[ -d /tmp/site/zmq ] || { bash $SRV/recv.sh 0 >/dev/null && bash $SRV/install.sh | tail -1; }
[ -d /tmp/ck/asset ] || python3 -m rtserver.tools.bench.gpu_chattts prepare --ckpt /tmp/ck 2>&1 | tail -1
E="python3 -m rtserver.tools.bench.gpu_chattts_engine --ckpt /tmp/ck --slots 512 --max-len 1536"
for mode in host store; do
  flag="--kernels $OUT/kernels-$mode.txt"; [ $mode = store ] && flag="$flag --hidden-store"
  timeout 150 $E --levels 1,256x512,512x512 $flag --out $OUT/engine-$mode.json \
    > $OUT/engine-$mode.log 2>&1
  echo "engine, $mode: rc $? ($(( $(date +%s) - T0 )) s)"
  grep '^{"streams"' $OUT/engine-$mode.log | python3 -c "
import json, sys
for line in sys.stdin:
    d = json.loads(line)
    print(' ', {k: d[k] for k in ('streams', 'steps', 'real_time_x_min', 'first_step_ms_p50',
          'host_cpu_ms_per_step', 'host_ms_per_step', 'gpu_ms_per_step', 'gpu_busy',
          'host_syncs_per_step', 'other_syncs_flagged')})"
done
if [ "${PROFILE:-1}" = 1 ]; then  # PROFILE=0: no cProfile run (saves ~60 s of device time)
  timeout 90 $E --levels 256x512 --hidden-store --profile $OUT/profile-store-256x512.txt \
    > /dev/null 2>&1; echo "engine, store, profiled: rc $? ($(( $(date +%s) - T0 )) s)"
fi
rm -rf /tmp/fe
# the server with the store, unless the engine could not run with it
EXTRA='hidden_store = true'
grep -q '"streams": 512' $OUT/engine-store.json 2>/dev/null || { EXTRA='# store off: its engine run failed'; echo "$EXTRA"; }
CHATTTS_EXTRA="$EXTRA" LIMIT=$(( ${LIMIT:-560} - ($(date +%s) - T0) )) \
  bash bench/gpu/run_chattts_worker_levels.sh
