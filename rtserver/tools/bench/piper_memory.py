"""Native memory of the Piper voice: ``python -m rtserver.tools.bench.piper_memory``.

RSS (``VmRSS``) of this process while it works, every few steps; after a
warm-up a flat series is the goal (the soak's bound: <= 20 MB of growth).
``--trim`` also calls glibc's ``malloc_trim(0)`` at each sample and prints
the RSS after it: memory that the trim gives back was free but retained
(fragmentation), memory it does not was in use.

- ``core``: contexts through the speech core with the embedded voice (Opus,
  48 kHz), ``--concurrency`` at a time, whole replies of the bench corpus;
  no sockets. Prints TTFA (p50) per step too.
- ``ort``: the voice's two onnxruntime graphs alone (narrow and wide
  sessions, as ``PiperVoice`` makes them) from ``--threads`` threads, with
  random phoneme counts (3-300) and decode windows (10-165 frames, the chunk
  plan's range), each session option switchable.
- ``time``: milliseconds per call of the front and the decoder at a few fixed
  sizes, memory patterns on and off (median of ``--reps``).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import functools
import os
import random
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _trim() -> float:
    """RSS after glibc's ``malloc_trim(0)``."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_mb()


def _sample(step: int, trim: bool, extra: str = "") -> None:
    rss = rss_mb()
    after = f" trimmed {_trim():7.1f}" if trim else ""
    print(f"{step:6d} rss {rss:7.1f}{after}{extra}", flush=True)


async def run_core(contexts: int, every: int, concurrency: int, trim: bool) -> None:
    import gc

    from rtserver.config import Config
    from rtserver.core import SpeechCore, speak
    from rtserver.protocol.messages import Done, Start
    from rtserver.tools.bench.corpus import select
    from rtserver.voices.registry import load_voices

    cfg = Config()
    voices = await load_voices(cfg.voice, cfg.families, progress=lambda m: None)
    try:
        core = SpeechCore(voices.voices, segmenter_config=cfg.segmenter,
                          hint_config=cfg.hints, opus_config=cfg.opus)
        for voice in voices.warm_up_via:
            await voice.warm_up()
        rng = random.Random(1)
        replies = select("en")
        ttfa: list[float] = []

        async def one(n: int) -> None:
            start = Start(context=f"c{n}", format="opus", sample_rate=48000)
            async with speak(core, start) as stream:
                stream.feed(rng.choice(replies).text)
                stream.end()
                async for event in stream.events():
                    if isinstance(event, Done):
                        if event.ttfa_ms is not None:
                            ttfa.append(event.ttfa_ms)
                        break

        print(f"     0 rss {rss_mb():7.1f} (voices loaded and warm)", flush=True)
        done = 0
        t0 = time.monotonic()
        while done < contexts:
            await asyncio.gather(*(one(done + i) for i in range(concurrency)))
            done += concurrency
            if done % every < concurrency:
                gc.collect()
                p50 = statistics.median(ttfa) if ttfa else float("nan")
                _sample(done, trim, f" ttfa_p50 {p50:5.0f} ms  t {time.monotonic() - t0:4.0f} s")
                ttfa.clear()
    finally:
        await voices.close()


SHARED_ARENA = os.environ.get("RT_SHARED_ARENA", "")  # "", "pow2" or "same" (experiment)


def _sessions(mem_pattern: bool, arena: bool) -> tuple[list[tuple[Any, Any]], str]:
    """(front, decoder) pairs as ``PiperVoice`` makes them (narrow, wide; the
    decoder in the blocked layout where it applies)."""
    import onnxruntime

    from rtserver.voices.piper.blocked import blocked_decoder
    from rtserver.voices.piper.graph import split_voice
    from rtserver.voices.piper.voice import embedded_voice_files, session_options

    split = split_voice(embedded_voice_files().model)
    blocked = blocked_decoder(split.decoder, split.cut.z) if split.conv2d else None
    if SHARED_ARENA:
        info = onnxruntime.OrtMemoryInfo("Cpu", onnxruntime.OrtAllocatorType.ORT_ARENA_ALLOCATOR,
                                         0, onnxruntime.OrtMemType.DEFAULT)
        cfg = onnxruntime.OrtArenaCfg(0, 1 if SHARED_ARENA == "same" else 0, -1, -1)
        onnxruntime.create_and_register_allocator(info, cfg)

    def session(model: Any, threads: int) -> Any:
        options = session_options(model, threads, mem_pattern=mem_pattern, arena=arena,
                                  shared_arena=bool(SHARED_ARENA))
        return onnxruntime.InferenceSession(
            model if isinstance(model, bytes) else str(model), sess_options=options,
            providers=["CPUExecutionProvider"])

    cores = os.cpu_count() or 1
    decoder = blocked or split.decoder
    pairs = [(session(split.front, 1), session(decoder, 1))]
    if cores > 1:
        pairs.append((session(split.front, cores), session(decoder, cores)))
    return pairs, split.cut.z


