"""Where a run's raw samples go: ``results.json.gz``.

Raw per-context samples are large and read only by tools (``merge``, ad hoc
analysis), so they are stored gzipped; summaries and plots stay plain.
Older runs kept ``results.json``; ``read_results`` takes either.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

RESULTS = "results.json.gz"


def write_results(path: Path, results: Any) -> None:
    """Write ``results`` as gzipped JSON (mtime 0: the same run, the same bytes)."""
    data = json.dumps(results, indent=1, default=str).encode("utf-8")
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as out:
        out.write(data)


def emit_json(results: Any, out: str) -> None:
    """Print ``results`` as JSON and, with ``out``, write it there too (the
    GPU benches' one-line results, read back from the device's output)."""
    text = json.dumps(results, indent=1)
    print(text)
    if out:
        Path(out).write_text(text + "\n", encoding="utf-8")


def read_results(folder: Path) -> Any:
    """A run folder's results: ``results.json.gz``, or ``results.json`` of older runs."""
    packed = folder / RESULTS
    if packed.is_file():
        return json.loads(gzip.decompress(packed.read_bytes()))
    return json.loads((folder / "results.json").read_text(encoding="utf-8"))
