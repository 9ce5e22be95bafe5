#!/usr/bin/env bash
# H200 (issue 24): Orpheus through ONE GPU worker + 4 front ends, one level at a time, with a
# GPU timeline and a py-spy profile of the worker in the middle of each level.
# Carry the vLLM wheel parts first (see run_orpheus_worker.sh), this script last, in one call:
#   T_START=$(date +%s) OUT=$OUT LEVELS=192,256 STREAM_INTERVAL=1 bash bench/gpu/run_orpheus_timeline.sh
# Each level: the bench's steady load (users join over STAGGER s, then DURATION s); once every
# user has joined, py-spy samples the worker for 8 s, then it records a GPU timeline for
# PROFILE_S s (SIGUSR1/SIGUSR2: traces of the worker and of vLLM's EngineCore,
# rtserver/worker/profile.py).
# $OUT gets traces-L.tgz per level (the raw traces) and orpheus-timeline-siN.tgz (TAG, when
# set, goes after "traces" and "timeline": two runs in one call keep both): per level
# timeline-L.md (python -m rtserver.tools.bench.gpu_timeline), pyspy-L.txt / pyspy-gil-L.txt
# (raw folded stacks), the bench's summaries, worker metrics, GPU utilization and logs; and
# jit-fi.tgz / jit-compile.tgz, the compile caches (lib.sh jit_save): kept here as .gpu/jit/
# and carried, they spare the next machine's start FlashInfer's JIT (lib.sh jit_restore).
# PROFILE=0: no py-spy and no timeline (writing the traces stalls the worker and EngineCore for
# seconds, so a profiled level's underruns are not the server's); with PYSPY=1 py-spy alone
# samples the worker at levels >= 128 (non-blocking). Other RTSERVER_* settings pass
# through to the worker, e.g. RTSERVER_ORPHEUS_VOCODER_COMPILE=true or
# RTSERVER_ORPHEUS_VOCODER_MAX_PAD_FRACTION=0.5.
# Random weights of the real shapes (Orpheus-3B, SNAC 24 kHz): speed real, sound noise.
set -uo pipefail
T0=${T_START:-$(date +%s)}; LIMIT=${LIMIT:-590}; left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore::SyntaxWarning
OUT=${OUT:?OUT: where the results go}; TAG=${TAG:-}; O=/tmp/otl$TAG; rm -rf $O; mkdir -p $O/logs $O/traces
CK=${CKPT:-/tmp/rnd3b}
. bench/gpu/lib.sh; jit_restore
if [ ! -f $CK/snac/config.json ]; then
  python3 -m rtserver.voices.orpheus.layout $CK --shape 3b --weights audio-biased | tail -1
  python3 -m rtserver.tools.layouts.snac $CK/snac --shape 24khz | tail -1
fi
python3 -c "import sys, torch, vllm; print(sys.version.split()[0], torch.__version__, 'vllm', vllm.__version__)" > $O/env.txt 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> $O/env.txt 2>&1; date -u >> $O/env.txt
export RTSERVER_ORPHEUS_MODEL_DIR=$CK RTSERVER_ORPHEUS_SNAC_DIR=$CK/snac
export RTSERVER_ORPHEUS_TOKEN_GUARD=none RTSERVER_ORPHEUS_DEVICE=cuda
export RTSERVER_ORPHEUS_BUDGET_FRAMES_PER_CHAR=0.8 RTSERVER_ORPHEUS_BUDGET_BASE_FRAMES=12
export RTSERVER_ORPHEUS_STREAM_INTERVAL=${STREAM_INTERVAL:-1}
# INPROC=1: first a tiny Orpheus on this GPU with vLLM's EngineCore in this process and SNAC's
# calls on their own stream (one segment end to end, ~1 min); if it speaks, the run serves with
# engine_process "inproc" and vocoder main_stream on, else as before (the log says why).
# The preflight samples with vLLM's torch top-k/top-p: FlashInfer's compiles on first use,
# likely what timed the session-14 preflight out in vLLM's profile pass (lib.sh); a stall
# dumps every thread's stack into the log before the timeout.
if [ "${INPROC:-0}" = 1 ]; then
  VLLM_USE_FLASHINFER_SAMPLER=0 timeout 150 python3 - > $O/logs/preflight.log 2>&1 <<'PY'
