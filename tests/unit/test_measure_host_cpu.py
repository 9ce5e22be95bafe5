"""``tools.measure.host_cpu``: the host's one-thread speed and its stolen CPU share."""

from __future__ import annotations

from pathlib import Path

import pytest

from rtserver.tools.measure import host_cpu
from rtserver.tools.measure.host_cpu import CpuTimes, read_cpu_times

LINE = "cpu  100 5 50 800 20 0 5 20 0 0"  # user nice system idle iowait irq softirq steal ..


def test_the_cpu_line_gives_totals_and_the_stolen_share() -> None:
    boot = CpuTimes.parse(LINE)
    assert boot == CpuTimes(total=1000, steal=20)
    assert boot.steal_share() == pytest.approx(0.02)
    later = CpuTimes.parse("cpu  150 5 60 880 20 0 5 80 7 0")  # guest time is in user
    assert later.steal_share(boot) == pytest.approx(60 / 200)
    with pytest.raises(ValueError, match="not /proc/stat's cpu line"):
        CpuTimes.parse("cpu0 1 2 3")


def test_reading_proc_stat(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text(LINE + "\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
    assert read_cpu_times(stat) == CpuTimes(total=1000, steal=20)
    assert read_cpu_times(tmp_path / "none") is None
    assert host_cpu.loop_seconds(n=1000, repeats=2) > 0


def test_the_report_line(capsys: pytest.CaptureFixture[str],
                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_cpu, "loop_seconds", lambda: 0.25)
    host_cpu.main(["--window", "0"])
    out = capsys.readouterr().out
    assert out.startswith("host cpu: ") and "additions 250 ms (best of 3)" in out
    assert "steal" in out
