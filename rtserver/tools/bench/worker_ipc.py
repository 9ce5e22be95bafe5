"""The GPU worker's link alone: what moving PCM from a worker process to a
front end costs (ZMQ + msgpack, ``rtserver/worker/``), without a model.

A worker process (``WorkerServer``) serves a synthetic voice whose chunks are
ready at once; this process is one front end (``WorkerLink`` +
``RemoteVoice``) consuming N streams at a time. Per level: chunks per
second through the link and the CPU each side spent per chunk (user +
system, /proc), which says how much of a core the link takes at a given
number of streams, and whether shared-memory rings would be worth writing;
and the delay from the worker's send to the front end's read (bucket bounds
of ``rtserver_gpu_worker_chunk_delay_seconds``, reported in ms).

    python -m rtserver.tools.bench.worker_ipc --streams 1,16,64,256 \\
        --chunk-samples 2048 --chunks 200 --out bench-out/worker-ipc

``--realtime X`` paces each stream at X times real time (the voice waits
between chunks) instead of as fast as the link goes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import os
import tempfile
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from rtserver.audio.pcm import PcmChunk
from rtserver.config import GpuConfig
from rtserver.tools.bench.machine import describe, process_cpu_s
from rtserver.voices.base import SynthesisRequest, VoiceInfo
from rtserver.worker.proc import WorkerServer
from rtserver.worker.remote import RemoteVoice, WorkerLink

RATE = 24000
MIN_CHUNKS = 20_000  # per unpaced level: CPU ticks are 10 ms, so 0.5 us a chunk


class SyntheticVoice:
    """``chunks`` chunks of ``samples`` float32 samples per request, one every
    ``interval_s`` (0: as fast as they are taken)."""

    def __init__(self, samples: int, chunks: int, interval_s: float) -> None:
        self._info = VoiceInfo(name="synthetic:a", family="synthetic", sample_rate=RATE)
        self.block = (0.1 * np.sin(np.arange(samples) / 7.0)).astype(np.float32)
        self.chunks, self.interval_s = chunks, interval_s

    @property
    def info(self) -> VoiceInfo:
        return self._info

    async def warm_up(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def synthesize(self, request: SynthesisRequest) -> AsyncGenerator[PcmChunk, None]:
        """``request.text``: how many chunks (else ``chunks``)."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        count = int(request.text) if request.text.isdigit() else self.chunks
        for i in range(count):
            if self.interval_s:
                await asyncio.sleep(max(0.0, start + i * self.interval_s - loop.time()))
            else:
                await asyncio.sleep(0)  # let the other streams and the socket go
            yield PcmChunk(self.block, RATE)


def _worker_main(endpoint: str, samples: int, chunks: int, interval_s: float,
                 ready: Any) -> None:
    """The worker process: serve the synthetic voice until SIGTERM."""
    import signal

    import uvloop

    async def main() -> None:
        voice = SyntheticVoice(samples, chunks, interval_s)
        server = WorkerServer({voice.info.name: voice}, by_spec={}, default=voice.info.name,
                              capacity={"synthetic": 0}, config=GpuConfig())
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await server.serve(endpoint, stop, on_listening=ready.set)

    uvloop.run(main())


def _delay_buckets(link: WorkerLink) -> dict[float, float]:
    """Cumulative counts of the link's chunk-delay histogram, by upper bound (ms)."""
    out: dict[float, float] = {}
    for metric in link.chunk_delay_seconds.collect():
        for sample in metric.samples:
            if sample.name.endswith("_bucket"):
                out[round(float(sample.labels["le"]) * 1000.0, 6)] = sample.value
    return out


def _quantile_bound(before: dict[float, float], after: dict[float, float], q: float) -> float:
    """The bucket bound (ms) under which ``q`` of the level's chunk delays fell."""
    total = after[math.inf] - before.get(math.inf, 0.0)
    for le in sorted(after):
        if total and after[le] - before.get(le, 0.0) >= q * total:
            return le
    return math.inf


