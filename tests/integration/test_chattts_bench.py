"""The ChatTTS GPU benchmark's phases run on the CPU with the tiny checkpoint,
so a GPU run does not fail on a typo: prepare, the self-check, the engine
levels, start (server + one stream), burst, metrics, stop."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rtserver.tools.bench.store import read_results

pytest.importorskip("torch")


def phase(*args: str, timeout: float = 240) -> str:
    proc = subprocess.run([sys.executable, "-m", "rtserver.tools.bench.gpu_chattts", *args],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    return proc.stdout


@pytest.mark.slow
def test_phases_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "out"
    common = ["--ckpt", str(tmp_path / "ck"), "--shape", "tiny", "--device", "cpu",
              "--out", str(out), "--slots", "4", "--max-len", "256"]
    phase("prepare", *common)
    phase("selfcheck", *common, "--check-batch", "2")
    check = json.loads((out / "selfcheck.json").read_text())
    assert check["max_abs_diff_hidden"]["alone_vs_batched"] < 1e-4
    phase("engine", *common, "--levels", "1,2", "--engine-steps", "8")
    levels = json.loads((out / "engine.json").read_text())["levels"]
    assert [lv["streams"] for lv in levels] == [1, 2]
    assert all(lv["steps_per_s_total"] > 0 for lv in levels)
    try:
        phase("start", *common, "--single-s", "1")
        single = read_results(out / "single")
        done = [s for s in single["samples"] if s["outcome"] == "done"]
        assert done and all(s["voice"] == "chattts:seed_1" for s in done if "voice" in s)
        phase("burst", *common, "--levels", "2", "--duration", "1")
        burst = read_results(out / "burst")
        assert not [s for s in burst["samples"] if s["outcome"] in ("error", "failed")]
        metrics = phase("metrics", *common)
        assert 'rtserver_engine_requests_total{engine="chattts"}' in metrics
    finally:
        phase("stop", *common)
    assert not (out / "server.json").exists()
