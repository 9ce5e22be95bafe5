"""Time to first audio of the HTTP speech API, phrase-cache miss against hit.

``python -m rtserver.tools.bench.speech_api --spawn --repeats 12 --out DIR``

Each phrase (a greeting-like line, made unique per run) is asked for twice
through ``POST /v1/audio/speech``: the first time the server synthesizes it
(a miss), the second time it answers from the phrase cache (a hit). TTFA here
is the client's time from sending the request to the first byte of the audio
body. One request at a time, so the figures are the path's own, not queueing.
Writes ``results.json`` and ``summary.md`` (machine, versions, command, date).
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

from rtserver.tools.bench.machine import describe, versions
from rtserver.tools.bench.server_proc import free_port, http_get, rtserver_command, spawn
from rtserver.tools.bench.stats import percentile as _percentile

PHRASES = (
    "Hello, and welcome back! How can I help you today?",
    "Thanks for calling. Please hold while I look that up.",
    "Sorry, I didn't catch that. Could you say it again?",
    "Your order has been confirmed. Is there anything else?",
)


def percentile(values: list[float], q: float) -> float:
    """``q`` in 0..1."""
    out = _percentile(values, 100.0 * q)
    return float("nan") if out is None else out


@dataclass(frozen=True, slots=True)
class Sample:
    phrase: int
    hit: bool
    ttfa_ms: float
    total_ms: float
    bytes: int


def speak(base: str, text: str, fmt: str, voice: str, token: str | None) -> Sample:
    parts = urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80,
                                      timeout=60)
    body = json.dumps({"model": "tts-1", "voice": voice, "input": text,
                       "response_format": fmt}).encode()
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    t0 = time.perf_counter()
    conn.request("POST", "/v1/audio/speech", body=body, headers=headers)
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:500]!r}")
    first = resp.read(1)
    t1 = time.perf_counter()
    rest = resp.read()
    t2 = time.perf_counter()
    conn.close()
    return Sample(phrase=-1, hit=False, ttfa_ms=1000 * (t1 - t0), total_ms=1000 * (t2 - t0),
                  bytes=len(first) + len(rest))


def metric(base: str, name: str) -> float:
    status, body = http_get(base + "/metrics")
    if status != 200:
        return float("nan")
    return sum(float(line.split()[-1]) for line in body.decode().splitlines()
               if line.startswith(name + " "))


def run(base: str, *, repeats: int, fmt: str, voice: str, token: str | None) -> list[Sample]:
    tag = uuid.uuid4().hex[:6]  # fresh phrases: the first request of each is a miss
    samples: list[Sample] = []
    for i in range(repeats):
        text = f"{PHRASES[i % len(PHRASES)]} ({tag} {i})"
        for hit in (False, True):
            s = speak(base, text, fmt, voice, token)
            samples.append(Sample(i, hit, s.ttfa_ms, s.total_ms, s.bytes))
            print(f"[speech_api] phrase {i} {'hit ' if hit else 'miss'} ttfa {s.ttfa_ms:.1f} ms "
                  f"total {s.total_ms:.0f} ms {s.bytes} B", file=sys.stderr)
    return samples


def summary(samples: list[Sample], meta: dict[str, object]) -> str:
    lines = [f"# HTTP speech API: phrase-cache miss vs hit, {meta['date']}", "",
             f"- Machine: {meta['machine']}", f"- Versions: {meta['versions']}",
             f"- Command: `{meta['command']}`",
             f"- Cache counters over the run: {meta['cache']}", "",
             "TTFA = request sent -> first byte of the audio body (client side, loopback); "
             "one request at a time.", "",
             "| request | n | TTFA p50 ms | p95 | max | whole body p50 ms | bytes p50 |",
             "|---|---|---|---|---|---|---|"]
    for hit in (False, True):
        sel = [s for s in samples if s.hit == hit]
        if not sel:
            continue
        t = [s.ttfa_ms for s in sel]
        lines.append(f"| {'hit' if hit else 'miss'} | {len(sel)} | {percentile(t, 0.5):.1f} | "
                     f"{percentile(t, 0.95):.1f} | {max(t):.1f} | "
                     f"{percentile([s.total_ms for s in sel], 0.5):.0f} | "
                     f"{percentile([float(s.bytes) for s in sel], 0.5):.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rtserver.tools.bench.speech_api",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running server's http://HOST:PORT")
    where.add_argument("--spawn", action="store_true", help="start a server on a free port")
    p.add_argument("--voice", default="default")
    p.add_argument("--token")
    p.add_argument("--format", default="mp3")
    p.add_argument("--repeats", type=int, default=12)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    server = None
    if args.spawn:
        port = free_port()
        server = spawn(rtserver_command(port, None), port, args.out / "server.log")
        base = f"http://127.0.0.1:{port}"
    else:
        base = args.url.rstrip("/")
    try:
        hits0 = metric(base, "rtserver_phrase_cache_hits_total")
        miss0 = metric(base, "rtserver_phrase_cache_misses_total")
        speak(base, "Warming up.", args.format, args.voice, args.token)
        samples = run(base, repeats=args.repeats, fmt=args.format, voice=args.voice,
                      token=args.token)
        cache = {"hits": metric(base, "rtserver_phrase_cache_hits_total") - hits0,
                 "misses": metric(base, "rtserver_phrase_cache_misses_total") - miss0}
    finally:
        if server is not None:
            server.stop()
    m = describe()
    meta: dict[str, object] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{m['cpu']} ({m['cores']} cores, {m['memory_gib']} GiB), {m['os']}",
        "versions": ", ".join(f"{k} {v}" for k, v in versions().items()),
        "command": "python -m rtserver.tools.bench.speech_api "
         + " ".join(sys.argv[1:] if argv is None
                                                                     else argv),
        "cache": cache, "format": args.format}
    (args.out / "results.json").write_text(json.dumps(
        {"meta": meta, "samples": [asdict(s) for s in samples]}, indent=1))
    (args.out / "summary.md").write_text(summary(samples, meta))
    print((args.out / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
