# Sourced by run_server.sh / run_engine.sh on the H200 host (wheels installed
# into /tmp/site): time left in the call, versions, the random checkpoint.
T0=${T_START:-$(date +%s)}; LIMIT=${LIMIT:-585}  # T_START: when the call's command began
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
export PYTHONUNBUFFERED=1 PYTHONPATH=.:/tmp/site
CKPT=${CKPT:-/tmp/rnd3b} SHAPE=${SHAPE:-3b} SNAC_SHAPE=${SNAC_SHAPE:-24khz}
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null;
  nproc; python3 -c "import sys, torch, vllm, transformers; print(sys.version.split()[0], torch.__version__, 'vllm', vllm.__version__, 'transformers', transformers.__version__)";
  git log -1 --format='commit %H' 2>/dev/null; } > "$OUT/env-$(basename "$0" .sh).txt" 2>&1
cat "$OUT/env-$(basename "$0" .sh).txt"
# Orpheus-3B shapes, random weights whose audio rows are scaled so the model
# writes audio tokens without a logits mask (tiny_orpheus.write_random_orpheus),
# and SNAC 24 kHz at its real shape, random: both through the real loaders.
if [ ! -f "$CKPT/model.safetensors" ]; then
  t=$(date +%s)
  python3 -m rtserver.voices.orpheus_layout "$CKPT" --shape $SHAPE --weights audio-biased
  python3 -m rtserver.vocoder.snac_layout "$CKPT/snac" --shape $SNAC_SHAPE
  echo "checkpoints written in $(( $(date +%s) - t )) s"
fi
