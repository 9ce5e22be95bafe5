#!/usr/bin/env bash
# ChatTTS through the GPU worker at 256 streams, 4 front ends (issue 24): py-spy of the worker and a
# front end, GPU busy, the worker's /metrics before and after 10 s. Carry .gpu/srv (stage.sh of the server's
# wheels: websockets opuslib av uvicorn httptools h11 click pybase16384 cffi pycparser pyzmq msgspec
# py-spy) and this script as .gpu/prof.sh; run `bash .gpu/prof.sh`. Results of 2026-12-04:
# bench/results/h200-chattts-worker-2026-12-04/.
T0=$(date +%s)
bash .gpu/srv/recv.sh 0 >/dev/null && bash .gpu/srv/install.sh | tail -1
export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore::SyntaxWarning
python3 -m rtserver.tools.bench.gpu_chattts prepare --ckpt /tmp/ck 2>&1 | tail -1
cp bench/gpu/chattts_worker.toml /tmp/ct.toml
RUN=$(mktemp -d); EP=ipc://$RUN/gpu0.sock; L=/tmp/p; mkdir -p $L
python3 -m rtserver worker --config /tmp/ct.toml --endpoint $EP > $L/worker.log 2>&1 & WPID=$!
until grep -qs "ready on" $L/worker.log; do kill -0 $WPID || { tail $L/worker.log; exit 1; }; sleep 1; done
echo "worker ready $(( $(date +%s) - T0 )) s"
P=()
for i in 0 1 2 3; do RTSERVER_GPU_ENDPOINT=$EP RTSERVER_WORKER_ID=$i RTSERVER_WORKER_COUNT=4 python3 -m rtserver serve --config /tmp/ct.toml --host 127.0.0.1 --port 8765 --reuse-port > $L/front-$i.log 2>&1 & P+=($!); done
until [ "$(grep -l "ready on" $L/front-*.log 2>/dev/null | wc -l)" -eq 4 ]; do sleep 0.5; done
python3 -m rtserver.tools.bench --url ws://127.0.0.1:8765/v1/stream --voice chattts:seed_1 --load stream --fragment token --tokens-per-s 40 --concurrency 256 --duration 28 --warmup 1 --no-plots --out $L/b256 > $L/bench.log 2>&1 & B=$!
sleep 14
python3 -c "import urllib.request,sys;sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:9100/metrics').read().decode())" > $OUT/worker-metrics-a.txt
nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 200 > $OUT/gpu-util-256.txt & N=$!
/tmp/site/bin/py-spy record -p $WPID -d 10 -r 100 -f raw --threads -o $OUT/worker-256.txt --nonblocking > /dev/null 2>&1 &
/tmp/site/bin/py-spy record -p ${P[0]} -d 10 -r 100 -f raw -o $OUT/front0-256.txt --nonblocking > /dev/null 2>&1 &
/tmp/site/bin/py-spy record -p $WPID -d 10 -r 100 -f raw --gil -o $OUT/worker-gil-256.txt --nonblocking > /dev/null 2>&1 &
sleep 10; python3 -c "import urllib.request,sys;sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:9100/metrics').read().decode())" > $OUT/worker-metrics-b.txt; sleep 1; kill $N
top -b -H -n 1 -p $WPID | head -25 > $OUT/worker-threads.txt
wait $B; tail -3 $L/bench.log
sed -n '/^| level/,/^$/p' $L/b256/summary.md; sed -n '/^| streams/,/^$/p' $L/b256/summary.md
cp $L/b256/summary.md $OUT/b256-summary.md
kill -TERM ${P[@]} $WPID; wait
awk '{s+=$1; n++} END {print "gpu util mean", s/n, "samples", n}' $OUT/gpu-util-256.txt
echo "done $(( $(date +%s) - T0 )) s"; ls -la $OUT
