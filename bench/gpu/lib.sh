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
