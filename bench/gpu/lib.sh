# Sourced by the bench/gpu scripts. wait_ready LOG PID WHAT: wait until LOG says "ready on";
# exit 1 with LOG's tail if PID has died, or (with `left` defined: seconds left in the call)
# kill PID and exit 1 when under 60 s remain. Prints how long the wait took from T0.
wait_ready() {
  until grep -qs "ready on" "$1"; do
    kill -0 "$2" 2>/dev/null || { tail -30 "$1"; exit 1; }
    if declare -F left > /dev/null && [ "$(left)" -lt 60 ]; then
      echo "$3 not ready in time"; kill "$2"; exit 1
    fi
    sleep 1
  done
  echo "$3 ready after $(( $(date +%s) - ${T0:-$(date +%s)} )) s"
}
# worker_scrapes FILE [TIMEOUT]: every 2 s, a "# t=<unix seconds>" line, /proc/stat's cpu line
# (as "# cpu ...": the host's stolen share, tools.measure.host_cpu) and the GPU worker's
# rtserver_* samples from :9100/metrics (TIMEOUT s a scrape, default 5) into FILE, until killed;
# run it in the background (`worker_scrapes F & S=$!`). Read by tools.measure.worker_intervals.
worker_scrapes() {
  while true; do
    echo "# t=$(date +%s.%N)"; head -1 /proc/stat | sed "s/^/# /"
    python3 -c "import urllib.request,sys;sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:9100/metrics',timeout=${2:-5}).read().decode())" 2>/dev/null | grep -E '^rtserver_'
    sleep 2
  done > "$1"
}
# jit_restore: unpack the compile caches a run saved (carried as .gpu/jit/*.tgz) into $HOME and
# /tmp, so vLLM's start can skip FlashInfer's JIT of its top-k/top-p sampler (the likely cause of
# 149 s of the H100 start of session 14: worker.log, 16:20:45 "Free memory on device" to 16:23:14,
# vLLM's sampler warm-up) and most of torch.compile. jit_save DIR: write them as DIR/jit-fi.tgz (FlashInfer) and
# DIR/jit-compile.tgz (vLLM's torch.compile cache, Inductor's, Triton's); a file over the
# device's 16 MiB limit does not come back, the run itself is unchanged.
jit_restore() {
  for f in .gpu/jit/jit-fi.tgz .gpu/jit/jit-compile.tgz; do
    [ -f "$f" ] && tar xzf "$f" -C / && echo "restored $f"
  done
  return 0
}
jit_save() {
  tar czf "$1/jit-fi.tgz" -C / "${HOME#/}/.cache/flashinfer" 2>/dev/null
  tar czf "$1/jit-compile.tgz" -C / $(cd / && ls -d "${HOME#/}/.cache/vllm/torch_compile_cache" \
    "${HOME#/}/.triton" "tmp/torchinductor_$(id -un)" 2>/dev/null) 2>/dev/null
  ls -la "$1"/jit-*.tgz 2>/dev/null
  return 0
}
# vllm_wheels: the vLLM set into /tmp/site in the call the last of its eight parts arrives
# (.gpu/vllm/recv.sh 7), unless a call before installed it.
vllm_wheels() {
  [ -d /tmp/site/vllm ] || { bash .gpu/vllm/recv.sh 7 >/dev/null && bash .gpu/vllm/install.sh | tail -1; }
  vllm_plugin_entry_point
}
# vllm_plugin_entry_point: pyproject's vllm.general_plugins entry point as a dist-info in
# /tmp/site (the tree runs from PYTHONPATH, uninstalled), so vLLM's EngineCore process
# registers the logits-head Llama (rtserver/engine/vllm_plugin.py) as an install would.
vllm_plugin_entry_point() {
  python3 - <<'PY'
import pathlib, tomllib
eps = tomllib.loads(pathlib.Path("pyproject.toml").read_text())["project"]["entry-points"]
d = pathlib.Path("/tmp/site/rtserver_tree_plugins-0.dist-info")
d.mkdir(parents=True, exist_ok=True)
(d / "METADATA").write_text("Metadata-Version: 2.1\nName: rtserver-tree-plugins\nVersion: 0\n")
group = "vllm.general_plugins"
(d / "entry_points.txt").write_text(
    f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps[group].items()))