import asyncio, faulthandler, sys, tempfile
from pathlib import Path
import numpy as np
from rtserver.tools.layouts.snac import write_tiny_snac
from rtserver.vocoder.config import VocoderConfig
from rtserver.voices.base import SynthesisRequest
from rtserver.voices.orpheus.layout import write_tiny_orpheus
from rtserver.voices.orpheus.voice import OrpheusConfig, load_orpheus_voice

faulthandler.dump_traceback_later(140, exit=True)


async def main() -> None:
    root = Path(tempfile.mkdtemp())
    cfg = OrpheusConfig(model_dir=str(write_tiny_orpheus(root / "llama", shape="tiny")),
                        snac_dir=str(write_tiny_snac(root / "snac", seed=0)),
                        dummy_weights=True, device="cuda", enforce_eager=True,
                        max_model_len=2048, max_num_seqs=8, gpu_memory_utilization=0.1,
                        engine_process="inproc", vocoder=VocoderConfig(main_stream=True))
    v = await load_orpheus_voice(cfg, "tara")
    await v.warm_up()
    chunks = [c async for c in v.synthesize(SynthesisRequest(text="Hello there, this is a check.",
                                                             request_id="pre-1", first=True))]
    audio = np.concatenate([c.samples for c in chunks])
    await v.close()
    print(f"PREFLIGHT OK {len(chunks)} chunks, {len(audio)} samples, finite {np.isfinite(audio).all()}")

asyncio.run(main())
PY
  if grep -q "PREFLIGHT OK" $O/logs/preflight.log; then
    export RTSERVER_ORPHEUS_ENGINE_PROCESS=inproc RTSERVER_ORPHEUS_VOCODER_MAIN_STREAM=true
  fi
  tail -3 $O/logs/preflight.log; echo "preflight done after $(( $(date +%s) - T0 )) s"
fi
echo "engine_process ${RTSERVER_ORPHEUS_ENGINE_PROCESS:-separate}" | tee -a $O/env.txt
TRACES=""; [ "${PROFILE:-1}" = 1 ] && TRACES=$O/traces
export RTSERVER_ORPHEUS_PROFILE_DIR=$TRACES
export RTSERVER_ADMISSION_CONNECTIONS_PER_MINUTE=0 RTSERVER_ADMISSION_CONTEXTS_PER_MINUTE=0 RTSERVER_ADMISSION_CHARS_PER_MINUTE=0 RTSERVER_ADMISSION_FIRST_HEARD_TARGET_MS=0
printf '[voice]\ndefault = "orpheus:tara"\n[gpu]\nmetrics_port = 9100\nprofile_dir = "%s"\n' "$TRACES" > /tmp/otl.toml
echo "stream_interval $RTSERVER_ORPHEUS_STREAM_INTERVAL" | tee -a $O/env.txt
RUN=$(mktemp -d); EP=ipc://$RUN/gpu0.sock; URL=ws://127.0.0.1:8765/v1/stream
python3 -m rtserver worker --config /tmp/otl.toml --endpoint $EP > $O/logs/worker.log 2>&1 &
WPID=$!
wait_ready $O/logs/worker.log $WPID worker
jit_save $OUT  # now: a call cut short later still brings the caches back
worker_scrapes $O/worker-metrics.txt 1 & S=$!
( nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -lms 200 > $O/gpu-util.txt ) & N=$!
P=()
for i in 0 1 2 3; do
  RTSERVER_GPU_ENDPOINT=$EP RTSERVER_WORKER_ID=$i RTSERVER_WORKER_COUNT=4 python3 -m rtserver serve \
    --config /tmp/otl.toml --host 127.0.0.1 --port 8765 --reuse-port > $O/logs/front-$i.log 2>&1 &
  P+=($!)
