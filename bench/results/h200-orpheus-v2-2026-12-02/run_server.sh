#!/usr/bin/env bash
# Call A: rtserver's Orpheus voice behind its WebSocket server (V2 model runner:
# no logits mask, token_guard none, wrong-slot tokens re-slotted), the bench
# harness over loopback at 1..128 streams, each fed a two-sentence reply
# token by token. Run from the repository root; everything goes under $OUT.
set -uo pipefail
. "$(dirname "$0")/common.sh"
export RTSERVER_ORPHEUS_MODEL_DIR=$CKPT RTSERVER_ORPHEUS_SNAC_DIR=$CKPT/snac
export RTSERVER_ORPHEUS_TOKEN_GUARD=${GUARD:-none} RTSERVER_ORPHEUS_DEVICE=${DEV:-cuda}
export RTSERVER_ORPHEUS_STREAM_INTERVAL=${STREAM_INTERVAL:-1}
# Random weights never end speech: the token budget is set to natural speech
# length (~0.8 frames per character, TokenBudget's docstring) plus 1 s.
export RTSERVER_ORPHEUS_BUDGET_FRAMES_PER_CHAR=0.8 RTSERVER_ORPHEUS_BUDGET_BASE_FRAMES=12
echo "== bench (left $(left) s)"
timeout $(( $(left) - 10 )) python3 -m bench --spawn --voice orpheus:tara --ready-timeout 400 \
  --load ${LOADS:-stream} --fragment token --tokens-per-s 40 --concurrency ${LEVELS:-1,8,32,64,128} \
  --duration ${DURATION:-8} --warmup 2 --tags numbers,abbreviations --ttfa-p99-ms 120 --no-plots \
  --note "H200, Orpheus-3B shapes, random audio-biased weights (write_random_orpheus): speed real, sound noise" \
  --note "token budget 0.8 frames/char + 12 frames per segment (natural speech length)" \
  --out "$OUT/${TAG:-rt}"
echo "bench exit $? (left $(left) s)"
