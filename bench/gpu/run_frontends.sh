#!/usr/bin/env bash
# Streams held against front-end processes (issue 24): ONE GPU worker (one engine start),
# then for each F in FRONTENDS, F front ends on one port (SO_REUSEPORT) and the bench's
# steady sweep against that port; one results folder per F, and $O/frontends.md: the table.
#   CONFIG   TOML with the voice's own section ([orpheus] or [chattts]) and [voice] default
#   VOICE    the voice the bench asks for (default orpheus:tara)
#   FRONTENDS (default "1 2 4 8"), LEVELS (default 64,128,192,256), DURATION (default 15)
#   STAGGER  seconds over which a level's users join (steady traffic; default 0: all at once)
#   BURST    levels run again after the sweep with every user at once (e.g. 64), in $O/fF-burst
#            (unset or 0: none)
#   SINGLE_S before the sweep, one user back to back for this many seconds, in $O/fF-single
#            (unset or 0: none)
#   PYSPY_AT a level of the sweep: py-spy samples the worker and front end 0 in it (needs
#            /tmp/site/bin/py-spy, staged with bench/gpu/server-wheels.txt)
#   PYSPY_ARGS more py-spy flags, e.g. "--idle --native": a thread waiting for the GIL sleeps
#            in take_gil (a condition wait), which py-spy drops as idle unless --idle
# The front ends are this script's own processes (no supervisor), so the bench runs with
# --url: its CPU table counts only the bench; the front ends' and the worker's CPU is in
# $O/logs/ps-F.txt (ps after each sweep).
# CPU dry run (tiny ChatTTS, see tests/integration/test_gpu_worker_server.py for a config):
#   CONFIG=/tmp/tiny.toml VOICE=chattts:alice FRONTENDS="1 2" LEVELS=1,2 DURATION=4 OUT=/tmp/o \
#     bash bench/gpu/run_frontends.sh
set -uo pipefail
export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1
T0=${T_START:-$(date +%s)}; left() { echo $(( ${LIMIT:-580} - ($(date +%s) - T0) )); }
O=${O:-/tmp/fe}; RUN=$(mktemp -d); EP=ipc://$RUN/gpu0.sock; mkdir -p "$O/logs"
PORT=${PORT:-8765}; URL=ws://127.0.0.1:$PORT/v1/stream
python3 -m rtserver worker --config "$CONFIG" --endpoint "$EP" > "$O/logs/worker.log" 2>&1 &
WPID=$!
. bench/gpu/lib.sh; wait_ready "$O/logs/worker.log" $WPID worker
for F in ${FRONTENDS:-1 2 4 8}; do
  [ "$(left)" -lt 60 ] && { echo "no time left for F=$F"; break; }
  PIDS=()
  for i in $(seq 0 $((F - 1))); do
    RTSERVER_GPU_ENDPOINT=$EP RTSERVER_WORKER_ID=$i RTSERVER_WORKER_COUNT=$F \
      python3 -m rtserver serve --config "$CONFIG" --host 127.0.0.1 --port $PORT --reuse-port \
      > "$O/logs/front-$F-$i.log" 2>&1 &
    PIDS+=($!)
  done
  # every front end listening (each says "ready on" once its worker answered)
  until [ "$(grep -l "ready on" "$O"/logs/front-$F-*.log 2>/dev/null | wc -l)" -eq "$F" ]; do
    sleep 0.5
    for p in "${PIDS[@]}"; do  # a front end that exits (a missing wheel) ends the run at once
      kill -0 "$p" 2>/dev/null || { tail -20 "$O"/logs/front-$F-*.log; kill -TERM $WPID; exit 1; }
    done
    [ "$(left)" -lt 40 ] && { echo "front ends not ready in time"; tail -5 "$O"/logs/front-$F-*.log; break 2; }
  done
  if [ "${SINGLE_S:-0}" != 0 ]; then  # one user, turn after turn: TTFA at one stream from 20+ contexts
    timeout $(( $(left) - 20 )) python3 -m rtserver.tools.bench --url $URL --voice ${VOICE:-orpheus:tara} \
      --load stream --fragment token --tokens-per-s 40 --concurrency 1 --back-to-back \
      --duration $SINGLE_S --warmup 1 --no-plots \
      --note "$F front-end process(es), one GPU worker, one user back to back" --out "$O/f$F-single" 2>&1 | tail -3
  fi
  SPY=""
  if [ -n "${PYSPY_AT:-}" ] && [ -x /tmp/site/bin/py-spy ]; then
    # once level PYSPY_AT has run STAGGER + 2 s (every user joined): the worker and front end 0
    # sampled for 6 s (non-blocking), raw folded stacks with threads in $O/logs
    ( until grep -qs "sweep $PYSPY_AT: " "$O/logs/bench-$F.log"; do sleep 0.5; done
      sleep $(( ${STAGGER:-0} + 2 ))
      for w in worker:$WPID front0:${PIDS[0]}; do
        /tmp/site/bin/py-spy record -p ${w#*:} -d 6 -r 100 -f raw --threads --nonblocking ${PYSPY_ARGS:-} \
          -o "$O/logs/pyspy-${w%%:*}-$PYSPY_AT.txt" > /dev/null 2>&1 &
      done; wait ) & SPY=$!
  fi
  timeout $(( $(left) - 20 )) python3 -m rtserver.tools.bench --url $URL --voice ${VOICE:-orpheus:tara} \
    --load stream --fragment token --tokens-per-s 40 --concurrency ${LEVELS:-64,128,192,256} \
    --duration ${DURATION:-15} --stagger-s ${STAGGER:-0} --warmup 1 --no-plots \
    --note "$F front-end process(es), one GPU worker" --out "$O/f$F" 2>&1 \
    | tee "$O/logs/bench-$F.log" | tail -8
  [ -n "$SPY" ] && kill $SPY 2>/dev/null
  if [ "${BURST:-0}" != 0 ] && [ "$(left)" -gt 60 ]; then
    timeout $(( $(left) - 20 )) python3 -m rtserver.tools.bench --url $URL --voice ${VOICE:-orpheus:tara} \
      --load stream --fragment token --tokens-per-s 40 --concurrency $BURST \
      --duration ${DURATION:-15} --warmup 1 --no-plots \
      --note "$F front-end process(es), one GPU worker, burst" --out "$O/f$F-burst" 2>&1 | tail -3
  fi
  ps -o pid,pcpu,rss,etimes,args -p "$WPID,$(IFS=,; echo "${PIDS[*]}")" > "$O/logs/ps-$F.txt"
  kill -TERM "${PIDS[@]}"; wait "${PIDS[@]}" 2>/dev/null
done
kill -TERM $WPID; wait $WPID 2>/dev/null; rm -rf "$RUN"
# the table: each F's capacity line (the bench's own rule: TTFA p99 under its target, no underrun)
{ echo "| front ends | streams held |"; echo "|---|---|"
  for d in "$O"/f*/; do
    F=${d%/}; F=${F##*/f}
    echo "| $F | $(awk '/^## Capacity/ {getline; getline; print; exit}' "$d/summary.md" | sed -e 's/[*][*]//g' -e 's/^- //') |"
  done; } | tee "$O/frontends.md"
[ -n "${OUT:-}" ] && tar czf "$OUT/fe.tgz" -C "$(dirname "$O")" "$(basename "$O")"
echo "done (left $(left) s)"
