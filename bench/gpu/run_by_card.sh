#!/usr/bin/env bash
# The first ChatTTS call of a session whose card is not known in advance (a call naming no kind
# gets an H100 or an H200): on an H200, issue 24's and 25's ChatTTS figures (the engine alone
# at 1, 256 and 512 rows with and without the hidden-state store, then one worker and 4 front
# ends: one user back to back, levels 64-512 and a burst of 64; run_chattts_one_call.sh, the
# command of bench/results/h100-2026-12-06-s23); on any other card, where those figures exist
# already, ChatTTS's Triton decode attention against SDPA (run_chattts_attention_ab.sh).
# Carry .gpu/srv3 and .gpu/base.tgz; run  OUT=$OUT bash bench/gpu/run_by_card.sh
OUT=${OUT:?OUT: where the results go}
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $CARD" | tee $OUT/card.txt
case "$CARD" in
  *H200*)
    OUT=$OUT SRV=.gpu/srv3 ENGINE_LEVELS=1x128,256x512,512x512 B_ARGS=--hidden-store PROFILE=0 \
      PYSPY_AT=0 SINGLE_S=15 LEVELS=64,128,192,256,320,512 BURST=64 LIMIT=${LIMIT:-575} \
      bash bench/gpu/run_chattts_one_call.sh ;;
  *)
    OUT=$OUT SRV=.gpu/srv3 ENGINE_LEVELS=${ENGINE_LEVELS:-1x128,256x512,512x512} LIMIT=${LIMIT:-575} \
      bash bench/gpu/run_chattts_attention_ab.sh ;;
esac
