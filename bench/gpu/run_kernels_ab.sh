#!/usr/bin/env bash
# Session 23's and 24's Triton kernels on a GPU in ONE call, no vLLM needed:
#   1. SNAC alone at the real 24 kHz shape (random weights), CUDA graphs: ms a call of 1, 16
#      and 64 windows of 22 frames (a steady chunk of 16 with its context and lookahead),
#      torch's layers against [orpheus.vocoder] snake_conv = "triton" (snac-timing-*.txt), and
#      the kernels' full decode against float32 torch layers with their seams
#      (snac-seams-triton.txt);
#   2. ChatTTS's decode attention, Triton against SDPA (run_chattts_attention_ab.sh: self-check,
#      engine alone, then with time left fresh workers at LEVEL).
# Carry .gpu/srv3 (the server's wheels), .gpu/extra (the snac 1.2.1 and einops wheels, which
# lib.sh server_wheels installs beside them) and .gpu/base.tgz; run
#   OUT=$OUT bash bench/gpu/run_kernels_ab.sh
T0=$(date +%s); OUT=${OUT:?OUT: where the results go}; SRV=${SRV:-.gpu/srv3}
export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1
. bench/gpu/lib.sh; server_wheels $SRV
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $OUT/env.txt 2>&1
python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, 'triton', triton.__version__)" >> $OUT/env.txt 2>&1
snac_alone $OUT $T0
OUT=$OUT SRV=$SRV LIMIT=$(( ${LIMIT:-575} - ($(date +%s) - T0) )) bash bench/gpu/run_chattts_attention_ab.sh
