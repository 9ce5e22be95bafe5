"""How busy the GPU was while loaded, from the GPU scripts' nvidia-smi samples.

    python -m rtserver.tools.measure.gpu_busy gpu-util.txt[.gz] [--loaded 50] [--gap 3]

``bench/gpu/run_*.sh`` sample ``nvidia-smi --query-gpu=timestamp,utilization.gpu,
memory.used --format=csv,noheader -lms 200`` into ``gpu-util.txt``: one line a sample,
``<timestamp>, <N> %, <M> MiB``. A run's mean over every sample counts its start-up
and idle tail (sessions 18-22 read 43-63 % that way, where the loaded stretch of a 512-
stream level was 95.7-98.9 % busy: ``bench/results/h100-2026-12-06-s23``). This prints
the whole run's mean beside each loaded stretch's: samples at or above ``--loaded``
percent, a stretch going on through dips of at most ``--gap`` samples below it.
(nvidia-smi's figure is the time some kernel ran, not how full the GPU was.)
"""

from __future__ import annotations

import argparse
import gzip
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

SAMPLE_S = 0.2  # the scripts' -lms 200


@dataclass(frozen=True, slots=True)
class Stretch:
    start: int  # sample index
    samples: list[float]

    @property
    def seconds(self) -> float:
        return len(self.samples) * SAMPLE_S

    @property
    def mean(self) -> float:
        return statistics.fmean(self.samples)


def read_samples(path: Path) -> list[float]:
    """Utilization percentages in order; lines without one are skipped."""
    opener = gzip.open if path.suffix == ".gz" else open
    out: list[float] = []
    with opener(path, "rt") as f:
        for line in f:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) >= 2 and parts[1].endswith("%"):
                try:
                    out.append(float(parts[1].rstrip("%").strip()))
                except ValueError:
                    continue
    return out


def loaded_stretches(samples: Sequence[float], loaded: float, gap: int) -> list[Stretch]:
    """Runs of samples >= ``loaded``, bridging dips of at most ``gap`` samples
    (the dips count in the stretch's mean)."""
    out: list[Stretch] = []
    start = last = -1
    for i, v in enumerate(samples):
        if v < loaded:
            continue
        if start >= 0 and i - last - 1 > gap:
            out.append(Stretch(start, list(samples[start:last + 1])))
            start = -1
        if start < 0:
            start = i
        last = i
    if start >= 0:
        out.append(Stretch(start, list(samples[start:last + 1])))
    return out


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("path", type=Path)
    p.add_argument("--loaded", type=float, default=50.0, help="percent: a sample under load")
    p.add_argument("--gap", type=int, default=3, help="samples a stretch bridges")
    a = p.parse_args(argv)
    samples = read_samples(a.path)
    if not samples:
        raise SystemExit(f"{a.path}: no utilization samples")
    print(f"whole run: {len(samples) * SAMPLE_S:.1f} s, mean {statistics.fmean(samples):.1f} %")
    print("| stretch | from s | seconds | mean % | lowest % |")
    print("|---|---|---|---|---|")
    for n, s in enumerate(loaded_stretches(samples, a.loaded, a.gap), 1):
        print(f"| {n} | {s.start * SAMPLE_S:.1f} | {s.seconds:.1f} | {s.mean:.1f} "
              f"| {min(s.samples):.0f} |")


if __name__ == "__main__":
    main()
