"""How fast this host's CPU runs one Python thread, and how much of it a hypervisor takes.

    python -m rtserver.tools.measure.host_cpu [--window 2]

The GPU runs' serving loops are single Python threads: vLLM's EngineCore busy loop
and the torch engine's step loop. Lent GPU machines of one kind differ in that: on
two H100 machines of 2026-12-07 the same tree's vLLM alone made 33.9k and 25.2k tokens
a second at 256 rows (7.35 and 9.83 ms a step) and the ChatTTS engine's host CPU time a
step at 256 rows was 0.43 and 0.74 ms with the GPU's time equal (4.64 and 4.65 ms), the
second machine's hypervisor taking 9.4 % of its CPU (``top``'s ``st``;
bench/results/h100-2026-12-07-s31). The GPU scripts write this tool's line into each
run's ``env.txt`` so a run's figures can be set beside the host's speed: the CPU's
model, cores, the best of ``REPEATS`` timings of a fixed pure-Python loop
(``LOOP`` additions, one thread), and the share of CPU time stolen since boot and
over ``--window`` seconds (``/proc/stat``'s steal column; Linux only).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rtserver.tools.bench.machine import cpu_model

LOOP = 5_000_000
REPEATS = 3
PROC_STAT = Path("/proc/stat")


@dataclass(frozen=True, slots=True)
class CpuTimes:
    """The first (all CPUs) line of /proc/stat, in jiffies."""

    total: int
    steal: int

    @classmethod
    def parse(cls, line: str) -> CpuTimes:
        """``cpu  user nice system idle iowait irq softirq steal guest guest_nice``;
        guest time is already counted in user, so it is left out of the total."""
        fields = line.split()
        if not fields or fields[0] != "cpu":
            raise ValueError(f"not /proc/stat's cpu line: {line[:60]!r}")
        values = [int(v) for v in fields[1:9]]  # user .. steal
        return cls(total=sum(values), steal=values[7] if len(values) > 7 else 0)

    def steal_share(self, earlier: CpuTimes | None = None) -> float:
        """The stolen share of CPU time since boot, or since ``earlier``."""
        total = self.total - (earlier.total if earlier else 0)
        steal = self.steal - (earlier.steal if earlier else 0)
        return steal / total if total > 0 else 0.0


def read_cpu_times(path: Path = PROC_STAT) -> CpuTimes | None:
    """/proc/stat's totals, or None where there is none (not Linux)."""
    try:
        with path.open(encoding="ascii") as f:
            return CpuTimes.parse(f.readline())
    except (OSError, ValueError):
        return None


def loop_seconds(n: int = LOOP, repeats: int = REPEATS) -> float:
    """The best of ``repeats`` timings of ``n`` additions in one Python thread."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        s = 0
        for i in range(n):
            s += i
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m rtserver.tools.measure.host_cpu",
                                 description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--window", type=float, default=2.0,
                    help="seconds over which to read the stolen share (default 2)")
    args = ap.parse_args(argv)
    t0, before = time.perf_counter(), read_cpu_times()
    loop = loop_seconds()
    rest = args.window - (time.perf_counter() - t0)
    if rest > 0:
        time.sleep(rest)
    after, elapsed = read_cpu_times(), time.perf_counter() - t0
    steal = ("steal n/a" if before is None or after is None else
             f"steal {100 * after.steal_share():.1f} % since boot, "
             f"{100 * after.steal_share(before):.1f} % over {elapsed:.1f} s")
    print(f"host cpu: {cpu_model()}, {os.cpu_count()} cores; python loop "
          f"{LOOP:,} additions {1e3 * loop:.0f} ms (best of {REPEATS}); {steal}")


if __name__ == "__main__":
    main()
