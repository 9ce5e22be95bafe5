#!/usr/bin/env bash
# Orpheus A/Bs of settings in one call, each run a fresh GPU worker and 4 front ends
# (run_orpheus_snake.sh with SKIP_SNAC=1), one results folder a run under $OUT; in the call
# after the eight vLLM parts (run_orpheus_worker.sh's header), or on a machine that has the
# vLLM set in /tmp/site already. RUNS: one run a
# line, "name|VAR=value VAR=value" (empty after |: the tree's defaults; LEVELS, SINGLE_S or
# BURST there override the call's for that run); interleave the
# settings and repeat them: at the edge of capacity one run's underruns move by about half
# (bench/results/h100-2026-12-07-s26). A run starts only while RUN_S seconds are left.
#   RUNS=$'d1|\np1|RTSERVER_ORPHEUS_VOCODER_MAX_PAD_FRACTION=0.5\nd2|' LEVELS=192,256 \
#     T_START=$(date +%s) LIMIT=580 OUT=$OUT bash bench/gpu/run_orpheus_settings.sh
# VOCAB_COST (rows, e.g. 128,192,256): tools.bench.gpu_vocab_cost first, in $OUT/vocab.json.
# ENGINE_LEVELS (e.g. 128,192,256): first vLLM alone at those rows (tools.bench.gpu_orpheus,
# random weights of the 3B shape; ENGINE_ARGS, default "--mode load": steady tokens/s with
# N-1 rows decoding), in $OUT/engine.json. Each run's files come back as $OUT/NAME.tgz.
# SPY_LEVEL (e.g. 256): 10 s into that level of each run, py-spy (raw, --threads, 200 Hz,
# 10 s) of vLLM's EngineCore and of the GPU worker, as spy-enginecore.txt.gz and
# spy-worker.txt.gz in the run's folder (`python -m rtserver.tools.measure.spy_stacks
# spy-enginecore.txt.gz --within EngineCoreProc.run_busy_loop`).
T0=${T_START:-$(date +%s)}; OUT=${OUT:?OUT: where the results go}
left() { echo $(( ${LIMIT:-580} - ($(date +%s) - T0) )); }
. bench/gpu/lib.sh; vllm_wheels
export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore::SyntaxWarning
export VLLM_USE_FLASHINFER_SAMPLER=${VLLM_USE_FLASHINFER_SAMPLER:-0}
if [ -n "${VOCAB_COST:-}" ]; then  # the vocabulary's share of a decode step, vLLM's kernels
  timeout 120 python3 -m rtserver.tools.bench.gpu_vocab_cost --rows "$VOCAB_COST" \
    --out $OUT/vocab.json 2>&1 | tail -8; echo "vocab cost done ($(( $(date +%s) - T0 )) s)"
fi
if [ -n "${ENGINE_LEVELS:-}" ]; then
  timeout $(( $(left) - ${RUN_S:-150} )) python3 -m rtserver.tools.bench.gpu_orpheus \
    --dummy-weights --shape 3b ${ENGINE_ARGS:---mode load} --levels "$ENGINE_LEVELS" \
    --out $OUT/engine.json > $OUT/engine.log 2>&1
  tail -12 $OUT/engine.log; echo "engine alone done ($(( $(date +%s) - T0 )) s)"
fi
spy_at() {  # level, folder: the two processes found by their command lines, sampled by pid
  local ec w
  until grep -qsE "sweep $1: (1[0-9]|2[0-9])/" /tmp/fe/logs/bench-4.log; do sleep 0.5; done
  ec=$(ps -eo pid,args | awk '$2 ~ /^VLLM::EngineCore/ {print $1; exit}')
  w=$(ps -eo pid,args | awk '$2 == "python3" && $4 == "rtserver" && $5 == "worker" {print $1; exit}')
  for p in "enginecore $ec" "worker $w"; do set -- $p; [ -n "${2:-}" ] && /tmp/site/bin/py-spy \
    record -p $2 -d 10 -r 200 -f raw --threads -o $DIR/spy-$1.txt --nonblocking >/dev/null 2>&1 &
  done; wait; gzip -f $DIR/spy-*.txt 2>/dev/null
}
while IFS='|' read -r NAME SETTINGS; do
  [ -z "$NAME" ] && continue
  [ "$(left)" -lt "${RUN_S:-150}" ] && { echo "no time left for $NAME"; break; }
  mkdir -p $OUT/$NAME; rm -rf /tmp/fe; echo "$SETTINGS" > $OUT/$NAME/settings.txt
  SPY=""; [ -n "${SPY_LEVEL:-}" ] && { DIR=$OUT/$NAME spy_at "$SPY_LEVEL" & SPY=$!; }
  echo "== $NAME: ${SETTINGS:-defaults} ($(left) s left)"
  env T_START=$(date +%s) OUT=$OUT/$NAME LIMIT=$(( $(left) - 10 )) SKIP_SNAC=1 \
    SINGLE_S=${SINGLE_S:-0} BURST=${BURST:-0} LEVELS=${LEVELS:-192,256} $SETTINGS \
    bash bench/gpu/run_orpheus_snake.sh 2>&1 | grep -E '^\| [0-9]|done|Error|error' | tail -12
  [ -n "$SPY" ] && { kill $SPY 2>/dev/null; wait $SPY 2>/dev/null; }  # a level never reached
  # the worker's loaded intervals in the call's output: a host losing CPU to steal underruns
  # for that alone (bench/results/h100-2026-12-08-s34), so read this before the underruns
  [ -f $OUT/$NAME/worker-metrics.txt.gz ] && python3 -m rtserver.tools.measure.worker_intervals \
    --every 3 $OUT/$NAME/worker-metrics.txt.gz | awk -F'|' '$10+0 >= 64 {printf "  loaded at %ss: %s tokens/s, %s vLLM steps/s, vocoder %s s/s, host steal %s\n", $2+0, $3+0, $4+0, $9+0, $11}'
  # one file a run: a call brings back at most 8 files (the device's README)
  tar czf $OUT/$NAME.tgz -C $OUT $NAME && rm -rf $OUT/$NAME
done <<< "${RUNS:?RUNS: name|settings lines}"
echo "all done ($(( $(date +%s) - T0 )) s)"