async def _level(voice: RemoteVoice, streams: int, chunks: int, worker_pid: int, tag: str
                 ) -> dict[str, Any]:
    async def one(i: int) -> int:
        n = 0
        req = SynthesisRequest(text=str(chunks), request_id=f"{tag}-{i}", first=True)
        async for chunk in voice.synthesize(req):
            n += len(chunk.samples)
        return n

    w0, f0 = process_cpu_s(worker_pid) or 0.0, process_cpu_s(os.getpid()) or 0.0
    d0 = _delay_buckets(voice.link)
    t0 = time.monotonic()
    samples = await asyncio.gather(*(one(i) for i in range(streams)))
    wall = time.monotonic() - t0
    w1, f1 = process_cpu_s(worker_pid) or 0.0, process_cpu_s(os.getpid()) or 0.0
    total = sum(samples)
    d1 = _delay_buckets(voice.link)
    return {"streams": streams, "wall_s": wall, "samples": total,
            "delay_ms_p50_under": _quantile_bound(d0, d1, 0.5),
            "delay_ms_p99_under": _quantile_bound(d0, d1, 0.99),
            "audio_s_per_s": total / RATE / wall, "worker_cpu_s": w1 - w0,
            "front_cpu_s": f1 - f0}


async def run(levels: list[int], samples: int, chunks: int, realtime: float) -> dict[str, Any]:
    interval = samples / RATE / realtime if realtime > 0 else 0.0
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="rtserver-ipc-") as tmp:
        endpoint = f"ipc://{tmp}/w.sock"
        ready = ctx.Event()
        proc = ctx.Process(target=_worker_main, args=(endpoint, samples, chunks, interval, ready),
                           daemon=True)
        proc.start()
        assert proc.pid is not None
        # unpaced streams run far ahead of their consumer: no overloaded here
        link = WorkerLink(endpoint, GpuConfig(request_buffer_s=1e9))
        try:
            await asyncio.to_thread(ready.wait, 60)
            async with asyncio.timeout(60):
                hello = await link.start()
            voice = RemoteVoice(link, VoiceInfo(**msgspec.structs.asdict(hello.voices[0])))
            await _level(voice, 1, 100, proc.pid, "warm")
            rows = []
            for n in levels:
                # at least MIN_CHUNKS per level: /proc counts CPU in 10 ms ticks
                per = max(chunks, -(-MIN_CHUNKS // n)) if interval == 0 else chunks
                row = await _level(voice, n, per, proc.pid, f"s{n}")
                row["chunks"] = row["samples"] // samples
                for side in ("worker", "front"):
                    row[f"{side}_cpu_us_per_chunk"] = 1e6 * row[f"{side}_cpu_s"] / row["chunks"]
                row["chunks_per_s"] = row["chunks"] / row["wall_s"]
                rows.append(row)
                print(f"{n:5d} streams: {row['chunks_per_s']:9.0f} chunks/s "
                      f"({row['audio_s_per_s']:7.1f} s of audio/s), CPU per chunk: worker "
                      f"{row['worker_cpu_us_per_chunk']:5.1f} us, front end "
                      f"{row['front_cpu_us_per_chunk']:5.1f} us; send to read p50 < "
                      f"{row['delay_ms_p50_under']:g} ms, p99 < {row['delay_ms_p99_under']:g} ms",
                      flush=True)
        finally:
            await link.close()
            proc.terminate()
            proc.join(30)
    return {"chunk_samples": samples, "chunks_per_stream": chunks, "realtime": realtime,
            "levels": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rtserver.tools.bench.worker_ipc",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", default="1,16,64,256",
                   help="streams at once, a comma list (default 1,16,64,256)")
    p.add_argument("--chunk-samples", type=int, default=2048,
                   help="samples per chunk (default 2048: one SNAC frame, 85 ms at 24 kHz)")
    p.add_argument("--chunks", type=int, default=200,
                   help="chunks per stream (default 200; unpaced levels take at least "
                   f"{MIN_CHUNKS} chunks in all)")
    p.add_argument("--realtime", type=float, default=0.0,
                   help="pace each stream at this many times real time (default 0: unpaced)")
    p.add_argument("--out", help="folder for results.json")
    args = p.parse_args(argv)
    levels = [int(x) for x in args.streams.split(",") if x.strip()]
    import uvloop

    result = uvloop.run(run(levels, args.chunk_samples, args.chunks, args.realtime))
    result["machine"] = describe()
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
