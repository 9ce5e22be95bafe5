"""Load patterns: what one simulated user does, and the three ways to run many.

Patterns (``LoadConfig.pattern``):

- ``whole``: the reply's whole text in one `text`, then `end`.
- ``stream``: the reply as LLM-like fragments (``token`` or ``word``) at
  ``tokens_per_s`` with gamma jitter, then `end`.
- ``conversation``: ``stream`` turns on one connection; after each, the user
  listens (until the simulated listener would finish) and thinks, then speaks
  again.

By default a user listens to each reply before its next turn, so N users are
N concurrent real-time streams; ``listen=False`` (``--back-to-back``) starts
the next turn as soon as `done` arrives, a stress load well beyond real time.
- ``bargein``: a ``stream`` turn cancelled ``bargein_after_s`` after its first
  frame arrived (the user talks over it), then the next turn at once.

Runs: ``closed_loop`` (N users, each doing turns back to back until a deadline:
the concurrency sweep, and the ramp when users join over time) and
``open_loop`` (Poisson arrivals at a rate, each one turn, on a pool of
connections). Every random choice comes from a ``random.Random`` seeded from
the run's ``--seed`` and the user's place in the run, so a run's texts and
send schedule repeat exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rtserver.client import (
    AudioFrames,
    ConnectionLost,
    ContextStream,
    RtClient,
    RtClientError,
    ServerError,
)
from rtserver.tools.bench.corpus import Utterance, fragments, select, token_offsets
from rtserver.tools.bench.listener import ListenerConfig
from rtserver.tools.bench.measure import TurnRecord, analyze

PATTERNS = ("whole", "stream", "conversation", "bargein")
Sample = dict[str, Any]
Emit = Callable[[Sample], None]
# A context with no event for this long fails ``EventTimeout`` and its connection
# is replaced: a server that stops answering fails the run, never hangs it. Far
# past any gap a working server leaves (an LLM-paced reply sends events every second).
EVENT_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class LoadConfig:
    pattern: str = "stream"
    fragment: str = "word"  # token | word | whole (for stream-like turns)
    tokens_per_s: float = 40.0  # a typical chat LLM's output rate
    jitter: float = 0.3  # coefficient of variation of the gaps between fragments
    think_s: tuple[float, float] = (0.5, 1.5)  # conversation: pause after listening
    bargein_after_s: tuple[float, float] = (0.2, 1.0)  # cancel this long after first audio
    bargein_min_chars: int = 100  # barge-in turns speak long replies, to be cut mid-way
    # A user listens to each reply before the next turn (the next starts when the
    # simulated listener finishes): N users are N real-time streams. Off
    # ("back to back") each user asks for audio as fast as the server makes it.
    listen: bool = True
    lang: str = "en"
    tags: tuple[str, ...] = ()
    voice: str | None = None
    # each turn speaks one of these, drawn by the turn's seed (LoRA voices
    # mixed); empty: ``voice``. The same length gives the same texts.
    voices: tuple[str, ...] = ()
    format: str = "opus"
    sample_rate: int = 48000
    frame_ms: int = 20
    listener: ListenerConfig = field(default_factory=ListenerConfig)
    event_timeout_s: float = EVENT_TIMEOUT_S


class EventTimeout(RtClientError):
    """No event came for a context within ``LoadConfig.event_timeout_s``."""


@dataclass(frozen=True, slots=True)
class TurnPlan:
    kind: str  # whole | stream | conversation | bargein | after-bargein
    utterance: Utterance
    fragments: tuple[str, ...]
    offsets: tuple[float, ...]  # send times from the first fragment, seconds
    cancel_after_s: float | None = None
    voice: str | None = None


def plan_turn(cfg: LoadConfig, rng: random.Random, kind: str) -> TurnPlan:
    """One turn's text and send schedule (pure, decided by ``rng``)."""
    pool = select(cfg.lang, cfg.tags)
    if kind == "bargein":
        pool = tuple(u for u in pool if len(u.text) >= cfg.bargein_min_chars) or pool
    utt = rng.choice(pool)
    mode = "whole" if kind == "whole" else cfg.fragment
    frags = fragments(utt.text, mode)
    offsets = token_offsets(len(frags), cfg.tokens_per_s, cfg.jitter, rng)
    cancel = rng.uniform(*cfg.bargein_after_s) if kind == "bargein" else None
    voice = rng.choice(cfg.voices) if cfg.voices else cfg.voice  # drawn last: texts unchanged
    return TurnPlan(kind, utt, tuple(frags), tuple(offsets), cancel, voice)


