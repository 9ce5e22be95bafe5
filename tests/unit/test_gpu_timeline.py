"""The GPU timeline tool merges several processes' Chrome traces onto one axis."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from rtserver.tools.bench.gpu_timeline import load, main, summarise


def write(path: Path, base_ns: int, events: list[tuple[str, str, float, float]]) -> Path:
    trace = {"baseTimeNanoseconds": base_ns,
             "traceEvents": [{"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}
                             for cat, name, ts, dur in events]}
    with gzip.open(path, "wt") as f:
        json.dump(trace, f)
    return path


def test_two_processes_on_one_axis(tmp_path: Path) -> None:
    # engine: kernels 0-400 and 600-1000 µs; worker (its base 100 µs later): 300-500 µs
    write(tmp_path / "engine.pt.trace.json.gz", 0,
          [("cpu_op", "step", 0, 1000), ("kernel", "gemm", 0, 400), ("kernel", "gemm", 600, 400)])
    write(tmp_path / "worker.pt.trace.json.gz", 100_000,
          [("cpu_op", "decode", -100, 1000), ("kernel", "conv", 200, 200)])
    s = summarise([load(p) for p in sorted(tmp_path.iterdir())])
    assert s["window_ms"] == 1.0
    # busy: 0-500 and 600-1000 = 900 of 1000 µs; overlap 300-400 = 100 µs
    assert s["busy_share"] == pytest.approx(0.9)
    assert s["overlap_share"] == pytest.approx(0.1)
    assert s["idle_gaps"]["count"] == 1 and s["idle_gaps"]["p50_us"] == 100.0
    engine, worker = s["processes"]
    assert engine["gpu_ms"] == 0.8 and worker["gpu_ms"] == 0.2
    assert engine["top_kernels_ms"][0] == ("gemm", 0.8)


def test_main_writes_a_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path / "a.json.gz", 0, [("kernel", "k", 0, 10), ("kernel", "k", 5000, 10)])
    assert main([str(tmp_path), "--out", str(tmp_path / "s.md")]) == 0
    text = (tmp_path / "s.md").read_text()
    assert "longest 4.99 ms" in text and "gaps over 1 ms add up to 99.6 %" in text
    assert main([str(tmp_path / "empty")]) == 2
