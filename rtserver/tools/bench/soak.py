"""Soak: N real-time streams for a set time: ``python -m rtserver.tools.bench.soak``.

Each stream is one user on one connection: it speaks a corpus reply as
words at 40 a second, collects every frame, listens to it in real time (a
simulated listener honouring the `buffer` hints, bench/listener.py) and
speaks the next. Every ``bargein_every``-th turn is cancelled 0.8 s after its
`end` (mid-audio), and every ``reconnect_every``-th turn opens a new connection, so
the server's per-context and per-connection paths are exercised for the
whole run. Every ``sample_s`` the server process's RSS, open file
descriptors and threads are sampled (from /proc: the server must run on
this machine; ``--spawn`` starts one).

Lost frames are counted per context: a gap in the seqs, or fewer frames
received than `done.frames` (or than `cancelled.last_seq` + 1). Underruns of
the simulated listener are reported beside them.

Example::

    nice -n 5 python -m rtserver.tools.bench.soak --spawn --streams 6 --duration-s 1800 \\
        --out bench/results/soak-2026-12-03
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rtserver.client import RtClient, RtClientError, SeqGapError, ServerError
from rtserver.tools.bench.corpus import fragments, select, token_offsets
from rtserver.tools.bench.listener import simulate

TOKENS_PER_S = 40.0  # a typical chat LLM's output rate (as bench/loads.py)
BARGEIN_AFTER_S = 0.8  # after `end`: the first audio is out (TTFA ~0.1-0.6 s here)


@dataclass
class Totals:
    turns: int = 0
    done: int = 0
    cancelled: int = 0
    failed: int = 0
    frames: int = 0
    lost_frames: int = 0
    seq_gaps: int = 0
    underran: int = 0
    reconnects: int = 0
    refused: int = 0  # starts refused with a retry_after_ms, retried after it (as a client does)
    errors: dict[str, int] = field(default_factory=dict)
    ttfa_ms: list[float] = field(default_factory=list)  # done.ttfa_ms (server)
    failures: list[str] = field(default_factory=list)


@dataclass
class Sample:
    t_s: float
    rss_mb: float
    fds: int
    threads: int
    turns: int
    lost_frames: int


def proc_stats(pid: int) -> tuple[float, int, int]:
    """(RSS MB, open fds, threads) of process ``pid``."""
    rss = 0.0
    threads = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
        elif line.startswith("Threads:"):
            threads = int(line.split()[1])
    return rss, len(os.listdir(f"/proc/{pid}/fd")), threads


async def one_turn(client: RtClient, rng: random.Random, totals: Totals, bargein: bool,
                   n: int) -> float:
    """Speak one reply; return how long its listener plays after ``done``."""
    utt = rng.choice(select("en"))
    pieces = fragments(utt.text, "word")
    offsets = token_offsets(len(pieces), TOKENS_PER_S, 0.3, rng)
    while True:
        try:
            ctx = await client.start(f"t{n}")
            break
        except ServerError as exc:  # admission's refusal: retry after the server's delay
            if exc.error.retry_after_ms is None:
                raise
            totals.refused += 1
            await asyncio.sleep(exc.error.retry_after_ms / 1000)
    t0 = time.monotonic()
    for piece, at in zip(pieces, offsets, strict=True):
        delay = t0 + at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        await ctx.send_text(piece)
    await ctx.end()
    if bargein:  # the user talks over the reply (mid-audio on this machine)
        try:
            async with asyncio.timeout(BARGEIN_AFTER_S):
                await ctx.wait()
        except TimeoutError:
            await ctx.cancel()
    result = await ctx.collect(decode=False)
    totals.turns += 1
    received = result.frame_count
    totals.frames += received
    for err in result.errors:
        totals.errors[err.code] = totals.errors.get(err.code, 0) + 1
    if isinstance(result.failure, SeqGapError):
        totals.seq_gaps += 1
        totals.lost_frames += max(1, result.failure.got - result.failure.expected)
    if result.done is not None:
        totals.done += 1
        totals.lost_frames += max(0, result.done.frames - received)
        if result.done.ttfa_ms is not None:
            totals.ttfa_ms.append(result.done.ttfa_ms)
    elif result.cancelled is not None:
        totals.cancelled += 1
        totals.lost_frames += max(0, result.cancelled.last_seq + 1 - received)
    else:
        totals.failed += 1
        totals.failures.append(repr(result.error or result.failure))
    arrivals = [(m.received_at, len(m.frames)) for m in result.frames]
    hints = [(t, h.prebuffer_ms) for t, h in result.times.buffer_hints]
    if arrivals and result.done is not None:
        play = simulate(arrivals, result.started.frame_ms, hints)
        totals.underran += play.underruns > 0
        if play.end_at is not None:
            return max(0.0, play.end_at - time.monotonic())
    return 0.0


async def user(url: str, index: int, deadline: float, totals: Totals, bargein_every: int,
               reconnect_every: int, delay_s: float = 0.0) -> None:
    rng = random.Random(index)
    n = 0
    await asyncio.sleep(delay_s)  # users arrive spread out, as in the steady bench
    while time.monotonic() < deadline:
        try:
            async with RtClient.connect(url) as client:
                for _ in range(reconnect_every):
                    if time.monotonic() >= deadline:
                        return
                    n += 1
                    listen_s = await one_turn(client, rng, totals,
                                              bargein=n % bargein_every == 0, n=n)
                    await asyncio.sleep(listen_s)
        except (RtClientError, TimeoutError, OSError) as exc:  # counted, then reconnect
            totals.failed += 1
            totals.failures.append(f"user {index} at {time.monotonic() - deadline:+.0f} s: "
                                   f"{exc!r}")
            await asyncio.sleep(1.0)
        totals.reconnects += 1


async def soak(url: str, pid: int, streams: int, duration_s: float, sample_s: float,
               bargein_every: int, reconnect_every: int, stagger_s: float = 0.0,
               progress: Any = print) -> tuple[Totals, list[Sample]]:
    totals = Totals()
    samples: list[Sample] = []
    began = time.monotonic()
    deadline = began + duration_s

    async def sampler() -> None:
        while True:
            rss, fds, threads = proc_stats(pid)
            samples.append(Sample(round(time.monotonic() - began, 1), round(rss, 1), fds,
                                  threads, totals.turns, totals.lost_frames))
            progress(f"t={samples[-1].t_s:.0f}s rss={rss:.1f}MB fds={fds} threads={threads} "
                     f"turns={totals.turns} lost={totals.lost_frames} "
                     f"underran={totals.underran} refused={totals.refused}")
            await asyncio.sleep(sample_s)

    sampling = asyncio.create_task(sampler())
    try:
        await asyncio.gather(*(user(url, i, deadline, totals, bargein_every, reconnect_every,
                                    delay_s=stagger_s * i / streams)
                               for i in range(streams)))
    finally:
        sampling.cancel()
        await asyncio.sleep(1.0)  # the server settles after the last turns
        rss, fds, threads = proc_stats(pid)
        samples.append(Sample(round(time.monotonic() - began, 1), round(rss, 1), fds, threads,
                              totals.turns, totals.lost_frames))
    return totals, samples


def rss_verdict(samples: list[Sample], warmup_s: float) -> dict[str, float]:
    """RSS after warm-up: the median of the first and the last quarter, and the
    least-squares slope in MB per hour."""
    rows = [s for s in samples if s.t_s >= warmup_s] or samples
    q = max(1, len(rows) // 4)
    first = statistics.median(s.rss_mb for s in rows[:q])
    last = statistics.median(s.rss_mb for s in rows[-q:])
    xs = [s.t_s / 3600 for s in rows]
    ys = [s.rss_mb for s in rows]
    slope = statistics.linear_regression(xs, ys).slope if len(rows) > 2 else 0.0
    return {"first_quarter_mb": round(first, 1), "last_quarter_mb": round(last, 1),
            "growth_mb": round(last - first, 1), "slope_mb_per_hour": round(slope, 1)}


def main(argv: list[str] | None = None) -> int:
    from rtserver.tools.bench.machine import describe, versions
    from rtserver.tools.bench.server_proc import free_port, rtserver_command, spawn

    p = argparse.ArgumentParser(prog="python -m rtserver.tools.bench.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spawn", action="store_true", help="start a server on a free port")
    p.add_argument("--url", help="a running server's ws://HOST:PORT/v1/stream (with --pid)")
    p.add_argument("--pid", type=int, help="the running server's process id (for RSS/fds)")
    p.add_argument("--voice", default=None)
    p.add_argument("--streams", type=int, default=6)
    p.add_argument("--duration-s", type=float, default=1800.0)
    p.add_argument("--sample-s", type=float, default=10.0)
    p.add_argument("--warmup-s", type=float, default=120.0)
    p.add_argument("--bargein-every", type=int, default=7)
    p.add_argument("--reconnect-every", type=int, default=5)
    p.add_argument("--stagger-s", type=float, default=8.0,
                   help="users arrive evenly over this many seconds (the steady bench's 8)")
    p.add_argument("--rss-growth-mb", type=float, default=20.0,
                   help="the most RSS may grow after warm-up for a pass")
    p.add_argument("--rss-slope-mb-h", type=float, default=2.0,
                   help="the steepest RSS slope after warm-up (MB an hour) for a pass "
                        "(issue 27's bound)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    server = None
    if args.spawn:
        port = free_port()
        log_dir = args.out or Path("bench/results/soak")
        server = spawn(rtserver_command(port, args.voice), port, log_dir / "server.log")
        url, pid = server.url, server.pid
    elif args.url and args.pid:
        url, pid = args.url, args.pid
    else:
        p.error("--spawn, or --url with --pid")
    started = dt.datetime.now(dt.UTC)
    try:
        totals, samples = asyncio.run(soak(url, pid, args.streams, args.duration_s,
                                           args.sample_s, args.bargein_every,
                                           args.reconnect_every, args.stagger_s,
                                           progress=lambda m: print(m, flush=True)))
    finally:
        code = server.stop(grace_s=30.0) if server is not None else None
    rss = rss_verdict(samples, args.warmup_s)
    fds = [s.fds for s in samples if s.t_s >= args.warmup_s] or [s.fds for s in samples]
    passed = (totals.lost_frames == 0 and totals.seq_gaps == 0 and totals.failed == 0
              and not totals.errors and rss["growth_mb"] <= args.rss_growth_mb
              and rss["slope_mb_per_hour"] <= args.rss_slope_mb_h)
    ttfa = sorted(totals.ttfa_ms)

    def pct(q: float) -> float:
        return ttfa[min(len(ttfa) - 1, int(q * len(ttfa)))] if ttfa else float("nan")

    machine = describe()
    meta: dict[str, Any] = {"date": started.strftime("%Y-%m-%d %H:%M UTC"),
            "command": "python -m rtserver.tools.bench.soak " + " ".join(argv or sys.argv[1:]),
            "niceness": os.nice(0), "machine": machine, "versions": versions(),
            "voice": args.voice or "the default (piper:en_US-joe-medium)",
            "server_exit_code": code}
    body = {"meta": meta, "args": {k: str(v) for k, v in vars(args).items()},
            "totals": asdict(totals) | {"ttfa_ms": None}, "rss": rss,
            "fds": {"min": min(fds), "max": max(fds)}, "passed": passed,
            "samples": [asdict(s) for s in samples]}
    m = machine
    lines = [
        f"# Soak, {meta['date']}", "",
        f"- Command: `{meta['command']}` (niceness {meta['niceness']}; the machine is "
        "shared with other work, client and server on it over loopback)",
        f"- Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']:.1f} GiB; "
        f"Python {m['python']}; voice {meta['voice']}",
        f"- {args.streams} users, each a real-time stream (speak, listen, speak again), "
        f"for {args.duration_s:.0f} s; every {args.bargein_every}th turn cancelled 0.8 s "
        f"after its `end` (unless done by then), a new connection every "
        f"{args.reconnect_every} turns; users arrived evenly over {args.stagger_s:g} s and "
        "retried a refused start after its `retry_after_ms`",
        "", "| turns | done | cancelled | failed | frames | lost frames | seq gaps "
        "| listeners underran | reconnects | starts refused (retried) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {totals.turns} | {totals.done} | {totals.cancelled} | {totals.failed} | "
        f"{totals.frames} | {totals.lost_frames} | {totals.seq_gaps} | {totals.underran} | "
        f"{totals.reconnects} | {totals.refused} |", "",
        f"Server TTFA (done.ttfa_ms): p50 {pct(0.5):.0f} ms, p95 {pct(0.95):.0f} ms, "
        f"p99 {pct(0.99):.0f} ms over {len(ttfa)} contexts.", "",
        f"RSS after {args.warmup_s:.0f} s of warm-up: first quarter {rss['first_quarter_mb']} "
        f"MB, last quarter {rss['last_quarter_mb']} MB (growth {rss['growth_mb']} MB, "
        f"slope {rss['slope_mb_per_hour']} MB/hour); open fds {min(fds)}-{max(fds)}; "
        f"server exit code {code}.", "",
        f"Errors: {totals.errors or 'none'}; failures: {totals.failures[:5] or 'none'}.", "",
        f"Verdict: {'PASS' if passed else 'FAIL'} (zero lost frames, no failed turn, no "
        f"error, RSS growth after warm-up <= {args.rss_growth_mb:g} MB and slope <= "
        f"{args.rss_slope_mb_h:g} MB/hour).", "",
        "## Samples", "", "| t s | RSS MB | fds | threads | turns | lost |",
        "|---:|---:|---:|---:|---:|---:|",
        *[f"| {s.t_s:.0f} | {s.rss_mb} | {s.fds} | {s.threads} | {s.turns} | "
          f"{s.lost_frames} |" for s in samples[::max(1, len(samples) // 40)]],
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(body, indent=2))
        (args.out / "summary.md").write_text(text)
        from rtserver.tools.bench import plots
        if plots.available():
            print(f"plot: {plots.plot_soak(samples, args.warmup_s, rss, args.out / 'soak.png')}")
        else:
            print(plots.NO_MATPLOTLIB)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
