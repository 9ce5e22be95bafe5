#!/usr/bin/env bash
# H200 (issue 29): TTFA and streams held with 8 LoRA adapters mixed, against the base alone.
# Orpheus-3B shapes, random audio-biased weights; 8 random adapters of the real shapes (PEFT
# layout, rank $RANK on MODULES: "all" q,k,v,o,gate,up,down, what Orpheus fine-tunes use, or
# "attention" q,k,v,o). Speed real, sound noise.
#
# One phase per call (each starts a server: ~3 min with CUDA graphs on the H200):
#   PH=base  the server as it runs today (LoRA off), every turn on orpheus:tara
#   PH=lora  LoRA on (max_loras 8), every turn on one of the 8 adapter voices (seeded draw)
#   PH=both  LoRA on, but every turn on the base voice: what turning LoRA on costs by itself
#   PH=pair  one server, LoRA on: the base voice, then the 8 adapters mixed (one engine start)
# The three runs draw the same texts in the same order (--voices lists of one length).
# vLLM runs LoRA configs on its V1 model runner (its V2 runner falls back for LoRA: vLLM PR
# 43084), and token_guard "none" lets the base run use V2: PH=both shows that part alone.
# Checkpoints are written on the first call into $CKPT and $LORA (kept between calls only on a
# warm machine: a bare one writes them again, ~1 min).
#
#   T_START=$(date +%s) PH=base bash bench/gpu/run_orpheus_lora.sh   # then PH=lora, PH=both
#
# Each call tars its results to $OUT/lora-$PH-r$RANK-$MODULES.tgz; the summary.md of each run has TTFA
# p50/p99 and underruns per level. Dry run on a CPU with the tiny shapes (one level, 1 stream):
#   SHAPE=tiny SNAC_SHAPE=tiny RANK=8 DEVICE=cpu LEVELS=1 DURATION=6 STAGGER=0 \
#     CKPT=/tmp/x LORA=/tmp/xl OUT=/tmp/o EAGER=1 PH=lora bash bench/gpu/run_orpheus_lora.sh
set -uo pipefail
T_START=${T_START:-$(date +%s)}
LIMIT=${LIMIT:-585}
left() { echo $(( LIMIT - ($(date +%s) - T_START) )); }
export PYTHONUNBUFFERED=1 PYTHONPATH=.:/tmp/site
PH=${PH:?PH=base, lora or both}
RANK=${RANK:-64} MODULES=${MODULES:-all} N=8 OUT=${OUT:?OUT: where the results go}
CKPT=${CKPT:-/tmp/rnd3b} LORA=${LORA:-/tmp/lora3b-r$RANK-$MODULES} SHAPE=${SHAPE:-3b} SNAC_SHAPE=${SNAC_SHAPE:-24khz}
TAG=lora-$PH-r$RANK-$MODULES; O=/tmp/$TAG; mkdir -p "$O" "$OUT"
. bench/gpu/lib.sh; jit_restore  # compile caches of an earlier run, if carried (lib.sh)
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null
  nproc; python3 -c "import sys, torch, vllm; print(sys.version.split()[0], torch.__version__, 'vllm', vllm.__version__)"
  git log -1 --format='commit %H' 2>/dev/null; echo "PH=$PH RANK=$RANK MODULES=$MODULES SHAPE=$SHAPE"; } > "$O/env.txt" 2>&1
cat "$O/env.txt"
t=$(date +%s)
if [ ! -f "$CKPT/model.safetensors" ]; then
  python3 -m rtserver.voices.orpheus.layout "$CKPT" --shape "$SHAPE" --weights audio-biased
  python3 -m rtserver.tools.layouts.snac "$CKPT/snac" --shape "$SNAC_SHAPE"
fi
for i in $(seq 1 $N); do
  [ -f "$LORA/a$i/adapter_model.safetensors" ] || python3 -m rtserver.tools.layouts.lora \
    "$LORA/a$i" --shape "$SHAPE" --rank "$RANK" --modules "$MODULES" --seed "$i" > /dev/null
done
echo "checkpoints ready in $(( $(date +%s) - t )) s; $(du -sh "$LORA" | cut -f1) of adapters"

