"""A short real run of the benchmark: it spawns rtserver with the default Piper
voice on a free 127.0.0.1 port, speaks streamed and barged-in turns from two
users for a few seconds, and writes its reports (well under 60 s)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rtserver.testing.wait import scaled
from rtserver.tools.bench.store import read_results


def test_bench_against_a_spawned_server_measures_every_context(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "rtserver.tools.bench", "--spawn", "--load", "stream,bargein",
             "--concurrency", "2", "--duration", "3", "--warmup", "1", "--seed", "smoke",
             "--out", str(out)],
            capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as exc:  # what it printed, and the server's side
        raise AssertionError(f"{_text(exc.stderr)[-4000:]}\n--- server.log:\n"
                             f"{_tail(out / 'server.log')}") from None
    assert proc.returncode == 0, f"{proc.stderr[-3000:]}\n--- server.log:\n" + _tail(
        out / "server.log")
    assert "[bench] rtserver stream/word sweep 2: start" in proc.stderr  # progress lines

    results = read_results(out)
    samples = results["samples"]
    streamed = [s for s in samples if s["load"] == "stream/word"]
    barged = [s for s in samples if s["kind"] == "bargein"]
    assert len(streamed) >= 2
    assert {s["user"] for s in streamed} == {0, 1}
    assert all(s["outcome"] == "done" for s in streamed), [s.get("error") for s in streamed]
    failed = [(s.get("error"), s.get("error_message")) for s in samples
              if s["outcome"] in ("error", "failed")]
    assert not failed, f"{failed}\n--- server.log:\n{_tail(out / 'server.log')}"
    for s in streamed:
        assert s["ttfa_ms"] is not None and 0 < s["ttfa_ms"] < 1000 * scaled(5)
        assert s["ttfa_first_text_ms"] >= s["ttfa_ms"]
        assert s["audio_ms"] > 0 and s["frames"] > 0
        assert s["underruns"] is not None
    # each barge-in either cancelled mid-turn (with its timing) or finished first
    for s in barged:
        if s["outcome"] == "cancelled":
            assert s["cancel_to_cancelled_ms"] is not None and s["cancel_to_cancelled_ms"] >= 0
    assert [s for s in samples if s["kind"] == "after-bargein"]

    summary = (out / "summary.md").read_text()
    assert "## Capacity" in summary and "stream/word" in summary
    assert "python -m rtserver.tools.bench --spawn" in summary
    assert list(out.glob("ttfa_cdf_*.png")) and list(out.glob("realtime_*.png"))
    # the spawned server was stopped (its log is closed and says it ran)
    assert (out / "server.log").stat().st_size > 0
    assert "stopped pid" in proc.stderr


def _text(data: str | bytes | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data or ""


def _tail(path: Path, chars: int = 6000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(none)"
