"""The decode-attention self-check's own run: on the CPU under Triton's
interpreter, at small sizes, the two ways agree and the tool says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")


def test_the_self_check_reports_agreement(tmp_path: Path) -> None:
    out = tmp_path / "att.json"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "rtserver.tools.selfcheck.chattts_attention", "--device", "cpu",
         "--rows", "1,5", "--positions", "3:90", "--slots", "6", "--max-len", "130",
         "--calls", "1", "--repeats", "1", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=300,
        cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    levels = json.loads(out.read_text())["levels"]
    assert [lv["rows"] for lv in levels] == [1, 5]
    for lv in levels:
        assert lv["length_bucket"] == 128  # the longest row (at most 91) rounded up
        assert lv["max_abs_diff"] < 1e-5 * max(1.0, lv["ref_abs_max"])
        assert lv["sdpa_ms"] > 0 and lv["triton_ms"] > 0