def turn_kinds(pattern: str) -> list[str]:
    """The turns one round of ``pattern`` is made of."""
    if pattern == "bargein":
        return ["bargein", "after-bargein"]
    if pattern in ("whole", "stream", "conversation"):
        return [pattern]
    raise ValueError(f"unknown load pattern '{pattern}' (one of {', '.join(PATTERNS)})")


# --- one turn ----------------------------------------------------------------------------

async def run_turn(client: RtClient, plan: TurnPlan, cfg: LoadConfig) -> Sample:
    """Speak one turn and measure it; never raises for a server-side failure."""
    clock = client.clock
    began = clock()
    base: Sample = {"kind": plan.kind, "utterance": plan.utterance.id,
                    "tags": list(plan.utterance.tags), "began_at": began}
    try:
        ctx = await client.start(voice=plan.voice, format=cfg.format,
                                 sample_rate=cfg.sample_rate, frame_ms=cfg.frame_ms)
    except ServerError as exc:
        return {**base, "outcome": "error", "error": exc.error.code,
                "error_message": exc.error.message, "retry_after_ms": exc.error.retry_after_ms}
    except (RtClientError, TimeoutError) as exc:
        return {**base, "outcome": "failed", "error": type(exc).__name__,
                "error_message": str(exc)}
    base["context"] = ctx.context

    async def send() -> None:
        t0 = clock()
        for frag, off in zip(plan.fragments, plan.offsets, strict=True):
            delay = t0 + off - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            if ctx.finished or ctx.times.cancel_sent_at is not None:
                return
            await ctx.send_text(frag)
        await ctx.end()

    async def cancel_at(at: float) -> None:
        """The user talks over the reply ``cancel_after_s`` into its audio: cancel,
        unless every frame has come and the user has heard it all by then."""
        delay = at - clock()
        if delay > 0:
            await asyncio.sleep(delay)
        heard_all = sum(n for _, _, n in arrivals) * ctx.frame_ms <= (
            (plan.cancel_after_s or 0.0) * 1000.0)
        if not (ctx.finished and heard_all):
            await ctx.cancel()

    sender = asyncio.create_task(send())
    canceller: asyncio.Task[None] | None = None
    arrivals: list[tuple[float, int, int]] = []
    failure: RtClientError | None = None
    limit = cfg.event_timeout_s
    loop = asyncio.get_running_loop()
    last: object = None  # the last event, for the timeout's message
    try:
        async with contextlib.aclosing(ctx.events()) as events, \
                asyncio.timeout(limit) as watchdog:
            async for ev in events:
                # pushed back to 1.5 x the limit once under the limit is left: a
                # reschedule every limit / 2 s, not a timer per event (7 us each)
                now = loop.time()
                if (watchdog.when() or now) - now < limit:
                    watchdog.reschedule(now + 1.5 * limit)
                last = ev
                if isinstance(ev, AudioFrames):
                    arrivals.append((ev.received_at, ev.seq, len(ev.frames)))
                    if plan.cancel_after_s is not None and canceller is None:
                        canceller = asyncio.create_task(
                            cancel_at(ev.received_at + plan.cancel_after_s))
    except TimeoutError:
        failure = EventTimeout(
            f"context '{ctx.context}': no event for {limit:g} s after "
            f"{type(last).__name__ if last is not None else 'nothing'} "
            f"({sum(n for _, _, n in arrivals)} frames, {len(ctx.times.text_sent)} of "
            f"{len(plan.fragments)} fragments sent, end "
            f"{'sent' if ctx.times.end_sent_at else 'not sent'}, cancel "
            f"{'sent' if ctx.times.cancel_sent_at else 'not sent'})")
    except RtClientError as exc:
        failure = exc
    for task in (sender, canceller):
        if task is None:
            continue
        if failure is not None or task is sender:
            task.cancel()  # the sender has nothing left to do once the context ended
        try:
            await task
        except (asyncio.CancelledError, RtClientError, TimeoutError) as exc:
            if isinstance(exc, RtClientError) and failure is None:
                failure = exc
    return {**base, **_measure(ctx, plan, cfg, arrivals, failure)}


