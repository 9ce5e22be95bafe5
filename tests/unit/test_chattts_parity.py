"""The ChatTTS parity suite (tests/parity), run from the main suite.

tests/parity compares rtserver's ChatTTS with upstream's ``chattts`` 0.2.5 on
one tiny random checkpoint in upstream's layout: prompt ids, speakers, GPT
logits, the sampler's distribution, Decoder/DVAE/Vocos output, the loader
and the text normaliser. Upstream needs torchaudio, which has no build for
this venv's torch, so the suite runs in its own venv, ``.venv-parity/``
(``scripts/setup-parity.sh``, which ``scripts/setup.sh test`` runs), as a
subprocess: against upstream's code every time, never against stored numbers.
A missing parity venv is a failure, not a skip.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_parity_suite_passes_against_upstream_chattts() -> None:
    venv = Path(os.environ.get("RTSERVER_PARITY_VENV", ROOT / ".venv-parity"))
    py = venv / "bin" / "python"
    assert py.is_file(), (f"no parity venv at {venv}: run scripts/setup-parity.sh "
                          "(scripts/setup.sh test does)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [str(py), "-m", "pytest", "-q", "-rA", "-s", "-p", "no:cacheprovider",
         "tests/parity"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    sys.stdout.write(out[-6000:])
    assert proc.returncode == 0, f"parity suite failed (rc {proc.returncode}):\n{out[-12000:]}"
