"""What the HTTP layer costs on the speech path, measured against a running server.

``python -m rtserver.tools.measure.http_speech --url http://127.0.0.1:8765 [--requests 300]``

One keep-alive connection, requests one after another (no other load from
here), wall times in ms, p50 and p99:

- ``health``: ``GET /health``, the routing alone;
- ``cached``: ``POST /v1/audio/speech`` of one phrase already in the phrase
  cache (pcm): parsing and validating the body, auth and admission, then the
  cached bytes; no synthesis. ``ttfb`` to the body's first byte (the status
  line is sent before any audio), ``total`` to the body's end;
- ``new``: a phrase not spoken before (``--new`` of them, pcm): ``ttfb`` is
  the time to first audio through HTTP, synthesis included.

Run it against two servers in turn (before and after a change, alternating)
on a quiet machine; it prints one JSON line.
"""

from __future__ import annotations

import argparse
import http.client
import json
import time
import urllib.parse
from collections.abc import Callable

import numpy as np

PHRASE = "A phrase the cache holds, said again and again."


def _percentiles(ms: list[float]) -> dict[str, float]:
    a = np.asarray(ms)
    return {"p50": round(float(np.percentile(a, 50)), 2),
            "p99": round(float(np.percentile(a, 99)), 2), "n": len(ms)}


class _Client:
    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1",
                                               parts.port or 80, timeout=60)

    def request(self, method: str, path: str, body: dict[str, object] | None = None
                ) -> tuple[float, float, int]:
        """(ms to the body's first byte, ms to its end, status)."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        t0 = time.perf_counter()
        self.conn.request(method, path, body=data, headers=headers)
        resp = self.conn.getresponse()
        first = resp.read(1)  # a chunked body: the first chunk (the status comes at once)
        t1 = time.perf_counter()
        if first:
            resp.read()
        t2 = time.perf_counter()
        return (t1 - t0) * 1000, (t2 - t0) * 1000, resp.status


def _speech(text: str) -> dict[str, object]:
    return {"model": "tts-1", "voice": "default", "input": text, "response_format": "pcm"}


def measure(url: str, requests: int, new: int) -> dict[str, object]:
    client = _Client(url)

    def series(n: int, call: Callable[[int], tuple[float, float, int]]
               ) -> tuple[list[float], list[float]]:
        first, whole = [], []
        for i in range(n):
            ttfb, total, status = call(i)
            if status != 200:
                raise RuntimeError(f"HTTP {status}")
            first.append(ttfb)
            whole.append(total)
        return first, whole

    series(20, lambda i: client.request("GET", "/health"))  # warm the connection
    _, health = series(requests, lambda i: client.request("GET", "/health"))
    client.request("POST", "/v1/audio/speech", _speech(PHRASE))  # into the cache
    cached_first, cached_whole = series(
        requests, lambda i: client.request("POST", "/v1/audio/speech", _speech(PHRASE)))
    stamp = time.time_ns()
    new_first, _ = series(new, lambda i: client.request(
        "POST", "/v1/audio/speech", _speech(f"Phrase {stamp} {i}, never said before.")))
    return {"url": url, "health_ms": _percentiles(health),
            "cached_ttfb_ms": _percentiles(cached_first),
            "cached_total_ms": _percentiles(cached_whole),
            "new_ttfb_ms": _percentiles(new_first)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--new", type=int, default=20)
    args = parser.parse_args()
    print(json.dumps(measure(args.url, args.requests, args.new)))


if __name__ == "__main__":
    main()
