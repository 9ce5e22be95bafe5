"""Where a process's samples went, from py-spy's raw (folded) stacks.

    python -m rtserver.tools.measure.spy_stacks spy.txt[.gz] [--within NAME] [--top 30]

``py-spy record -f raw --threads`` writes one line per distinct stack:
``thread (tid): name;frame;frame;... <samples>``, each frame ``function (file:line)``.
This prints the samples per thread, then, of the samples whose stack passes through a
frame whose function is ``--within`` (e.g. ``EngineCoreProc.run_busy_loop``, vLLM's
busy loop; default: every sample), the functions below it by inclusive samples (a
function counted once per stack however deep it recurs) and the leaf frames. Used for
bench/results/h100-2026-12-07-s31 (vLLM's EngineCore at 256 Orpheus streams).
"""

from __future__ import annotations

import argparse
import gzip
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path


def function(frame: str) -> str:
    """A frame's function, without its ``(file:line)``."""
    return frame.split(" (", 1)[0].strip()


@dataclass
class Profile:
    """Sample counts of one py-spy raw file."""

    threads: Counter[str] = field(default_factory=Counter)
    within: int = 0  # samples that passed the ``within`` filter
    inclusive: Counter[str] = field(default_factory=Counter)
    leaf: Counter[str] = field(default_factory=Counter)


def read(lines: Iterable[str], within: str = "") -> Profile:
    """Count ``lines`` of py-spy raw output; ``within``: only stacks through that function."""
    prof = Profile()
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        prof.threads[frames[0].strip()] += n
        names = [function(f) for f in frames[1:]]
        if within:
            if within not in names:
                continue
            names = names[names.index(within) + 1:]  # what it called, not its callers
        prof.within += n
        for name in set(names):
            prof.inclusive[name] += n
        if names:
            prof.leaf[frames[-1].strip()] += n
    return prof


def report(prof: Profile, within: str = "", top: int = 30) -> str:
    """The threads, then the ``top`` functions by inclusive and by leaf samples."""
    out = ["| thread | samples |", "|---|---|"]
    out += [f"| {t} | {n} |" for t, n in prof.threads.most_common()]
    out += ["", f"{prof.within} samples" + (f" within {within}" if within else ""), "",
            "| inclusive | function |", "|---|---|"]
    out += [f"| {n} | {name} |" for name, n in prof.inclusive.most_common(top)]
    out += ["", "| leaf | frame |", "|---|---|"]
    out += [f"| {n} | {name} |" for name, n in prof.leaf.most_common(top)]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m rtserver.tools.measure.spy_stacks",
                                 description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("file", type=Path, help="py-spy record -f raw output, or .gz")
    ap.add_argument("--within", default="",
                    help="only stacks through this function (e.g. EngineCoreProc.run_busy_loop)")
    ap.add_argument("--top", type=int, default=30, help="functions listed (default 30)")
    args = ap.parse_args(argv)
    opener = gzip.open if args.file.suffix == ".gz" else open
    with opener(args.file, "rt", encoding="utf-8", errors="replace") as f:
        prof = read(f, args.within)
    print(report(prof, args.within, args.top))


if __name__ == "__main__":
    main()
