"""Burst bench: many contexts start at the same instant, alone or on top of
steady traffic, and what admission does with them.

```
python -m rtserver.tools.bench.burst --spawn --burst 24 --out DIR
python -m rtserver.tools.bench.burst --spawn --steady 14 --burst 28 --out DIR
```

Steady users (``--steady``) join over ``--stagger-s`` and speak `stream`
turns back to back, each listened to in real time (``loads.closed_loop_user``),
until the end. ``--burst-at-s`` in, ``--burst`` users (their connections open
beforehand, so the burst is of contexts, not handshakes) each start one
`stream` turn at the same instant. Every context is measured by the bench's
simulated listener (``listener.py``: it honours the `buffer` hint).

Reported (``summary.md``, ``results.json.gz``): of the burst, the contexts
admitted and their underruns, TTFA and first heard audio, and the contexts
refused with their code and ``retry_after_ms``; of the steady traffic, the
contexts that were playing when the burst came (began before it, ended
after it) and their underruns; the load average of the machine before and
after (the box is shared: other work moves every figure).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rtserver.client import RtClient
from rtserver.tools.bench.loads import (
    LoadConfig,
    RunState,
    closed_loop_user,
    plan_turn,
    run_turn,
)
from rtserver.tools.bench.machine import describe, versions
from rtserver.tools.bench.server_proc import free_port, rtserver_command, spawn
from rtserver.tools.bench.store import RESULTS, write_results

Sample = dict[str, Any]


async def burst_user(client: RtClient, cfg: LoadConfig, rng: random.Random,
                     go: asyncio.Event) -> Sample:
    """One turn started when ``go`` is set; a refused start keeps its retry time."""
    plan = plan_turn(cfg, rng, "stream")
    await go.wait()
    began = time.monotonic()
    sample = await run_turn(client, plan, cfg)  # a refusal is a sample too
    sample["ended_at"] = time.monotonic()
    sample.setdefault("began_at", began)
    return sample


async def run(url: str, args: argparse.Namespace) -> dict[str, Any]:
    cfg = LoadConfig(pattern="stream", fragment=args.fragment, voice=args.voice)
    samples: list[Sample] = []
    state = RunState(emit=samples.append, labels={"group": "steady"}, clock=time.monotonic)
    start = time.monotonic()
    state.origin = start
    stop_at = start + args.duration_s

    async def steady(k: int) -> None:
        await asyncio.sleep(k * args.stagger_s / max(1, args.steady))
        rng = random.Random(f"{args.seed}:steady{k}")
        await closed_loop_user(url, None, cfg, rng, stop_at, state, k)

    async def burst() -> list[Sample]:
        clients = [await RtClient.connect(url).__aenter__() for _ in range(args.burst)]
        try:
            await asyncio.sleep(max(0.0, start + args.burst_at_s - time.monotonic()))
            go = asyncio.Event()
            users = [asyncio.create_task(burst_user(c, cfg, random.Random(f"{args.seed}:b{k}"),
                                                    go)) for k, c in enumerate(clients)]
            await asyncio.sleep(0.05)  # every user waits on the same event
            burst_at = time.monotonic()
            go.set()
            out = await asyncio.gather(*users)
            for s in out:
                s["burst_at"] = burst_at
            return out
        finally:
            for c in clients:
                await c.close()

    steady_tasks = [asyncio.create_task(steady(k)) for k in range(args.steady)]
    burst_samples = await burst()
    await asyncio.gather(*steady_tasks)
    burst_at = burst_samples[0]["burst_at"] if burst_samples else start
    # steady samples' times are from the start (RunState); the burst's too
    return {"burst": [{**s, "group": "burst", "began_at": s["began_at"] - start,
                       "ended_at": s["ended_at"] - start, "burst_at": burst_at - start}
                      for s in burst_samples],
            "steady": samples, "burst_at": burst_at - start}


def _ms(values: list[float], q: float) -> str:
    if not values:
        return "-"
    values = sorted(values)
    return f"{values[min(len(values) - 1, int(q * len(values)))]:.0f}"


def summarize(res: dict[str, Any]) -> dict[str, Any]:
    burst, steady, at = res["burst"], res["steady"], res["burst_at"]
    admitted = [s for s in burst if s.get("outcome") == "done"]
    refused = [s for s in burst if s.get("outcome") == "error"]
    playing = [s for s in steady if s.get("playback_end_at") is not None
               and s["began_at"] < at < s["playback_end_at"]]
    return {
        "burst": len(burst), "admitted": len(admitted),
        "admitted_underran": sum(1 for s in admitted if s.get("underruns", 0) > 0),
        "refused": len(refused),
        "refused_codes": sorted({str(s.get("error")) for s in refused}),
        "retry_after_ms": sorted(int(s["retry_after_ms"]) for s in refused
                                 if s.get("retry_after_ms") is not None),
        "other_outcomes": sorted(str(s.get("outcome")) for s in burst
                                 if s.get("outcome") not in ("done", "error")),
        "admitted_ttfa_ms": [s["ttfa_ms"] for s in admitted if s.get("ttfa_ms") is not None],
        "admitted_heard_ms": [s["playback_start_ms"] for s in admitted
                              if s.get("playback_start_ms") is not None],
        "steady_contexts": len(steady),
        "steady_underran": sum(1 for s in steady if s.get("underruns", 0) > 0),
        "playing_at_burst": len(playing),
        "playing_underran": sum(1 for s in playing if s.get("underruns", 0) > 0),
    }


def markdown(res: dict[str, Any], sm: dict[str, Any]) -> str:
    ttfa, heard = sm["admitted_ttfa_ms"], sm["admitted_heard_ms"]
    retry = sm["retry_after_ms"]
    lines = [
        f"# Burst bench, {res['date']}", "",
        f"- Command: `{res['command']}`",
        f"- Machine: {res['machine']['cpu']} ({res['machine']['cores']} cores); load average "
        f"(1 min) {res['load_before'][0]:.2f} before, {res['load_after'][0]:.2f} after",
        f"- Versions: {', '.join(f'{k} {v}' for k, v in res['versions'].items())}",
        "", "| | count |", "|---|---|",
        f"| burst contexts started at once | {sm['burst']} |",
        f"| admitted | {sm['admitted']} |",
        f"| admitted that underran | {sm['admitted_underran']} |",
        f"| refused ({', '.join(sm['refused_codes']) or '-'}) | {sm['refused']} |",
        f"| other outcomes | {', '.join(sm['other_outcomes']) or '-'} |",
        f"| steady contexts (all) | {sm['steady_contexts']} |",
        f"| steady contexts that underran (all) | {sm['steady_underran']} |",
        f"| steady contexts playing when the burst came | {sm['playing_at_burst']} |",
        f"| of those, underran | {sm['playing_underran']} |", "",
        f"- Admitted: TTFA p50 {_ms(ttfa, 0.5)} ms, max {_ms(ttfa, 1.0)} ms; first heard "
        f"p50 {_ms(heard, 0.5)} ms, max {_ms(heard, 1.0)} ms.",
        f"- Refused: retry_after_ms min {retry[0] if retry else '-'}, max "
        f"{retry[-1] if retry else '-'} ({len(retry)} with a retry time).", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="a running server (else --spawn)")
    p.add_argument("--spawn", action="store_true", help="start a server on a free port")
    p.add_argument("--voice")
    p.add_argument("--burst", type=int, default=24)
    p.add_argument("--steady", type=int, default=0)
    p.add_argument("--stagger-s", type=float, default=8.0)
    p.add_argument("--burst-at-s", type=float, default=0.0,
                   help="seconds after the start (default: 12 with --steady, else 0)")
    p.add_argument("--duration-s", type=float, default=0.0,
                   help="steady traffic's length (default: burst-at + 20)")
    p.add_argument("--fragment", default="word")
    p.add_argument("--seed", default="0")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if not args.burst_at_s and args.steady:
        args.burst_at_s = 12.0
    if not args.duration_s:
        args.duration_s = args.burst_at_s + 20.0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    server = None
    url = args.url
    if args.spawn:
        port = free_port()
        server = spawn(rtserver_command(port, args.voice), port, out / "server.log")
        url = server.url
    if not url:
        p.error("--url or --spawn")
    try:
        load_before = os.getloadavg()
        res = asyncio.run(run(url, args))
        load_after = os.getloadavg()
    finally:
        if server is not None:
            server.stop()
    res.update(date=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
               command="python -m rtserver.tools.bench.burst " + " ".join(
                   sys.argv[1:] if argv is None else argv),
               machine=describe(), versions=versions(), load_before=load_before,
               load_after=load_after)
    sm = summarize(res)
    res["summary"] = sm
    write_results(out / RESULTS, res)
    text = markdown(res, sm)
    (out / "summary.md").write_text(text, encoding="utf-8")
    print(text)
    print(json.dumps({k: v for k, v in sm.items() if not isinstance(v, list)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
