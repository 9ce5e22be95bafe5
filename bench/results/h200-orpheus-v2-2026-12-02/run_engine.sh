#!/usr/bin/env bash
# Call B: vLLM alone (bench.gpu_orpheus --mode load): N-1 requests decoding
# steadily, probes measuring a new stream's 1st/7th/28th token, steady
# tokens/s; the V2 model runner (no mask) at repetition penalty 1.3 and 1.0,
# then with stream_interval 7, then the V1 runner that the cyclic logits mask
# forces (vLLM dummy weights). Run from the repository root.
set -uo pipefail
. "$(dirname "$0")/common.sh"
L=${LEVELS:-1,8,32,64,128}
run() {  # name, then gpu_orpheus arguments
  local name=$1; shift
  [ "$(left)" -gt 150 ] || { echo "skip $name: $(left) s left"; return; }
  for i in $(seq 30); do  # the previous engine's processes gone: the GPU free again
    used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1)
    [ "${used:-0}" -lt 4000 ] && break; sleep 1; done
  echo "== $name (left $(left) s)"
  timeout $(( $(left) - 5 )) python3 -m bench.gpu_orpheus --mode load --tokens 35 --probes 6 \
    --device ${DEV:-cuda} ${ENGINE_ARGS:-} "$@" --out "$OUT/$name.json"
  echo "$name exit $? (left $(left) s)"
}
run v2 --model-dir $CKPT --snac-dir $CKPT/snac --token-guard none --levels $L \
  --repetition-penalty 1.3,1.0
run v2-interval7 --model-dir $CKPT --snac-dir $CKPT/snac --token-guard none --levels 64,128 \
  --repetition-penalty 1.3 --stream-interval 7
run v1-mask --dummy-weights --shape $SHAPE --token-guard mask --levels 1,64,128 \
  --repetition-penalty 1.3,1.0
