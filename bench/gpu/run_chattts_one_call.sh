#!/usr/bin/env bash
# ChatTTS on a bare H200 in ONE call (when machines are scarce): the server's wheels
# (SRV, lib.sh server_wheels), the engine alone this tree against OLD_MODEL with the step loop's
# profile (run_chattts_engine_ab.sh), then one GPU worker and 4 front ends: one user back to
# back for SINGLE_S s, then LEVELS (default 64,128,256,384,512: issue 24's levels and 25's)
# and a burst of BURST users at once (default 64) (run_chattts_worker_levels.sh), then with
# time left and GIL_B set, a second worker with [gpu] gil_switch_ms = GIL_B at LEVELS_B. Carry
# .gpu/srv3 (it holds the pinned fastapi: no .gpu/extra) and the OLD_MODEL file (e.g. .gpu/ab); run
#   OUT=$OUT SRV=.gpu/srv3 OLD_MODEL=.gpu/ab/model.py bash bench/gpu/run_chattts_one_call.sh
# (or OLD_TREE=.gpu/ab-loop: files at their repository paths laid over the old tree, e.g. the
# step loop before e07e96a: `git show e07e96a~1:rtserver/voices/chattts/engine/engine.py`)
# (or B_ARGS=--hidden-store: this tree twice, the second with the store: engine-b.json; and
# CHATTTS_EXTRA='hidden_store = true' for the levels through the server)
# $OUT: ab.log, env.txt, engine-{new,old,b}.json, fe.tgz and rest.tgz (the profile, run.log,
# worker-metrics.txt.gz, gpu-util.txt.gz, the engine logs). Random weights of the real shapes:
# speed real, sound noise.
T0=$(date +%s); export PYTHONUNBUFFERED=1
OUT=${OUT:?OUT: where the results go}; SRV=${SRV:-.gpu/srv2}
. bench/gpu/lib.sh; server_wheels $SRV  # the server's wheels, extras and libopus (lib.sh)
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc
  PYTHONPATH=/tmp/site python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__)"
  ls -la /tmp/site/bin/py-spy
  PYTHONPATH=.:/tmp/site python3 -m rtserver.tools.measure.host_cpu  # one-thread speed, steal
} > $OUT/env.txt 2>&1
OUT=$OUT PROFILE=${PROFILE:-0} LEVELS=${ENGINE_LEVELS:-1x128,256x512} bash bench/gpu/run_chattts_engine_ab.sh > $OUT/ab.log 2>&1
grep -E '^(engine|  \{)' $OUT/ab.log; echo "engine part done ($(( $(date +%s) - T0 )) s)"
# SPY_ENGINE=1: the engine alone at 256 rows for ~1,400 steps under py-spy with native frames
# (spy-engine-256.txt, raw folded stacks a thread): is the step loop's launch phase host work,
# or the driver waiting for room to queue the next step behind the running one?
if [ "${SPY_ENGINE:-0}" = 1 ] && [ -x /tmp/site/bin/py-spy ]; then
  PYTHONPATH=.:/tmp/site timeout 150 /tmp/site/bin/py-spy record --native --threads -r 100 -f raw \
    -o $OUT/spy-engine-256.txt -- python3 -m rtserver.tools.bench.gpu_chattts_engine --ckpt /tmp/ck \
    --slots 512 --max-len 1536 --levels 256x1400 --out $OUT/engine-spy.json > $OUT/spy-engine.log 2>&1
  echo "engine under py-spy: rc $? ($(( $(date +%s) - T0 )) s)"
fi
OUT=$OUT FRONTENDS=4 SINGLE_S=${SINGLE_S:-20} PYSPY_AT=${PYSPY_AT:-512} BURST=${BURST:-64} LEVELS=${LEVELS:-64,128,256,384,512} DURATION=${DURATION:-16} \
  STAGGER=${STAGGER:-8} LIMIT=$(( ${LIMIT:-585} - ($(date +%s) - T0) )) \
  bash bench/gpu/run_chattts_worker_levels.sh > $OUT/run.log 2>&1
tail -25 $OUT/run.log
tar czf $OUT/fe.tgz -C /tmp fe; gzip -f $OUT/worker-metrics.txt $OUT/gpu-util.txt
# then, with time left, a fresh worker with a GIL switch interval of GIL_B ms at LEVELS_B (the
# A/B of [gpu] gil_switch_ms, the default 5 against a short one) in $OUT/gil
if [ -n "${GIL_B:-}" ] && [ $(( ${LIMIT:-585} - ($(date +%s) - T0) )) -ge 140 ]; then
  mkdir -p $OUT/gil
  RTSERVER_GPU_GIL_SWITCH_MS=$GIL_B OUT=$OUT/gil FE=/tmp/fe-gil FRONTENDS=4 \
    LEVELS=${LEVELS_B:-384,512} DURATION=${DURATION:-16} STAGGER=${STAGGER:-8} \
    LIMIT=$(( ${LIMIT:-585} - ($(date +%s) - T0) )) \
    bash bench/gpu/run_chattts_worker_levels.sh > $OUT/gil/run.log 2>&1
  tail -6 $OUT/gil/run.log; gzip -f $OUT/gil/worker-metrics.txt $OUT/gil/gpu-util.txt
else
  echo "no gil_switch_ms pass (GIL_B unset or no time left)"
fi
# at most 8 files come back from a call (session 14 lost the profile and the worker metrics)
(cd $OUT && tar czf rest.tgz --remove-files $(ls | grep -v -x -E 'ab.log|env.txt|fe.tgz|engine-(new|old|b).json'))
echo "done ($(( $(date +%s) - T0 )) s)"