def _measure(ctx: ContextStream, plan: TurnPlan, cfg: LoadConfig,
             arrivals: list[tuple[float, int, int]], failure: RtClientError | None) -> Sample:
    t = ctx.times
    if failure is not None or ctx.failure is not None:
        outcome = "failed"
    elif ctx.error is not None:
        outcome = "error"
    elif ctx.cancelled is not None and ctx.done is None:
        outcome = "cancelled"
    else:
        outcome = "done"
    err = ctx.error or (ctx.errors[0] if ctx.errors else None)
    fail = failure or ctx.failure
    record = TurnRecord(
        text="".join(plan.fragments[:len(t.text_sent)]),
        frame_ms=ctx.frame_ms,
        text_sent=tuple(t.text_sent), flushes=tuple(t.flush_sent_at),
        end_sent_at=t.end_sent_at,
        seg0_source=t.segments[0][1].source if t.segments else None,
        arrivals=tuple(arrivals),
        hints=tuple((at, h.prebuffer_ms) for at, h in t.buffer_hints),
        outcome=outcome, finished_at=t.finished_at,
        cancel_sent_at=t.cancel_sent_at, cancelled_at=t.cancelled_at,
        cancelled_last_seq=ctx.cancelled.last_seq if ctx.cancelled else None,
        server_ttfa_ms=ctx.done.ttfa_ms if ctx.done else None,
        server_audio_ms=ctx.done.audio_ms if ctx.done else None,
        rtf=t.buffer_hints[-1][1].rtf if t.buffer_hints else None,
        error_code=(err.code if err is not None else
                    type(fail).__name__ if fail is not None else None),
        error_message=(err.message if err is not None else str(fail) if fail else None))
    out = analyze(record, cfg.listener)
    out["segments"] = len(t.segments)
    out["errors_in_context"] = len(ctx.errors)
    return out


# --- many users -------------------------------------------------------------------------

@dataclass
class RunState:
    """Shared by the users of one run: who is active, where samples go."""

    emit: Emit
    labels: dict[str, Any]
    clock: Callable[[], float] = time.monotonic
    active: int = 0
    origin: float = 0.0  # the bench's time zero, for relative timestamps

    def record(self, sample: Sample, **extra: Any) -> None:
        sample = {**self.labels, **extra, **sample}
        for key in ("began_at", "playback_end_at"):
            if sample.get(key) is not None:
                sample[key] = sample[key] - self.origin
        self.emit(sample)


def listening_pause(cfg: LoadConfig, sample: Sample, now: float, rng: random.Random
                    ) -> float:
    """Seconds until the user speaks again: until the simulated listener has
    played the reply (``listen``), plus thinking time in a conversation."""
    pause = 0.0
    if cfg.listen or cfg.pattern == "conversation":
        end = sample.get("playback_end_at")
        pause = max(0.0, end - now) if end is not None else 0.0
    if cfg.pattern == "conversation":
        pause += rng.uniform(*cfg.think_s)
    return pause


async def closed_loop_user(url: str, token: str | None, cfg: LoadConfig, rng: random.Random,
                           stop_at: float, state: RunState, user: int) -> None:
    """One user doing turns back to back (with the pattern's pauses) until ``stop_at``."""
    clock = state.clock
    turn = 0
    state.active += 1
    try:
        while clock() < stop_at:
            try:
                async with RtClient.connect(url, token, clock=clock) as client:
                    timed_out = False
                    while clock() < stop_at and not timed_out:
                        for kind in turn_kinds(cfg.pattern):
                            plan = plan_turn(cfg, rng, kind)
                            active = state.active
                            sample = await run_turn(client, plan, cfg)
                            state.record(sample, user=user, turn=turn, active=active)
                            turn += 1
                            if sample["outcome"] == "failed" and client.closed:
                                raise ConnectionLost(client.close_code, client.close_reason)
                            timed_out = sample.get("error") == EventTimeout.__name__
                            if timed_out:  # the next turn on a new connection
                                break
                        pause = 0.0 if timed_out else listening_pause(cfg, sample, clock(), rng)
                        if pause > 0:
                            await asyncio.sleep(min(pause, max(0.0, stop_at - clock())))
            except (RtClientError, OSError, TimeoutError) as exc:
                state.record({"outcome": "failed", "error": type(exc).__name__,
                              "error_message": str(exc), "began_at": clock(), "kind": "connect"},
                             user=user, turn=turn, active=state.active)
                await asyncio.sleep(0.5)
    finally:
        state.active -= 1


