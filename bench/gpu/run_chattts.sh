#!/usr/bin/env bash
# H200, ChatTTS phases (real shapes, random weights). Outputs under /tmp/ct, tarred to $OUT.
#   PH=a  checkpoint, decoder + engine self-checks, engine alone, server start + 1 stream
#   PH=b  steady traffic 1..512     PH=c  burst, metrics, stop, the chattts package's reference
set -uo pipefail
export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1
# T_START: when the call's command began (an install may run before this script)
T0=${T_START:-$(date +%s)}; left() { echo $(( 580 - ($(date +%s) - T0) )); }
CK=/tmp/chattts-random; O=/tmp/ct; mkdir -p $O
G="python3 -m rtserver.tools.bench.gpu_chattts --ckpt $CK --out $O"
case ${PH:-a} in
a)
  $G prepare 2>&1 | tail -5
  timeout 120 python3 -m rtserver.tools.selfcheck.chattts_decoder --device cuda --batches 1 8 64 \
    --out $O/decode_selfcheck.json 2>&1 | tail -25
  timeout 90 $G selfcheck 2>&1 | tail -12
  timeout 100 $G engine --levels ${ELEVELS:-1,64,512} 2>&1 | tail -12
  timeout $(( $(left) - 10 )) $G start 2>&1 | tail -25
  ;;
b)
  timeout $(( $(left) - 15 )) $G stagger --levels ${LEVELS:-1,8,32,64,128,256,512} 2>&1 | tail -45
  ;;
c)
  timeout 170 $G burst --levels ${LEVELS:-32,64,128} 2>&1 | tail -25
  $G metrics 2>&1 | tail -5; $G stop 2>&1 | tail -3
  timeout 20 python3 -m rtserver.tools.bench.chattts_reference --check-deps 2>&1 | tail -20
  # REF_S caps the reference (each level prints a JSON line, kept in reference.log)
  rs=$(( $(left) - 15 )); [ -n "${REF_S:-}" ] && [ "$REF_S" -lt "$rs" ] && rs=$REF_S
  timeout $rs python3 -m rtserver.tools.bench.chattts_reference --ckpt $CK --device cuda \
    --levels ${REF_LEVELS:-1,2,4,8,16} --out $O/reference.json 2>&1 | tee $O/reference.log | tail -30
  ;;
esac
tar czf $OUT/ct-${PH:-a}.tgz -C /tmp ct 2>/dev/null
echo "done PH=${PH:-a} (left $(left) s)"
