"""The WebSocket transport's own CPU cost: websockets' server against uvicorn.

``python -m rtserver.tools.bench.transport_cpu --streams 8 --messages 3000 --size 420``

Each implementation runs in a server process of its own (uvloop, the settings
rtserver used with it: ``websockets.asyncio.server.serve`` with compression
off as before the ASGI swap, and uvicorn with ``ws="websockets-sansio"``,
httptools and ``AsgiWebSocket`` as now). Each of ``--streams`` clients asks
for ``--messages`` binary messages of ``--size`` bytes (420 B: an audio
message of 5 Opus frames at 32 kbit/s with its headers) and reads them as fast
as it can; then each sends as many small text messages (a token's ``text``)
and the server reads them. The figure is the server process's CPU time (user + system, from
/proc) per message and per MiB, which other load on the machine does not
change the way it changes latency. Rounds alternate the implementations.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from rtserver.tools.bench.machine import describe, process_cpu_s, versions
from rtserver.tools.bench.server_proc import free_port, spawn

IMPLS = ("websockets", "uvicorn")


async def _answer(request: str, recv: Callable[[], Awaitable[object]],
                  send: Callable[[str | bytes], Awaitable[None]]) -> None:
    """One client request, ``"recv N SIZE"`` (read N messages) or ``"send N SIZE"``
    (send N binary messages of SIZE bytes), answered ``"end"``; the same for
    both implementations."""
    verb, n, size = request.split()
    if verb == "recv":  # the client sends n text messages
        for _ in range(int(n)):
            await recv()
    else:
        payload = b"\x00" * int(size)
        for _ in range(int(n)):
            await send(payload)
    await send("end")


async def _serve_websockets(port: int) -> None:
    from websockets.asyncio.server import ServerConnection, serve
    from websockets.http11 import Request, Response

    async def handler(ws: ServerConnection) -> None:
        async for msg in ws:
            await _answer(str(msg), ws.recv, ws.send)

    def ready(connection: ServerConnection, request: Request) -> Response | None:
        from http import HTTPStatus

        if request.path == "/ready":
            return connection.respond(HTTPStatus.OK, "ready\n")
        return None

    async with serve(handler, "127.0.0.1", port, compression=None, max_size=65536,
                     process_request=ready, server_header=None):
        await asyncio.Future()


async def _serve_uvicorn(port: int) -> None:
    import uvicorn

    from rtserver.server.asgi import AsgiWebSocket, request_of

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ready\n"})
            return
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        ws = AsgiWebSocket(receive, send, request_of(scope))
        try:
            while True:
                await _answer(str(await ws.recv()), ws.recv, ws.send)
        except Exception:
            return

    config = uvicorn.Config(app, host="127.0.0.1", port=port, ws="websockets-sansio",
                            http="httptools", lifespan="off", ws_max_size=65536,
                            ws_per_message_deflate=False, server_header=False,
                            date_header=False, access_log=False, log_config=None)
    await uvicorn.Server(config).serve()


async def _client(url: str, streams: int, messages: int, size: int, verb: str = "send"
                  ) -> float:
    from websockets.asyncio.client import connect

    async def one() -> None:
        async with connect(url, compression=None, max_size=None) as ws:
            await ws.send(f"{verb} {messages} {size}")
            if verb == "recv":  # text messages the size of an LLM token's
                for _ in range(messages):
                    await ws.send('{"type":"text","context":"c1","text":" word"}')
                assert await ws.recv() == "end"
                return
            got = 0
            while (msg := await ws.recv()) != "end":
                got += len(msg)
            assert got == messages * size

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(streams)))
    return time.perf_counter() - t0


def measure(impl: str, streams: int, messages: int, size: int, out: Path) -> dict[str, float]:
    port = free_port()
    cmd = [sys.executable, "-m", "rtserver.tools.bench.transport_cpu", "--serve", impl,
           "--port", str(port)]
    server = spawn(cmd, port, out / f"{impl}.log", ready_timeout_s=30)
    try:
        url = f"ws://127.0.0.1:{port}/v1/stream"
        asyncio.run(_client(url, 1, 10, size))  # warm-up
        cpu0 = process_cpu_s(server.pid) or 0.0
        wall = asyncio.run(_client(url, streams, messages, size))
        cpu1 = process_cpu_s(server.pid) or 0.0
        asyncio.run(_client(url, streams, messages, size, "recv"))
        cpu_in = (process_cpu_s(server.pid) or 0.0) - cpu1
    finally:
        server.stop()
    total = streams * messages
    cpu = cpu1 - cpu0
    return {"cpu_s": cpu, "wall_s": wall, "messages": total,
            "cpu_us_per_message": 1e6 * cpu / total,
            "cpu_ms_per_mib": 1e3 * cpu / (total * size / 2**20),
            "cpu_us_per_received": 1e6 * cpu_in / total}


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rtserver.tools.bench.transport_cpu")
    p.add_argument("--serve", choices=IMPLS, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--messages", type=int, default=3000)
    p.add_argument("--size", type=int, default=420)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("transport-cpu"))
    args = p.parse_args(argv)
    if args.serve:
        import uvloop

        uvloop.run(_serve_websockets(args.port) if args.serve == "websockets"
                   else _serve_uvicorn(args.port))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, object]] = []
    for r in range(args.rounds):
        for impl in IMPLS:
            res = measure(impl, args.streams, args.messages, args.size, args.out)
            runs.append({"impl": impl, "round": r, **res})
            print(f"[transport_cpu] {impl:10} round {r}: {res['cpu_us_per_message']:.1f} us/msg "
                  f"server CPU, {res['wall_s']:.2f} s wall", file=sys.stderr)
    m = describe()
    lines = [f"# WebSocket transport CPU, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
             "", f"- Machine: {m['cpu']} ({m['cores']} cores), {m['os']}",
             "- Versions: " + ", ".join(f"{k} {v}" for k, v in versions().items()),
             "- Command: `python -m rtserver.tools.bench.transport_cpu "
             + " ".join(sys.argv[1:] if argv is None else argv) + "`",
             f"- {args.streams} streams x {args.messages} binary messages of {args.size} B, "
             "read as fast as the client can; server CPU from /proc (user + system)", "",
             "| transport | server CPU us per message sent (median of rounds) | min | max | "
             "ms CPU per MiB sent | wall s (median) | us per text message received (median) |",
             "|---|---|---|---|---|---|---|"]
    for impl in IMPLS:
        sel = sorted((r for r in runs if r["impl"] == impl),
                     key=lambda r: float(r["cpu_us_per_message"]))  # type: ignore[arg-type]
        mid = sel[len(sel) // 2]
        walls = sorted(float(r["wall_s"]) for r in sel)  # type: ignore[arg-type]
        lines.append(f"| {impl} | {float(mid['cpu_us_per_message']):.1f} | "  # type: ignore[arg-type]
                     f"{float(sel[0]['cpu_us_per_message']):.1f} | "  # type: ignore[arg-type]
                     f"{float(sel[-1]['cpu_us_per_message']):.1f} | "  # type: ignore[arg-type]
                     f"{float(mid['cpu_ms_per_mib']):.1f} | {walls[len(walls) // 2]:.2f} | "  # type: ignore[arg-type]
                     f"{_median([float(r['cpu_us_per_received']) for r in sel]):.1f} |")  # type: ignore[arg-type]
    (args.out / "results.json").write_text(json.dumps(runs, indent=1))
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
