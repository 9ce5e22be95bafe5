"""``python -m rtserver.tools.bench`` / ``rtserver bench``: run load patterns against rtserver
and write results.json.gz (every sample, gzip), summary.md and PNG plots.

Examples::

    python -m rtserver.tools.bench --spawn --load stream --concurrency 1,4,8,16,20,24 \\
        --ttfa-p99-ms 150 --baseline --out bench/results/cpu-piper-DATE
    python -m rtserver.tools.bench --url ws://127.0.0.1:8765/v1/stream --load bargein \\
        --concurrency 4 --duration 20
    python -m rtserver.tools.bench --spawn --arrival-rate 2,4,8 --duration 30
    python -m rtserver.tools.bench --spawn --ramp 1:24:1 --step-s 5
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from rtserver.client import RtClient
from rtserver.tools.bench import loads, metrics, plots, report
from rtserver.tools.bench.listener import ListenerConfig
from rtserver.tools.bench.loads import EVENT_TIMEOUT_S, PATTERNS, LoadConfig, RunState
from rtserver.tools.bench.machine import CpuMeter, describe, versions
from rtserver.tools.bench.server_proc import (
    SpawnedServer,
    aget,
    free_port,
    http_base,
    rtserver_command,
    spawn,
)
from rtserver.tools.bench.stats import percentile
from rtserver.tools.bench.store import RESULTS, write_results

PROGRESS_EVERY_S = 2.0


def _levels(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _rates(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _ramp(text: str) -> tuple[int, int, int]:
    parts = [int(x) for x in text.split(":")]
    if len(parts) == 2:
        parts.append(1)
    if len(parts) != 3 or parts[0] < 1 or parts[1] < parts[0] or parts[2] < 1:
        raise argparse.ArgumentTypeError("--ramp is START:STOP[:STEP] with 1 <= START <= STOP")
    return parts[0], parts[1], parts[2]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m rtserver.tools.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="a running server's ws://HOST:PORT/v1/stream")
    target.add_argument("--spawn", action="store_true",
                        help="start `python -m rtserver serve` on a free 127.0.0.1 port")
    p.add_argument("--voice", help="voice for --spawn and for every context")
    p.add_argument("--voices", default="",
                   help="comma list: each turn speaks one, drawn by the seed (LoRA voices "
                        "mixed); lists of one length draw the same texts")
    p.add_argument("--token", help="API key (Authorization: Bearer)")
    p.add_argument("--server-arg", action="append", default=[],
                   help="extra argument for the spawned server (repeatable)")
    p.add_argument("--ready-timeout", type=float, default=120.0,
                   help="seconds to wait for a spawned server's /ready (default 120; vLLM "
                   "voices with CUDA graphs take minutes)")
    p.add_argument("--load", default="stream",
                   help=f"comma list of patterns: {', '.join(PATTERNS)} (default stream)")
    p.add_argument("--fragment", default="word", choices=["token", "word", "whole"],
                   help="how stream-like turns cut their text (default word)")
    p.add_argument("--tokens-per-s", type=float, default=40.0,
                   help="fragments per second (default 40, a chat LLM's rate)")
    p.add_argument("--back-to-back", action="store_true",
                   help="start a user's next turn when `done` arrives instead of after "
                   "listening to the reply (a stress load beyond real time)")
    p.add_argument("--jitter", type=float, default=0.3,
                   help="coefficient of variation of fragment gaps (default 0.3)")
    runs = p.add_mutually_exclusive_group()
    runs.add_argument("--concurrency", type=_levels, default=[1, 4, 8],
                      help="closed-loop sweep levels, e.g. 1,4,8,16,20,24 (default 1,4,8)")
    runs.add_argument("--ramp", type=_ramp, help="START:STOP[:STEP] users joining over time")
    runs.add_argument("--arrival-rate", type=_rates,
                      help="open loop: Poisson arrivals per second, e.g. 2,4,8")
    p.add_argument("--duration", type=float, default=15.0,
                   help="seconds per sweep level or arrival rate (default 15)")
    p.add_argument("--step-s", type=float, default=5.0, help="ramp: seconds per step")
    p.add_argument("--stagger-s", type=float, default=0.0,
                   help="sweep: user k of N joins k*S/N seconds in, so turns arrive spread "
                        "out as in steady traffic (default 0: all at once, a burst)")
    p.add_argument("--seed", default="0", help="seed for texts and schedules (default 0)")
    p.add_argument("--ttfa-p99-ms", type=float, default=250.0,
                   help="capacity: TTFA p99 bound for a level to count (default 250)")
    p.add_argument("--stop-on-fail", action="store_true",
                   help="stop a sweep after the first level that fails the capacity test")
    p.add_argument("--baseline", action="store_true",
                   help="also run the non-streaming baseline (tools/bench/baseline.py) for the "
                   "whole and stream loads")
    p.add_argument("--baseline-only", action="store_true",
                   help="run only the baseline (with --baseline): skips rtserver's loads")
    p.add_argument("--baseline-concurrency", type=_levels,
                   help="baseline sweep levels (default: --concurrency)")
    p.add_argument("--lang", default="en", help="corpus language, or 'all' (default en)")
    p.add_argument("--tags", default="", help="corpus tags to keep, comma list")
    p.add_argument("--format", default="opus", choices=["opus", "pcm_s16le"])
    p.add_argument("--sample-rate", type=int, default=48000)
    p.add_argument("--frame-ms", type=int, default=20)
    p.add_argument("--default-prebuffer-ms", type=float, default=0.0,
                   help="listener's prebuffer before any `buffer` hint (default 0)")
    p.add_argument("--no-rebuffer", action="store_true",
                   help="listener resumes on the next frame after an underrun")
    p.add_argument("--warmup", type=int, default=2, help="warm-up turns, not recorded")
    p.add_argument("--event-timeout", type=float, default=EVENT_TIMEOUT_S,
                   help="a context with no event this long fails EventTimeout and its "
                        "connection is replaced (default %(default)g s)")
    p.add_argument("--out", default="bench-out", help="results folder (default bench-out)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--note", action="append", default=[], help="a line for summary.md")
    return p


class Progress:
    """A line per step and every few seconds to stderr."""

    def __init__(self) -> None:
        self.samples: list[dict[str, Any]] = []
        self.label = ""
        self.started = time.monotonic()
        self.length = 0.0

    def say(self, text: str) -> None:
        print(f"[bench] {text}", file=sys.stderr, flush=True)

    def step(self, label: str, length: float) -> None:
        self.label, self.samples, self.length = label, [], length
        self.started = time.monotonic()
        self.say(f"{label}: start ({length:g} s)")

    def line(self, final: bool = False) -> None:
        ss = self.samples
        ttfa = [s["ttfa_ms"] for s in ss if s.get("ttfa_ms") is not None]
        errs = sum(1 for s in ss if s.get("outcome") in ("error", "failed"))
        under = sum(1 for s in ss if (s.get("underruns") or 0) > 0)
        p50, p99 = percentile(ttfa, 50), percentile(ttfa, 99)
        took = time.monotonic() - self.started
        self.say(f"{self.label}: {'done' if final else f'{took:.0f}/{self.length:g} s'}, "
                 f"{len(ss)} contexts, ttfa p50 {p50 or 0:.0f} ms p99 {p99 or 0:.0f} ms, "
                 f"underran {under}, errors {errs}")


async def _ticker(progress: Progress) -> None:
    while True:
        await asyncio.sleep(PROGRESS_EVERY_S)
        progress.line()


async def _scrape(url: str, token: str | None) -> metrics.Scrape | None:
    status, body = await aget(http_base(url) + "/metrics", 5.0, token)
    if status != 200:
        return None
    return metrics.parse(body.decode("utf-8", "replace"))


async def _warm_up(url: str, token: str | None, cfg: LoadConfig, turns: int, seed: str
                   ) -> None:
    import random

    rng = random.Random(f"{seed}:warmup")
    async with RtClient.connect(url, token) as client:
        for _ in range(turns):
            await loads.run_turn(client, loads.plan_turn(cfg, rng, "whole"), cfg)


def _load_label(cfg: LoadConfig) -> str:
    return "whole" if cfg.pattern == "whole" else f"{cfg.pattern}/{cfg.fragment}"


async def run(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    out_dir = Path(args.out)
    progress = Progress()
    samples: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    servers: list[SpawnedServer] = []
    origin = time.monotonic()
    listener = ListenerConfig(default_prebuffer_ms=args.default_prebuffer_ms,
                              rebuffer=not args.no_rebuffer)
    patterns = [p.strip() for p in args.load.split(",") if p.strip()]
    for pat in patterns:
        loads.turn_kinds(pat)  # refuse unknown names before starting anything
    tags = tuple(t for t in args.tags.split(",") if t)
    try:
        if args.spawn:
            port = free_port()
            servers.append(await asyncio.to_thread(
                spawn, rtserver_command(port, args.voice, args.server_arg), port,
                out_dir / "server.log", ready_timeout_s=args.ready_timeout,
                progress=progress.say))
            url = servers[-1].url
        else:
            url = args.url
        status, _ = await aget(http_base(url) + "/ready", 5.0, args.token)
        if status != 200:
            raise RuntimeError(f"{http_base(url)}/ready answered {status or 'nothing'}")
        async with RtClient.connect(url, args.token) as probe:
            ready = probe.ready
        server_desc = f"{ready.server} (protocol {ready.protocol})"
        progress.say(f"server {server_desc}, voices {', '.join(ready.voices)}")

        def emit_to(system: str, run_kind: str, load: str, level: float) -> Any:
            def emit(sample: dict[str, Any]) -> None:
                sample.setdefault("system", system)
                if run_kind == "ramp":
                    sample["level"] = sample.get("active", level)
                samples.append(sample)
                progress.samples.append(sample)
            return emit

        async def step(system: str, run_kind: str, cfg: LoadConfig, level: float,
                       length: float, body: Any) -> None:
            label = f"{system} {_load_label(cfg)} {run_kind} {level:g}"
            progress.step(label, length)
            before = await _scrape(url, args.token) if system == "rtserver" else None
            ticker = asyncio.create_task(_ticker(progress))
            meter = CpuMeter([os.getpid(), *(s.pid for s in servers)])
            meter.start()
            t0 = time.monotonic()
            try:
                await body
            finally:
                ticker.cancel()
            took = time.monotonic() - t0
            cpu = meter.stop(took)
            after = await _scrape(url, args.token) if system == "rtserver" else None
            progress.line(final=True)
            if cpu["other_cores"] is not None and cpu["other_cores"] > 0.2:
                progress.say(f"warning: other processes used {cpu['other_cores']:.2f} cores "
                             "during this step")
            if cpu["stolen_cores"] is not None and cpu["stolen_cores"] > 0.2:
                progress.say(f"warning: the hypervisor took {cpu['stolen_cores']:.2f} cores "
                             "(steal) during this step")
            steps.append({"system": system, "run": run_kind, "load": _load_label(cfg),
                          "level": level, "seconds": took, "contexts": len(progress.samples),
                          "cpu": cpu, "spawned": bool(servers),
                          "metrics": metrics.delta(before, after) if before and after
                          else None})

        def state_for(system: str, run_kind: str, cfg: LoadConfig, level: float) -> RunState:
            labels = {"system": system, "run": run_kind, "load": _load_label(cfg),
                      "level": level}
            return RunState(emit=emit_to(system, run_kind, _load_label(cfg), level),
                            labels=labels, origin=origin)

        cfgs = [LoadConfig(pattern=pat, fragment=args.fragment,
                           tokens_per_s=args.tokens_per_s, jitter=args.jitter,
                           listen=not args.back_to_back, lang=args.lang,
                           tags=tags, voice=args.voice, format=args.format,
                           voices=tuple(v for v in args.voices.split(",") if v),
                           sample_rate=args.sample_rate, frame_ms=args.frame_ms,
                           listener=listener, event_timeout_s=args.event_timeout)
                for pat in patterns]
        for cfg in [] if args.baseline_only else cfgs:
            if args.warmup:
                await _warm_up(url, args.token, cfg, args.warmup, args.seed)
            seed = f"{args.seed}:{_load_label(cfg)}"
            if args.arrival_rate:
                for rate in args.arrival_rate:
                    st = state_for("rtserver", "poisson", cfg, rate)
                    await step("rtserver", "poisson", cfg, rate, args.duration,
                               loads.open_loop(url, args.token, cfg, rate, args.duration,
                                               f"{seed}:rate{rate:g}", st))
            elif args.ramp:
                lo, hi, inc = args.ramp
                joins, length = loads.ramp_schedule(lo, hi, inc, args.step_s)
                st = state_for("rtserver", "ramp", cfg, hi)
                await step("rtserver", "ramp", cfg, hi, length,
                           loads.closed_loop(url, args.token, cfg, hi, length, f"{seed}:ramp",
                                             st, join_at_s=joins))
            else:
                for level in args.concurrency:
                    st = state_for("rtserver", "sweep", cfg, level)
                    joins = [k * args.stagger_s / level for k in range(level)]
                    await step("rtserver", "sweep", cfg, level, args.duration,
                               loads.closed_loop(url, args.token, cfg, level, args.duration,
                                                 f"{seed}:c{level}", st, join_at_s=joins))
                    row = report.aggregate([s for s in samples if s.get("system") == "rtserver"
                                            and s.get("run") == "sweep"
                                            and s.get("load") == _load_label(cfg)
                                            and s.get("level") == level])
                    if args.stop_on_fail and row and not report.passes(row[0],
                                                                       args.ttfa_p99_ms):
                        progress.say(f"level {level} fails the capacity test; stopping sweep")
                        break
        base_cfgs = [c for c in cfgs if c.pattern in ("whole", "stream")]
        if args.baseline and base_cfgs and not args.arrival_rate and not args.ramp:
            from rtserver.tools.bench import baseline

            port = free_port()
            cmd = [sys.executable, "-m", "rtserver.tools.bench.baseline", "--port", str(port)]
            if args.voice:
                cmd += ["--voice", args.voice]
            for s in servers:  # stop rtserver first: the baseline gets the machine alone
                await asyncio.to_thread(s.stop)
            servers.clear()
            servers.append(await asyncio.to_thread(spawn, cmd, port, out_dir / "baseline.log",
                                                   progress=progress.say))
            base_url = f"http://127.0.0.1:{port}"
            for cfg in base_cfgs:
                seed = f"{args.seed}:{_load_label(cfg)}"
                for level in args.baseline_concurrency or args.concurrency:
                    st = state_for("baseline", "sweep", cfg, level)
                    await step("baseline", "sweep", cfg, level, args.duration,
                               baseline.closed_loop(base_url, cfg, level, args.duration,
                                                    f"{seed}:c{level}", st))
    finally:
        for s in servers:
            code = await asyncio.to_thread(s.stop)
            progress.say(f"stopped pid {s.pid} (exit {code})")
    config = {"seed": args.seed, "duration_s": args.duration, "fragment": args.fragment,
              "users_listen": not args.back_to_back, "stagger_s": args.stagger_s,
              "tokens_per_s": args.tokens_per_s, "jitter": args.jitter, "format": args.format,
              "sample_rate": args.sample_rate, "frame_ms": args.frame_ms,
              "loads": patterns, "concurrency": args.concurrency, "ramp": args.ramp,
              "arrival_rate": args.arrival_rate, "ttfa_p99_ms": args.ttfa_p99_ms,
              "listener": {"default_prebuffer_ms": listener.default_prebuffer_ms,
                           "rebuffer": listener.rebuffer},
              "lang": args.lang, "tags": list(tags)}
    meta = {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": describe(), "versions": versions(), "server": server_desc,
            "voice": args.voices or args.voice or (ready.default_voice or ready.voices[0]),
            "command": "python -m rtserver.tools.bench " + shlex.join(argv), "notes": args.note}
    return {"meta": meta, "config": config, "steps": steps, "samples": samples}


def write_outputs(results: dict[str, Any], out_dir: Path, ttfa_p99_ms: float,
                  make_plots: bool) -> list[Path]:
    rows = report.aggregate(results["samples"])
    caps = report.capacity(rows, ttfa_p99_ms)
    results["summary"] = [{"system": r.system, "run": r.run, "load": r.load,
                           "level": r.level, **r.stats} for r in rows]
    results["capacity"] = [dataclasses.asdict(c) for c in caps]
    paths = [out_dir / RESULTS, out_dir / "summary.md"]
    write_results(paths[0], results)
    report.write_markdown(paths[1], report.markdown(results, rows, caps))
    if make_plots and not plots.available():
        print(f"[bench] {plots.NO_MATPLOTLIB}", file=sys.stderr)
    elif make_plots:
        paths += plots.plot_all(results["samples"], rows, out_dir)
    return paths


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if not args.no_plots and not plots.available():  # said before the run, and again after
        print(f"[bench] {plots.NO_MATPLOTLIB}", file=sys.stderr)
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:  # uvloop is a dependency; run without it all the same
        runner = asyncio.run
    try:
        results = runner(run(args, argv))
    except (RuntimeError, OSError) as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    paths = write_outputs(results, Path(args.out), args.ttfa_p99_ms, not args.no_plots)
    for c in results["capacity"]:
        print(f"[bench] capacity {c['system']} {c['load']}: {c['streams']} concurrent real-time "
              f"streams with TTFA p99 under {c['ttfa_p99_ms']:g} ms and zero underruns",
              file=sys.stderr)
    print(f"[bench] wrote {', '.join(str(p) for p in paths)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
