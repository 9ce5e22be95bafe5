#!/usr/bin/env bash
# Build .venv-parity/: a second virtual environment in which upstream ChatTTS
# (the `chattts` package, 0.2.5) imports and runs on the CPU, for the parity
# suite in tests/parity (run by tests/unit/test_chattts_parity.py).
#
# Why a second venv: chattts imports torchaudio, and no torchaudio release is
# built for the main venv's torch (2.13). PyPI's Linux torch wheels are CUDA
# builds of several GB; the CPU torch 2.13.0 wheel the main venv uses is the
# one pip's find-links holds on disk. PyPI's torchaudio 2.11.1 wheel is a CUDA
# build whose native extension needs libc10_cuda.so, which a CPU torch lacks;
# upstream uses only torchaudio's MelSpectrogram (pure Python over
# torch.stft), so the extension's three .so files are removed after install
# and torchaudio runs in its own supported no-extension mode
# (torchaudio/_extension/utils.py: "False if the library file is not found").
# Every package is pinned in scripts/parity-requirements.txt and installed
# with --no-deps (torchaudio's metadata pins torch==2.11.1, which a resolver
# would satisfy with a CUDA build).
#
# Idempotent: a second run checks the stamp (the lock file's hash) and the import.
# Usage: scripts/setup-parity.sh [VENV_DIR]   (default .venv-parity)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
V="${1:-.venv-parity}"
lock=scripts/parity-requirements.txt
want="$(sha256sum "$lock" | cut -c1-16)-v1"
check=(-c "import ChatTTS, torch, torchaudio; torchaudio.transforms.MelSpectrogram(24000, n_fft=1024, hop_length=256, n_mels=100)(torch.zeros(1, 4096))")
if [ -f "$V/.parity-stamp" ] && [ "$(cat "$V/.parity-stamp")" = "$want" ] \
    && "$V/bin/python" "${check[@]}" >/dev/null 2>&1; then
  exit 0
fi
echo "setup-parity: building $V (upstream chattts 0.2.5 on CPU torch 2.13.0; about 1.5 GB)"
rm -rf "$V"
"$PY" -m venv "$V"
"$V/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$lock"
site="$("$V/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
rm -f "$site"/torchaudio/lib/*.so
"$V/bin/python" "${check[@]}"
echo "$want" > "$V/.parity-stamp"
