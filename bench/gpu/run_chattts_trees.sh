#!/usr/bin/env bash
# ChatTTS through one GPU worker and 4 front ends at one level, each run on a fresh worker, for
# A/Bs of code as well as of settings on one host (hosts differ: session 21's two H100s did not
# agree at 512). Each line of RUNS is `name|tree|[chattts] line`: tree `.` is this one, `base`
# an earlier commit carried as .gpu/base.tgz (`git archive REV rtserver bench/gpu | gzip >
# .gpu/base.tgz`); the line goes to CHATTTS_EXTRA (empty: the defaults). Interleave the trees.
#   RUNS=$'base|base|\nnew|.|\nnew-si8|.|stream_interval = 8' LEVEL=512 OUT=$OUT \
#     bash bench/gpu/run_chattts_trees.sh
# SPY=name: py-spy samples that run's worker and front end 0 at the level (PYSPY_ARGS, e.g.
# --gil: only the thread holding the GIL, so its share of samples is who holds it).
# $OUT/NAME/: the run's worker-metrics.txt, gpu-util.txt, run.log; the level's rows in $OUT/runs.md.
T0=$(date +%s); OUT=${OUT:?OUT: where the results go}; SRV=${SRV:-$PWD/.gpu/srv3}
HERE=$PWD; LEVEL=${LEVEL:-512}
if grep -q '|base|' <<< "${RUNS:?RUNS: name|tree|line, one a line}"; then
  rm -rf /tmp/tree-base && mkdir -p /tmp/tree-base && tar xzf .gpu/base.tgz -C /tmp/tree-base
fi
while IFS='|' read -r name tree extra; do
  [ -n "$name" ] || continue
  root=$HERE; [ "$tree" = base ] && root=/tmp/tree-base
  mkdir -p "$OUT/$name"
  spy=(); [ "${SPY:-}" = "$name" ] && spy=(PYSPY_AT=$LEVEL PYSPY_ARGS="${PYSPY_ARGS:-}")
  ( cd "$root" && env "${spy[@]}" CHATTTS_EXTRA="$extra" FE=/tmp/fe-$name OUT=$OUT/$name SRV=$SRV \
      FRONTENDS=4 SINGLE_S=0 BURST=0 LEVELS=$LEVEL DURATION=${DURATION:-16} STAGGER=8 \
      LIMIT=${LIMIT:-150} bash bench/gpu/run_chattts_worker_levels.sh > "$OUT/$name/run.log" 2>&1 )
  [ -n "${spy[*]}" ] && cp /tmp/fe-$name/logs/pyspy-* "$OUT/$name/" 2>/dev/null
  row=$(grep -h "^| $LEVEL " /tmp/fe-$name/f*/summary.md 2>/dev/null | head -2 | tr '\n' ' ')
  echo "| $name | $tree | ${extra:-default} | $row" | tee -a "$OUT/runs.md"
  echo "  ($(( $(date +%s) - T0 )) s)"
done <<< "$RUNS"
