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
