"""Hostile messages over a real socket: ``python -m rtserver.tools.bench.fuzz``.

Every message it sends is invalid in a known way (an escaped lone surrogate,
a number past Python's digit limit, nesting past the parser's recursion limit,
``NaN``, every field of every message with every wrong JSON type, random
text, random binary frames, valid messages for contexts that do not exist,
unsupported formats), so each must be answered by exactly one ``error``,
and none may end its connection or touch the context that speaks on the
same connection meanwhile (its frames stay consecutive and it ends with
``done``). Messages over ``max_message_bytes`` (1009) and invalid UTF-8
(1007) close by design and are not sent.

Example (writes results.json and summary.md)::

    python -m rtserver.tools.bench.fuzz --spawn --messages 100000 --connections 8 \\
        --out bench/results/fuzz-2026-12-03
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import random
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from rtserver.protocol.wire import decode_audio_message

# Every field of every client message (PROTOCOL.md) with a valid value.
VALID: dict[str, dict[str, Any]] = {
    "start": {"voice": "default", "format": "opus", "sample_rate": 48000, "frame_ms": 20},
    "text": {"text": "hello"},
    "flush": {},
    "end": {},
    "cancel": {},
    "played": {"audio_ms": 120},
}
# JSON values of every type.
TYPED: list[Any] = [None, True, False, 0, -7, 2.5, "", "s", [], {}, [1, "x"], {"a": [1]}]
# Raw JSON text the parser must refuse wherever it appears.
HOSTILE_RAW = ['"\\ud800"', '"a\\udfffb"', '"\\udbff"', "9" * 4400, "-" + "1" * 5000,
               "NaN", "Infinity", "-Infinity", "[" * 5000 + "]" * 5000,
               '{"a":' * 3000 + "1" + "}" * 3000]
WINDOW = 64  # messages in flight per connection before waiting for replies
# Share of the server's input budget (``ready.limits``) a connection sends at:
# the fuzz tests what hostile *content* does; a rate over the budget is a
# flood, which the server cuts off by design (tests/integration/test_process_limits.py).
BUDGET_SHARE = 0.8


class Pacer:
    """Keeps one connection's sends under a message and byte rate (None: no
    limit): ``wait(size)`` sleeps until the next message of ``size`` bytes fits."""

    def __init__(self, messages_per_s: float | None, bytes_per_s: float | None) -> None:
        self.messages_per_s, self.bytes_per_s = messages_per_s, bytes_per_s
        self._t0 = time.perf_counter()
        self._messages = 0
        self._bytes = 0

    async def wait(self, size: int) -> None:
        self._messages += 1
        self._bytes += size
        due = max(self._messages / self.messages_per_s if self.messages_per_s else 0.0,
                  self._bytes / self.bytes_per_s if self.bytes_per_s else 0.0)
        ahead = due - (time.perf_counter() - self._t0)
        if ahead > 0:
            await asyncio.sleep(ahead)
VICTIM_TEXT = ("This context keeps speaking while its connection is fuzzed, and every one "
               "of its frames must arrive in order.")


def _raw(body: dict[str, Any], name: str, raw: str) -> str:
    body = {**body, name: "\x00X\x00"}
    return json.dumps(body).replace('"\\u0000X\\u0000"', raw)


def hostile_message(rng: random.Random, n: int) -> str | bytes:
    """The ``n``-th hostile message (each answered by exactly one error)."""
    roll = rng.random()
    kind = rng.choice(list(VALID))
    target = "victim" if rng.random() < 0.3 else f"ghost{n % 97}"
    body: dict[str, Any] = {"type": kind, "context": target, **VALID[kind]}
    if kind == "start":
        body["context"] = f"fz{n}"  # never a name that is open
    if roll < 0.35:  # a hostile value in any field, a known one or not
        name = rng.choice([*body, "extra"])
        return _raw(body, name, rng.choice(HOSTILE_RAW))
    if roll < 0.70:  # a known field with a value of a wrong type
        name = rng.choice(list(body))
        good = body[name]
        wrong = [v for v in TYPED if type(v) is not type(good)
                 and not (name == "audio_ms" and type(v) in (int, float))
                 and not (kind == "start" and name not in ("type", "context") and v is None)]
        if name == "context":
            wrong += ["", "x" * 65]
        body[name] = rng.choice(wrong)
        return json.dumps(body)
    if roll < 0.80:  # a valid message for a context that does not exist
        kind = rng.choice(["text", "flush", "end", "played"])
        return json.dumps({"type": kind, "context": f"ghost{n}", **VALID[kind]})
    if roll < 0.85:
        field_name, value = rng.choice([("format", "mp3"), ("sample_rate", 44100),
                                        ("frame_ms", 25)])
        return json.dumps({"type": "start", "context": f"fz{n}", field_name: value})
    if roll < 0.93:  # random text
        return "".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0xA0, 0xD7FF)]))
                       for _ in range(rng.randrange(0, 40)))
    return rng.randbytes(rng.randrange(0, 40))  # binary: server to client only


@dataclass
class ConnResult:
    sent: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    victim_frames: int = 0
    victim_done_frames: int | None = None
    victim_gaps: int = 0
    victim_error: str | None = None
    closed: str | None = None  # how it ended, if it ended early


async def fuzz_connection(url: str, count: int, seed: int) -> ConnResult:
    """One connection: a speaking victim context plus ``count`` hostile messages."""
    rng = random.Random(seed)
    out = ConnResult()
    replies = asyncio.Semaphore(WINDOW)
    victim_done = asyncio.Event()
    stream: int | None = None
    next_seq = 0

    ready: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()

    async def read(ws: Any) -> None:
        nonlocal stream, next_seq
        async for data in ws:
            if isinstance(data, bytes):
                msg = decode_audio_message(data)
                if msg.stream == stream:
                    if msg.seq != next_seq:
                        out.victim_gaps += 1
                    next_seq = msg.seq + len(msg.frames)
                    out.victim_frames += len(msg.frames)
                continue
            body = json.loads(data)
            kind = body.get("type")
            if kind == "ready" and not ready.done():
                ready.set_result(body.get("limits") or {})
            if kind == "started" and body.get("context") == "victim":
                stream = body["stream"]
            elif kind == "done" and body.get("context") == "victim":
                out.victim_done_frames = body["frames"]
                victim_done.set()
            elif kind == "error":
                if body.get("context") == "victim" and body["code"] in ("engine_failed",
                                                                         "internal"):
                    out.victim_error = body["code"]
                    victim_done.set()
                out.errors[body["code"]] += 1
                replies.release()

    try:
        async with connect(url, compression=None, max_size=None) as ws:
            reader = asyncio.create_task(read(ws))
            async with asyncio.timeout(30):
                limits = await ready
            rate_m, rate_b = limits.get("messages_per_s"), limits.get("input_bytes_per_s")
            pacer = Pacer(rate_m * BUDGET_SHARE if rate_m else None,
                          rate_b * BUDGET_SHARE if rate_b else None)
            await ws.send(json.dumps({"type": "start", "context": "victim"}))
            await ws.send(json.dumps({"type": "text", "context": "victim",
                                      "text": VICTIM_TEXT[:40]}))
            for n in range(count):
                await replies.acquire()
                message = hostile_message(rng, n)
                await pacer.wait(len(message.encode() if isinstance(message, str)
                                     else message))
                await ws.send(message)
                out.sent += 1
                if n == count // 2:
                    await ws.send(json.dumps({"type": "text", "context": "victim",
                                              "text": VICTIM_TEXT[40:]}))
            await ws.send(json.dumps({"type": "end", "context": "victim"}))
            async with asyncio.timeout(60):
                for _ in range(WINDOW):  # every reply is in
                    await replies.acquire()
            async with asyncio.timeout(120):
                await victim_done.wait()
            reader.cancel()
    except (ConnectionClosed, TimeoutError, OSError) as exc:
        out.closed = f"{type(exc).__name__}: {exc}"
    return out


@dataclass
class FuzzReport:
    messages: int
    connections: int
    seed: int
    seconds: float
    errors: dict[str, int]
    unanswered: int
    closed_early: list[str]
    victims_done: int
    victim_gaps: int
    victim_frames_missing: int
    victim_errors: list[str]

    @property
    def passed(self) -> bool:
        return (self.unanswered == 0 and not self.closed_early and self.victim_gaps == 0
                and self.victims_done == self.connections and self.victim_frames_missing == 0
                and not self.victim_errors)


async def run_fuzz(url: str, messages: int, connections: int, seed: int = 1) -> FuzzReport:
    """Spread ``messages`` over ``connections`` concurrent connections."""
    per = [messages // connections + (1 if i < messages % connections else 0)
           for i in range(connections)]
    began = time.perf_counter()
    results = await asyncio.gather(*(fuzz_connection(url, n, seed * 1000 + i)
                                     for i, n in enumerate(per)))
    errors: Counter[str] = Counter()
    for r in results:
        errors.update(r.errors)
    sent = sum(r.sent for r in results)
    return FuzzReport(
        messages=sent, connections=connections, seed=seed,
        seconds=round(time.perf_counter() - began, 2), errors=dict(errors),
        unanswered=sent - sum(errors.values()),
        closed_early=[r.closed for r in results if r.closed],
        victims_done=sum(r.victim_done_frames is not None for r in results),
        victim_gaps=sum(r.victim_gaps for r in results),
        victim_frames_missing=sum(max(0, (r.victim_done_frames or 0) - r.victim_frames)
                                  for r in results),
        victim_errors=[r.victim_error for r in results if r.victim_error])


def _summary(report: FuzzReport, meta: dict[str, Any]) -> str:
    lines = [f"# Fuzz over a real socket, {meta['date']}", "",
             f"Command: `{meta['command']}`", "",
             f"Machine: {meta['machine']['cpu']}, {meta['machine']['cores']} cores; "
             f"Python {meta['machine']['python']}; server voice: {meta['voice']}.", "",
             "| messages | connections | seconds | unanswered | closed early | victims done "
             "| victim seq gaps | victim frames missing |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|",
             f"| {report.messages} | {report.connections} | {report.seconds} | "
             f"{report.unanswered} | {len(report.closed_early)} | {report.victims_done} | "
             f"{report.victim_gaps} | {report.victim_frames_missing} |", "",
             "Errors by code: " + ", ".join(f"`{k}` {v}" for k, v in
                                            sorted(report.errors.items())), "",
             f"Server RSS before/after: {meta['rss_mb'][0]:.1f} / {meta['rss_mb'][1]:.1f} MB; "
             f"`/health` after: {meta['health_after']}.", "",
             f"Verdict: {'PASS' if report.passed else 'FAIL'} (every message answered by one "
             "error, no connection ended, every victim context done with consecutive frames)."]
    return "\n".join(lines) + "\n"


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main(argv: list[str] | None = None) -> int:
    from rtserver.tools.bench.machine import describe
    from rtserver.tools.bench.server_proc import free_port, http_get, rtserver_command, spawn

    p = argparse.ArgumentParser(prog="python -m rtserver.tools.bench.fuzz", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spawn", action="store_true", help="start a server on a free port")
    p.add_argument("--url", help="a running server's ws://HOST:PORT/v1/stream")
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--connections", type=int, default=8)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--voice", default=None)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    server = None
    if args.spawn:
        port = free_port()
        out_dir = args.out or Path("bench/results/fuzz")
        server = spawn(rtserver_command(port, args.voice), port, out_dir / "server.log")
        url = server.url
    elif args.url:
        url = args.url
    else:
        p.error("--spawn or --url")
    try:
        rss_before = _rss_mb(server.pid) if server else 0.0
        report = asyncio.run(run_fuzz(url, args.messages, args.connections, args.seed))
        base = url.replace("ws://", "http://").rsplit("/v1/", 1)[0]
        health, _ = http_get(base + "/health")
        rss_after = _rss_mb(server.pid) if server else 0.0
    finally:
        if server is not None:
            server.stop()
    meta = {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "python -m rtserver.tools.bench.fuzz " + " ".join(argv or sys.argv[1:]),
            "machine": describe(), "voice": args.voice or "the default (Piper)",
            "rss_mb": [rss_before, rss_after], "health_after": health}
    text = _summary(report, meta)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(
            {"meta": meta, "report": asdict(report), "passed": report.passed}, indent=2))
        (args.out / "summary.md").write_text(text)
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
