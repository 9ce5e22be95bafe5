"""gpu_busy: the loaded stretches of nvidia-smi's samples, not the whole run's mean."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from rtserver.tools.measure.gpu_busy import loaded_stretches, main, read_samples


def _write(path: Path, values: list[int]) -> None:
    lines = [f"2026/12/06 16:13:{i // 5:02d}.{i % 5 * 200:03d}, {v} %, 51234 MiB\n"
             for i, v in enumerate(values)]
    with gzip.open(path, "wt") as f:
        f.write("".join(lines) + "garbage line\n")


def test_a_loaded_level_reads_busy_where_the_whole_run_does_not(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    values = [0] * 40 + [100, 99, 100, 30, 100, 98, 100, 100] + [0] * 40 + [70, 90]
    path = tmp_path / "gpu-util.txt.gz"
    _write(path, values)
    assert read_samples(path) == [float(v) for v in values]
    first, second = loaded_stretches(read_samples(path), 50, 3)
    assert (first.start, len(first.samples)) == (40, 8)  # the dip to 30 is bridged
    assert first.mean == pytest.approx((100 + 99 + 100 + 30 + 100 + 98 + 100 + 100) / 8)
    assert second.samples == [70.0, 90.0]
    # a dip longer than the gap splits a stretch
    assert len(loaded_stretches([100, 0, 0, 0, 0, 100], 50, 3)) == 2
    main([str(path)])
    out = capsys.readouterr().out
    assert "whole run: 18.0 s, mean 9.9 %" in out  # the kind of figure sessions 18-22 read
    assert "| 1 | 8.0 | 1.6 | 90.9 | 30 |" in out
