#!/usr/bin/env bash
# Call B on the H200 host (same warm machine as call A): the reference
# Orpheus streaming code (orpheus-speech 0.1.0, OrpheusModel.generate_speech)
# on the same shapes and random weights; see bench/orpheus_reference.py for
# the adaptations. Everything goes under $OUT. Run from the repository root.
set -uo pipefail
T0=${T_START:-$(date +%s)}; LIMIT=${LIMIT:-585}  # T_START: when the call's command began
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
export PYTHONUNBUFFERED=1 PYTHONPATH=.:/tmp/site
if [ -n "${RUN_ENGINE:-}" ]; then  # vLLM token timing here when call A had no time left
  echo "== gpu_orpheus engine"
  timeout 170 python3 -m bench.gpu_orpheus --dummy-weights --shape ${SHAPE:-3b} --device ${DEV:-cuda} \
    --mode engine --levels 1,8,32,64,128 --tokens 140 --repeats 3 ${ENGINE_ARGS:-} \
    --out "$OUT/engine.json"
  echo "gpu_orpheus exit $?"
fi
python3 -m bench.orpheus_reference --make-random-snac /tmp/refsnac
echo "== reference (left $(left) s)"
timeout $(( $(left) - 5 )) python3 -m bench.orpheus_reference --dummy-model /tmp/refmodel \
  --dummy-shape ${SHAPE:-3b} --snac-dir /tmp/refsnac --engine-arg load_format='"dummy"' \
  --engine-arg logits_processors='["bench.reference_mask:AudioOnlyMask"]' \
  --engine-arg max_model_len=4096 --engine-arg max_num_seqs=256 \
  --engine-arg gpu_memory_utilization=0.8 ${REF_ARGS:-} \
  --budget 0.8:12 --tags numbers,abbreviations --concurrency ${LEVELS:-1,8,32,64} \
  --duration ${DURATION:-10} --warmup 2 --ttfa-p99-ms 120 \
  --note "H200, Orpheus-3B shapes with random weights (vLLM load_format=dummy): speed real, sound noise" \
  --out "$OUT/ref"
echo "reference exit $? (left $(left) s)"