done
until [ "$(grep -l "ready on" $O/logs/front-*.log 2>/dev/null | wc -l)" -eq 4 ]; do sleep 0.5; done
STAGGER=${STAGGER:-8}; DURATION=${DURATION:-18}; PROFILE_S=${PROFILE_S:-1.5}
for L in ${LEVELS//,/ }; do
  [ "$(left)" -lt $(( STAGGER + DURATION + 40 )) ] && { echo "no time left for $L"; break; }
  python3 -m rtserver.tools.bench --url $URL --voice orpheus:tara --load stream --fragment token \
    --tokens-per-s 40 --concurrency $L --duration $DURATION --stagger-s $STAGGER --warmup 1 \
    --no-plots --note "4 front ends, one GPU worker, stream_interval $RTSERVER_ORPHEUS_STREAM_INTERVAL, engine_process ${RTSERVER_ORPHEUS_ENGINE_PROCESS:-separate}" \
    --out $O/l$L > $O/logs/bench-$L.log 2>&1 & B=$!
  if [ "$L" -ge 64 ] && [ "${PROFILE:-1}" = 1 ]; then
    sleep $(( STAGGER + 4 ))
    /tmp/site/bin/py-spy record -p $WPID -d 8 -r 100 -f raw --threads -o $O/pyspy-$L.txt --nonblocking > /dev/null 2>&1 &
    /tmp/site/bin/py-spy record -p $WPID -d 8 -r 100 -f raw --gil -o $O/pyspy-gil-$L.txt --nonblocking > /dev/null 2>&1
    sleep 0.5; rm -rf $O/traces/*; kill -USR1 $WPID; sleep $PROFILE_S; kill -USR2 $WPID
    until [ "$(ls $O/traces 2>/dev/null | grep -c json)" -ge 2 ]; do sleep 0.5; [ "$(left)" -lt 20 ] && break; done
    sleep 2; ls -la $O/traces
    python3 -m rtserver.tools.bench.gpu_timeline $O/traces --out $O/timeline-$L.md | head -14
    tar czf $OUT/traces$TAG-$L.tgz -C $O traces
  fi
  if [ "$L" -ge 128 ] && [ "${PROFILE:-1}" = 0 ] && [ "${PYSPY:-0}" = 1 ]; then
    # PYSPY=1 with PROFILE=0: py-spy alone (non-blocking sampling; no trace stalls the worker)
    sleep $(( STAGGER + 4 ))
    /tmp/site/bin/py-spy record -p $WPID -d 8 -r 100 -f raw --threads -o $O/pyspy-$L.txt --nonblocking > /dev/null 2>&1 &
    /tmp/site/bin/py-spy record -p $WPID -d 8 -r 100 -f raw --gil -o $O/pyspy-gil-$L.txt --nonblocking > /dev/null 2>&1
  fi
  wait $B; sed -n '/^| level/,/^$/p;/^| streams/,/^$/p' $O/l$L/summary.md | head -8
done
kill $S $N 2>/dev/null
ps -o pid,pcpu,rss,etimes,args -p "$WPID,$(IFS=,; echo "${P[*]}")" > $O/logs/ps.txt
kill -TERM "${P[@]}" $WPID; wait "${P[@]}" $WPID 2>/dev/null; rm -rf "$RUN"
gzip -f $O/worker-metrics.txt $O/gpu-util.txt
tar czf $OUT/orpheus-timeline$TAG-si$RTSERVER_ORPHEUS_STREAM_INTERVAL.tgz -C /tmp --exclude='traces' otl$TAG
ls -la $OUT; echo "done (left $(left) s)"
