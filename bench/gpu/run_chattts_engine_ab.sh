#!/usr/bin/env bash
# The ChatTTS engine alone (issue 25), this tree against a tree whose GPT forward is OLD_MODEL
# (a copy of rtserver/voices/chattts/engine/model.py from an earlier commit, carried beside the
# tree, e.g. .gpu/ab/model.py) or whose files under OLD_TREE replace this tree's (e.g. the step
# loop of an earlier commit), on one machine in one call; then this tree's step loop under
# cProfile at 256 rows (the per-step host floor split by function). Random weights of the real
# shapes (`gpu_chattts prepare`). Needs torch and the server's wheels in /tmp/site. Each tree
# also writes the device kernels of one request alone (kernels-{new,old}.txt): session 14 saw
# the same GPU time a step with 200 fewer ops, and the tables show which kernels the step
# spends it in.
#   OLD_MODEL=.gpu/ab/model.py OUT=$OUT bash bench/gpu/run_chattts_engine_ab.sh
# Or this tree twice, the second run with B_ARGS added (engine-b.json; e.g. B_ARGS=--hidden-store:
# hidden states in the device store against copied to the host). ENGINE_ARGS go to every run.
T0=$(date +%s); export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore::SyntaxWarning
OUT=${OUT:?OUT: where the results go}; LEVELS=${LEVELS:-1x128,256x512}
CK=${CK:-/tmp/ck}; [ -d $CK/asset ] || PYTHONPATH=.:/tmp/site python3 -m rtserver.tools.bench.gpu_chattts \
  prepare --ckpt $CK 2>&1 | tail -1
if [ -n "${OLD_MODEL:-}${OLD_TREE:-}" ]; then  # the old tree: this one with the old files
  rm -rf /tmp/ab-old && mkdir -p /tmp/ab-old && cp -r rtserver /tmp/ab-old/
  [ -n "${OLD_MODEL:-}" ] && cp "$OLD_MODEL" /tmp/ab-old/rtserver/voices/chattts/engine/model.py
  # OLD_TREE: a folder of files at their paths in the repository (e.g. .gpu/ab/rtserver/...),
  # laid over the copy: `git show REV:PATH > .gpu/ab/PATH` for each file to put back
  [ -n "${OLD_TREE:-}" ] && cp -r "$OLD_TREE"/rtserver /tmp/ab-old/
fi
E="python3 -m rtserver.tools.bench.gpu_chattts_engine --ckpt $CK --slots ${SLOTS:-512} --max-len 1536 --device ${DEVICE:-cuda}"
for tree in new old b; do
  root=.; args=${ENGINE_ARGS:-}
  [ $tree = old ] && root=/tmp/ab-old
  [ $tree = old ] && [ -z "${OLD_MODEL:-}${OLD_TREE:-}" ] && continue
  [ $tree = b ] && { [ -n "${B_ARGS:-}" ] || continue; args="$args $B_ARGS"; }
  PYTHONPATH=$root:/tmp/site timeout 150 $E $args --levels $LEVELS --out $OUT/engine-$tree.json \
    --kernels $OUT/kernels-$tree.txt > $OUT/engine-$tree.log 2>&1
  echo "engine, $tree: rc $? ($(( $(date +%s) - T0 )) s)"
  python3 -c "
import json, sys
for d in json.load(open('$OUT/engine-$tree.json'))['levels']:
    print(' ', {k: d[k] for k in ('streams', 'steps', 'real_time_x_min', 'first_step_ms_p50',
          'host_cpu_ms_per_step', 'host_ms_per_step', 'host_ms_by_phase', 'gpu_ms_per_step',
          'gpu_busy')})" 2>&1 | tail -4
done
if [ "${PROFILE:-1}" = 1 ]; then
  PYTHONPATH=.:/tmp/site timeout 100 $E --levels 256x512 --profile $OUT/profile-256x512.txt \
    > /dev/null 2>&1; echo "engine, profiled at 256: rc $? ($(( $(date +%s) - T0 )) s)"
  head -40 $OUT/profile-256x512.txt
fi