def _front_feed(n: int, rng: random.Random) -> dict[str, Any]:
    return {"input": np.asarray([[rng.randint(1, 150) for _ in range(n)]], dtype=np.int64),
            "input_lengths": np.asarray([n], dtype=np.int64),
            "scales": np.asarray([0.667, 1.0, 0.8], dtype=np.float32)}


def run_ort(iterations: int, threads: int, mem_pattern: bool, arena: bool, trim: bool,
            shrink: bool = False) -> None:
    import onnxruntime

    pairs, z_name = _sessions(mem_pattern, arena)
    run_options = onnxruntime.RunOptions()
    if shrink:  # free the arena's unused regions at the end of each run
        run_options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    spent = [0.0]
    channels = 192  # en_US-joe-medium's latent channels (inter_channels)
    print(f"     0 rss {rss_mb():7.1f} (mem_pattern {mem_pattern}, arena {arena}, "
          f"{threads} threads)", flush=True)

    def work(seed: int, n: int) -> None:
        rng = random.Random(seed)
        for _ in range(n):
            front, decoder = rng.choice(pairs)
            feed = _front_feed(rng.randint(3, 300), rng)
            frames = rng.randint(10, 165)
            z = np.random.default_rng(seed).standard_normal((1, channels, frames))
            t = time.thread_time()
            front.run(None, feed, run_options)
            decoder.run(None, {z_name: z.astype(np.float32)}, run_options)
            spent[0] += time.thread_time() - t

    step = max(threads, iterations // 10)
    done = 0
    while done < iterations:
        per = step // threads
        workers = [threading.Thread(target=work, args=(done * 7 + t, per)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        done += per * threads
        _sample(done, trim, f"  cpu {1000 * spent[0] / done:.1f} ms per front + decode")


def run_time(reps: int) -> None:
    """Both settings' calls interleaved, so a change in the machine's load
    falls on both alike."""
    rng = random.Random(0)
    calls: dict[tuple[bool, str], Callable[[], object]] = {}
    for mem_pattern in (True, False):
        pairs, z_name = _sessions(mem_pattern, True)
        front, decoder = pairs[0]  # one thread per call, as under load
        for n in (30, 120):
            feed = _front_feed(n, random.Random(n))
            calls[mem_pattern, f"front {n} ids"] = functools.partial(front.run, None, feed)
        for frames in (20, 60, 140):
            z = np.random.default_rng(frames).standard_normal((1, 192, frames)).astype(np.float32)
            calls[mem_pattern, f"decode {frames} frames"] = functools.partial(
                decoder.run, None, {z_name: z})
    times: dict[tuple[bool, str], list[float]] = {k: [] for k in calls}
    keys = list(calls)
    for _ in range(reps):
        rng.shuffle(keys)
        for key in keys:
            t = time.perf_counter()
            calls[key]()
            times[key].append(1000 * (time.perf_counter() - t))
    for mem_pattern in (True, False):
        print(f"mem_pattern {mem_pattern!s:5}: " + ", ".join(
            f"{name} {statistics.median(v[1:]):.1f} ms"
            for (on, name), v in times.items() if on == mem_pattern), flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m rtserver.tools.bench.piper_memory",
                                description=__doc__.splitlines()[0] if __doc__ else None)
    sub = p.add_subparsers(dest="mode", required=True)
    c = sub.add_parser("core")
    c.add_argument("--contexts", type=int, default=800)
    c.add_argument("--every", type=int, default=80)
    c.add_argument("--concurrency", type=int, default=4)
    c.add_argument("--trim", action="store_true")
    o = sub.add_parser("ort")
    o.add_argument("--iterations", type=int, default=2000)
    o.add_argument("--threads", type=int, default=3)
    o.add_argument("--mem-pattern", choices=("on", "off"), default="off")
    o.add_argument("--arena", choices=("on", "off"), default="on")
    o.add_argument("--shrink", action="store_true",
                   help="onnxruntime's arena shrinkage at the end of every run")
    o.add_argument("--trim", action="store_true")
    t = sub.add_parser("time")
    t.add_argument("--reps", type=int, default=20)
    args = p.parse_args(argv)
    if args.mode == "core":
        asyncio.run(run_core(args.contexts, args.every, args.concurrency, args.trim))
    elif args.mode == "ort":
        run_ort(args.iterations, args.threads, args.mem_pattern == "on", args.arena == "on",
                args.trim, args.shrink)
    else:
        run_time(args.reps)


if __name__ == "__main__":
    main()
