#!/usr/bin/env bash
# Call C: does the vocoder on the same GPU slow the engine? bench.gpu_orpheus
# bursts of N requests of 700 tokens (100 frames, 8.5 s of audio) at the
# engine alone, then through the voice (engine + frame assembly + chunked,
# batched SNAC on the GPU), same process, no server. Run from the repo root.
set -uo pipefail
. "$(dirname "$0")/common.sh"
echo "== diag (left $(left) s)"
timeout $(( $(left) - 5 )) python3 -m bench.gpu_orpheus --mode both --tokens 700 --repeats 1 \
  --model-dir $CKPT --snac-dir $CKPT/snac --token-guard none --levels ${LEVELS:-64,128} \
  --device ${DEV:-cuda} ${ENGINE_ARGS:-} --out "$OUT/diag.json"
echo "diag exit $? (left $(left) s)"