export RTSERVER_ORPHEUS_MODEL_DIR=$CKPT RTSERVER_ORPHEUS_SNAC_DIR=$CKPT/snac
export RTSERVER_ORPHEUS_TOKEN_GUARD=none RTSERVER_ORPHEUS_DEVICE=${DEVICE:-cuda}
export RTSERVER_ORPHEUS_BUDGET_FRAMES_PER_CHAR=0.8 RTSERVER_ORPHEUS_BUDGET_BASE_FRAMES=12
[ -n "${EAGER:-}" ] && export RTSERVER_ORPHEUS_ENFORCE_EAGER=true RTSERVER_ORPHEUS_MAX_MODEL_LEN=2048
# admission off as in the earlier Orpheus runs: one client address drives every stream
export RTSERVER_ADMISSION_CONNECTIONS_PER_MINUTE=0 RTSERVER_ADMISSION_CONTEXTS_PER_MINUTE=0 RTSERVER_ADMISSION_CHARS_PER_MINUTE=0 RTSERVER_ADMISSION_FIRST_HEARD_TARGET_MS=0
adapters=$(for i in $(seq 1 $N); do printf 'lora%d@tara=%s/a%d,' "$i" "$LORA" "$i"; done)
lora_voices=$(for i in $(seq 1 $N); do printf 'orpheus:lora%d,' "$i"; done)
base_voices=$(for i in $(seq 1 $N); do printf 'orpheus:tara,'; done)
case $PH in
  base) VOICES=$base_voices ;;
  lora) VOICES=$lora_voices ;;
  both) VOICES=$base_voices ;;
  pair) VOICES=$base_voices ;;
  *) echo "PH=$PH: base, lora, both or pair"; exit 2 ;;
esac
if [ "$PH" != base ]; then
  export RTSERVER_ORPHEUS_ADAPTERS=${adapters%,} RTSERVER_ORPHEUS_MAX_LORAS=$N
  export RTSERVER_ORPHEUS_MAX_LORA_RANK=$RANK RTSERVER_ORPHEUS_MAX_ADAPTERS=$N
fi
NOTE1="H200, Orpheus-3B shapes, random audio-biased weights: speed real, sound noise"
NOTE2="PH=$PH: $([ $PH = lora ] && echo "$N LoRA adapters (rank $RANK, $MODULES linear layers, random) mixed, one drawn per turn" || echo "base voice only$([ $PH = both ] && echo ", LoRA on with $N adapters loaded")")"
if [ "$PH" = pair ]; then
  # one server (LoRA on, 8 adapters loaded), two runs on it: the base voice, then the 8
  # adapters mixed; the same texts in the same order, on the same engine start
  python3 -m rtserver serve --host 127.0.0.1 --port 8765 --voice orpheus:tara > "$O/server.log" 2>&1 & SRV=$!
  T0=$T_START wait_ready "$O/server.log" $SRV server
  jit_save "$OUT"  # now: a call cut short later still brings the caches back
  for run in base lora; do
    V=$base_voices; [ $run = lora ] && V=$lora_voices
    timeout $(( $(left) - 15 )) python3 -m rtserver.tools.bench --url ws://127.0.0.1:8765/v1/stream \
      --voice orpheus:tara --voices "${V%,}" --load stream --fragment token --tokens-per-s 40 \
      --tags numbers,abbreviations --ttfa-p99-ms 120 --no-plots --note "$NOTE1" \
      --note "PH=pair, run $run: LoRA on with $N adapters loaded (rank $RANK, $MODULES linear layers, random); $([ $run = lora ] && echo "the $N adapters mixed, one drawn per turn" || echo "every turn on the base voice")" \
      --concurrency "${LEVELS:-1,8,32,64,128}" --duration "${DURATION:-18}" \
      --stagger-s "${STAGGER:-8}" --warmup 1 --out "$O/$run" 2>&1 | tail -30 | tee "$O/bench-$run.log"
  done
  kill -TERM $SRV; wait $SRV
  tar czf "$OUT/$TAG.tgz" -C /tmp "$TAG"
  echo "done (left $(left) s)"
  exit 0
fi
timeout $(( $(left) - 15 )) python3 -m rtserver.tools.bench --voice orpheus:tara \
  --voices "${VOICES%,}" --load stream --fragment token --tokens-per-s 40 \
  --tags numbers,abbreviations --ttfa-p99-ms 120 --no-plots --note "$NOTE1" --note "$NOTE2" \
  --spawn --ready-timeout 400 --concurrency "${LEVELS:-1,8,32,64,128}" \
  --duration "${DURATION:-18}" --stagger-s "${STAGGER:-8}" --warmup 0 --out "$O/run" 2>&1 \
  | tail -60 | tee "$O/bench.log"
jit_save "$OUT"
tar czf "$OUT/$TAG.tgz" -C /tmp "$TAG"
echo "done (left $(left) s)"