PY
}
# server_wheels SRV: the server's staged wheels (SRV: a stage.sh folder, part 0) into /tmp/site,
# unless a wheel set with the server's stack is there already (e.g. the Orpheus runs' vLLM
# set); then any carried .gpu/extra/*.whl, once a machine, keeping py-spy (pip --target
# --upgrade replaces /tmp/site/bin with the extras', which took py-spy away in session 17);
# then libopus from a .deb beside the parts if the system lacks it.
server_wheels() {
  [ -d /tmp/site/fastapi ] && [ -d /tmp/site/zmq ] && [ -d /tmp/site/opuslib ] \
    || { bash "$1"/recv.sh 0 >/dev/null && bash "$1"/install.sh | tail -1; }
  if ls .gpu/extra/*.whl >/dev/null 2>&1 && [ ! -f /tmp/site/.extras-installed ]; then
    cp /tmp/site/bin/py-spy /tmp/py-spy.keep 2>/dev/null
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \
      .gpu/extra/*.whl 2>&1 | grep -v '^WARNING'
    [ -f /tmp/py-spy.keep ] && [ ! -e /tmp/site/bin/py-spy ] && mkdir -p /tmp/site/bin \
      && cp /tmp/py-spy.keep /tmp/site/bin/py-spy
    touch /tmp/site/.extras-installed
  fi
  if ! ldconfig -p | grep -q 'libopus\.so' && ls "$1"/libopus0_*.deb >/dev/null 2>&1; then
    dpkg -x "$1"/libopus0_*.deb /tmp/libopus && cp -a /tmp/libopus/usr/lib/x86_64-linux-gnu/libopus.so.0* \
      /usr/local/lib/ && ln -sf libopus.so.0 /usr/local/lib/libopus.so && ldconfig
  fi
  return 0
}

# snac_alone OUT T0: SNAC at the real 24 kHz shape (random weights) with CUDA graphs, torch's
# layers against [orpheus.vocoder] snake_conv = "triton": ms a call of 1, 16 and 64 windows of
# 22 frames (a steady chunk of 16 with its context and lookahead) in OUT/snac-timing-*.txt,
# then the kernels' full decode against float32 torch layers and their seams in
# OUT/snac-seams-triton.txt. T0: the call's start, for the progress lines.
snac_alone() {
  local sc
  for sc in torch triton; do
    timeout 100 python3 -m rtserver.tools.measure.snac timing --device cuda --graphs \
      --snake-conv $sc --frames 22 --batch 1 16 64 > "$1"/snac-timing-$sc.txt 2>&1
    echo "snac timing, $sc: rc $? ($(( $(date +%s) - $2 )) s)"; grep -E '^batch' "$1"/snac-timing-$sc.txt
  done
  timeout 80 python3 -m rtserver.tools.measure.snac seams --device cuda --snake-conv triton \
    --frames 40 > "$1"/snac-seams-triton.txt 2>&1
  echo "snac seams: rc $? ($(( $(date +%s) - $2 )) s)"; head -4 "$1"/snac-seams-triton.txt
}

# mps_start DIR / mps_stop: NVIDIA's Multi-Process Service for the processes started after it
# (its control daemon, pipes and logs under DIR; the GPU's compute mode is left as it is). Two
# processes on one GPU without it are time-sliced: the vLLM EngineCore's kernels and the worker's
# SNAC kernels ran one context at a time (bench/results/h200-orpheus-timeline-2026-12-04: both
# "in flight" 30-39 % of a window, contention, not concurrency); under MPS they share the SMs.
# Returns 1 (and the run goes on without it) where the daemon cannot start.
mps_start() {
  command -v nvidia-cuda-mps-control >/dev/null || { echo "MPS: no nvidia-cuda-mps-control"; return 1; }
  mkdir -p "$1"/pipe "$1"/log
  export CUDA_MPS_PIPE_DIRECTORY="$1"/pipe CUDA_MPS_LOG_DIRECTORY="$1"/log
  nvidia-cuda-mps-control -d || { echo "MPS: the daemon did not start"; unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY; return 1; }
  echo "MPS: daemon started ($1)"
}
mps_stop() {
  [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ] && echo quit | nvidia-cuda-mps-control
  return 0
}
