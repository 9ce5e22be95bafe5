"""Merge several runs' results (results.json.gz) into one report (``summary.md``, plots).

    python -m rtserver.tools.bench.merge --out bench/results/cpu-piper-DATE \\
        bench/results/cpu-piper-DATE/sweep bench/results/cpu-piper-DATE/bargein

Samples keep their labels (system, run, load, level); each run's command,
config and date are listed in the summary.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rtserver.tools.bench.__main__ import write_outputs
from rtserver.tools.bench.store import read_results


def merge(runs: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    first = runs[0]
    meta = dict(first["meta"])
    meta["runs"] = [{"name": n, "date": r["meta"]["date"], "command": r["meta"]["command"],
                     "config": r["config"]} for n, r in zip(names, runs, strict=True)]
    meta["command"] = "; ".join(r["meta"]["command"] for r in runs)
    notes: list[str] = []
    for r in runs:
        notes += [n for n in r["meta"].get("notes", []) if n not in notes]
    meta["notes"] = notes
    return {"meta": meta, "config": first["config"],
            "steps": [s for r in runs for s in r["steps"]],
            "samples": [s for r in runs for s in r["samples"]]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rtserver.tools.bench.merge", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--ttfa-p99-ms", type=float, default=None,
                   help="capacity bound (default: the first run's)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--note", action="append", default=[], help="a line for summary.md")
    p.add_argument("--drop", action="append", default=[], metavar="RUN:SYSTEM",
                   help="leave out one system's samples of one run (e.g. a step that "
                   "other processes disturbed); said in the summary")
    p.add_argument("runs", nargs="+", type=Path,
                   help="folders holding results.json.gz (or an older results.json)")
    args = p.parse_args(argv)
    runs = [read_results(d) for d in args.runs]
    names = [d.name for d in args.runs]
    notes = list(args.note)
    for spec in args.drop:
        name, _, system = spec.partition(":")
        run = runs[names.index(name)]
        run["samples"] = [x for x in run["samples"] if x.get("system") != system]
        run["steps"] = [x for x in run["steps"] if x.get("system") != system]
        notes.append(f"{system} samples of run {name} left out (`--drop {spec}`); its own "
                     f"results.json keeps them")
    merged = merge(runs, names)
    merged["meta"]["notes"] = [*merged["meta"]["notes"], *notes]
    bound = args.ttfa_p99_ms or float(runs[0]["config"]["ttfa_p99_ms"])
    args.out.mkdir(parents=True, exist_ok=True)
    paths = write_outputs(merged, args.out, bound, not args.no_plots)
    print(f"[bench] wrote {', '.join(str(x) for x in paths)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