async def closed_loop(url: str, token: str | None, cfg: LoadConfig, users: int,
                      duration_s: float, seed: str, state: RunState,
                      join_at_s: Sequence[float] = ()) -> None:
    """``users`` users until ``duration_s`` from now; user ``k`` joins
    ``join_at_s[k]`` seconds in (a ramp), at once when not given."""
    stop_at = state.clock() + duration_s

    async def user(k: int) -> None:
        if k < len(join_at_s) and join_at_s[k] > 0:
            await asyncio.sleep(join_at_s[k])
        rng = random.Random(f"{seed}:user{k}")
        await closed_loop_user(url, token, cfg, rng, stop_at, state, k)

    await asyncio.gather(*(user(k) for k in range(users)))


def ramp_schedule(start: int, stop: int, step: int, step_s: float) -> tuple[list[float], float]:
    """Join times for a ramp from ``start`` to ``stop`` users, ``step`` more every
    ``step_s``; and the ramp's length (the last level also lasts ``step_s``)."""
    joins = [0.0 if k < start else ((k - start) // step + 1) * step_s for k in range(stop)]
    return joins, (max(joins) if joins else 0.0) + step_s


class _Pool:
    """Connections for open-loop arrivals: the one with the fewest contexts,
    a new one when all are at the server's ``max_contexts``."""

    def __init__(self, url: str, token: str | None, clock: Callable[[], float]) -> None:
        self.url, self.token, self.clock = url, token, clock
        self.clients: list[RtClient] = []
        self.load: dict[int, int] = {}
        self._lock = asyncio.Lock()

    async def acquire(self) -> RtClient:
        async with self._lock:
            live = [c for c in self.clients if not c.closed]
            if live:
                best = min(live, key=lambda c: self.load[id(c)])
                if self.load[id(best)] < best.ready.limits.max_contexts:
                    self.load[id(best)] += 1
                    return best
            client = await RtClient.connect(self.url, self.token, clock=self.clock)
            self.clients.append(client)
            self.load[id(client)] = 1
            return client

    def release(self, client: RtClient) -> None:
        self.load[id(client)] -= 1

    async def close(self) -> None:
        for c in self.clients:
            await c.close()


async def open_loop(url: str, token: str | None, cfg: LoadConfig, rate_per_s: float,
                    duration_s: float, seed: str, state: RunState) -> None:
    """Poisson arrivals at ``rate_per_s`` for ``duration_s``; each arrival is one turn
    (bargein: a cancelled turn and its follow-up)."""
    rng = random.Random(f"{seed}:arrivals")
    clock = state.clock
    pool = _Pool(url, token, clock)
    start = clock()
    tasks: list[asyncio.Task[None]] = []

    async def arrival(k: int) -> None:
        turn_rng = random.Random(f"{seed}:arrival{k}")
        state.active += 1
        try:
            client = await pool.acquire()
        except (RtClientError, OSError, TimeoutError) as exc:
            state.record({"outcome": "failed", "error": type(exc).__name__,
                          "error_message": str(exc), "began_at": clock(), "kind": "connect"},
                         user=k, turn=0, active=state.active)
            state.active -= 1
            return
        try:
            for turn, kind in enumerate(turn_kinds(
                    "stream" if cfg.pattern == "conversation" else cfg.pattern)):
                active = state.active
                sample = await run_turn(client, plan_turn(cfg, turn_rng, kind), cfg)
                state.record(sample, user=k, turn=turn, active=active)
                if sample.get("error") == EventTimeout.__name__:
                    with contextlib.suppress(RtClientError, OSError):
                        await client.close()  # the pool opens a new one for later arrivals
                    break
        finally:
            pool.release(client)
            state.active -= 1

    at = 0.0
    k = 0
    try:
        while True:
            at += rng.expovariate(rate_per_s)
            if at > duration_s:
                break
            delay = start + at - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(arrival(k)))
            k += 1
        await asyncio.gather(*tasks)
    finally:
        await pool.close()
