"""A continuous-batching torch engine for multi-codebook LMs (ChatTTS' GPT).

One engine per process, three parts:

- ``scheduler.py`` (pure Python): admission by priority then arrival, the
  prefill token budget (chunked prefill), the slot pool, compaction;
- ``runner.py`` (torch): device state, CUDA graphs, sampling and stop
  detection on the device, one non-blocking copy out per step;
- this module: the ``TokenEngine[CodeDelta]`` seam and the step loop.

The step loop runs in its own thread (torch releases the GIL in its kernels);
the asyncio side only submits, aborts and reads results, which arrive once
per step through ``loop.call_soon_threadsafe``. Each turn of the loop:

1. takes what arrived (new requests, aborts, refine jobs);
2. asks the scheduler for a plan and launches it (moves, one decode step for
   every decoding request, prefill chunks under the budget) without waiting;
3. waits for the *previous* step's copy (the step's one host sync, while the
   GPU runs this one: vLLM's async scheduling) and hands each request its
   codes: its first ``eager_steps`` steps one by one (the first audio waits
   on them), later ones in blocks of ``stream_interval``. They reach the event
   loop after the next turn's launch, just before its wait: the loop's thread
   then takes them (and the GIL) while this one waits on the GPU, not in the
   middle of a launch, whose every torch call lets go of the GIL.

A request ends at a stop id or EOS in any codebook (upstream ChatTTS), at its
step budget, or at the end of its slot; the device flags it, and the request
runs one more step whose output is dropped (the price of not waiting).
Faults stay with their requests: a row whose hidden state is not finite fails
that request; an error in a step (out of memory included) fails the requests
of that step; a full queue is ``Overloaded`` with ``retry_after_ms``. A fault
of the loop itself kills the engine: every open request, and every later one,
fails with ``EngineDead``, and ``dead_reason()`` says why (the server polls
it, drains and exits to be restarted).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rtserver.clock import SYSTEM_CLOCK, Clock
from rtserver.engine.base import (
    CodeDelta,
    EngineStats,
    EngineTally,
    TokenRequest,
)
from rtserver.errors import EngineDead, EngineFailed, Overloaded
from rtserver.voices.chattts.engine.counters import StepCounters, metric_counters
from rtserver.voices.chattts.engine.handover import Batch, Handover
from rtserver.voices.chattts.engine.intake import (
    EngineRequest,
    check_refine,
    draw_seed,
    prefill_inputs,
)
from rtserver.voices.chattts.engine.model import ChatLM
from rtserver.voices.chattts.engine.runner import (
    FLAG_BAD,
    FLAG_DONE,
    MOVE_BUCKETS,
    ModelRunner,
    PrefillInputs,
    Record,
    RunnerConfig,
)
from rtserver.voices.chattts.engine.sampling import PENALTY_WINDOW
from rtserver.voices.chattts.engine.scheduler import Scheduler, SchedulerConfig, Seq
from rtserver.voices.chattts.engine.text_lane import TextJob, TextLane, TextResult

log = logging.getLogger(__name__)

DEFAULT_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 192, 256, 384, 512, 768, 1024)
DEFAULT_LENGTH_BUCKETS = (128, 256, 512, 1024, 2048, 4096)


@dataclass(frozen=True, slots=True)
class TorchEngineConfig:
    """Settings of the torch engine (one per process)."""

    slots: int = 64  # requests decoding at once (KV cache rows)
    max_len: int = 2048  # positions per slot: prompt + steps
    cuda_graphs: bool = True  # GPU only
    move_graphs: bool = True  # a step's KV moves as CUDA graphs too (runner.py)
    batch_buckets: tuple[int, ...] = DEFAULT_BATCH_BUCKETS
    length_buckets: tuple[int, ...] = DEFAULT_LENGTH_BUCKETS
    # Chunked prefill: at most this many padded prompt positions (rows bucket x
    # chunk bucket) join a step, so a new request delays the running ones by
    # one bounded graph, never by an eager prefill.
    prefill_tokens: int = 1024
    prefill_chunk: int = 256  # prompt positions per request per step
    prefill_rows: int = 16  # requests prefilled per step
    chunk_buckets: tuple[int, ...] = (32, 64, 128, 256)
    max_waiting: int = 4096  # queued requests beyond this are refused (overloaded)
    max_queue_s: float = 10.0  # a request queued longer fails (overloaded)
    retry_after_ms: int = 500
    min_new_steps: int = 1  # no EOS at the first step (upstream regenerates an empty result)
    # Benchmarks on random weights: no EOS at all, every request runs to its budget.
    ignore_eos: bool = False
    penalty_window: int = PENALTY_WINDOW
    # Hand-over: each of a request's first ``eager_steps`` steps at once (the
    # first audio waits on them), later ones in blocks of ``stream_interval``
    # steps (fewer wake-ups of the event loop at hundreds of streams; 4 steps
    # are 85 ms of audio, far less than the decoder's later chunks).
    eager_steps: int = 24
    stream_interval: int = 4
    # The hidden-state store: a request's hidden states stay on the device
    # (``hidden_store``), its deltas carry their indices there, and its consumer
    # calls ``release_hidden`` once it reads them no more (handover.py). Off:
    # they come to the host in each delta.
    hidden_store: bool = False
    # The refine-text lane (text_lane.py): its own slots and KV cache; 0: off.
    text_slots: int = 0
    text_max_len: int = 512


# thread -> loop: (request id, codes [n, vq] or None, hidden [n, H] or None, done, error)
_Event = tuple[str, "np.ndarray | None", "np.ndarray | None", bool, "BaseException | None"]


class TorchCodeEngine:
    """``TokenEngine[CodeDelta]`` over :class:`ChatLM` (see the module docstring)."""

    # every hidden state it hands over is finite: a step whose hidden state or logits
    # were not fails its request instead (``FLAG_BAD``, tested on the device)
    hands_over_finite = True

    def __init__(self, model_factory: Callable[[], ChatLM], config: TorchEngineConfig,
                 *, eos_id: int, name: str = "torch", clock: Clock = SYSTEM_CLOCK) -> None:
        self.config = config
        self._clock = clock  # queue waits, time to first step, capture times
        self.eos_id = eos_id
        self.name = name
        self._factory = model_factory
        self._model: ChatLM | None = None
        self._runner: ModelRunner | None = None
        self._sched: Scheduler | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._wake = threading.Event()
        # set while the loop parks with every launched step read back (wait_drained)
        self._drained = threading.Event()
        self._thread: threading.Thread | None = None
        self._stop = False
        self._streams: dict[str, asyncio.Queue[_Event]] = {}
        self._dead: BaseException | None = None
        self._text: TextLane | None = None
        self._text_futs: dict[str, asyncio.Future[list[int]]] = {}
        self._n_hidden = 0  # scheduled requests that want hidden states (thread-owned)
        self._ho: Handover | None = None  # what each running request is handed (thread-owned)
        self._ending: list[Seq] = []  # ended this turn, finished after the hand-over
        # stats (written by the thread; read by the loop: plain numbers, no locking needed)
        self.counters_ = StepCounters()
        self._tally = EngineTally()

    # --- lifecycle ------------------------------------------------------------

    @property
    def model(self) -> ChatLM:
        if self._model is None:
            raise EngineFailed("the torch engine is not started")
        return self._model

    @property
    def runner(self) -> ModelRunner:
        if self._runner is None:
            raise EngineFailed("the torch engine is not started")
        return self._runner

    @property
    def steps_total(self) -> int:
        return self.counters_.decode_steps

    @property
    def prefills_total(self) -> int:
        return self.counters_.prefill_batches

    async def start(self) -> None:
        """Load the model and capture every step shape (decode and prefill) before
        returning: no shape is first seen under traffic."""
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._model = await asyncio.to_thread(self._build)
        self._thread = threading.Thread(target=self._run, name=f"{self.name}-engine",
                                        daemon=True)
        self._thread.start()

    def _build(self) -> ChatLM:
        c = self.config
        model = self._factory()
        # handles: every slot, plus the rows of one prefill (a request gets its
        # handle at its first chunk and gives it back at its end); with a store,
        # twice that: a handle is held on until its consumer released it
        handles = (model.slots + c.prefill_rows) * (2 if c.hidden_store else 1)
        ho = self._ho = Handover(handles, max(1, c.stream_interval), c.eager_steps,
                                 model.max_len + 1 if c.hidden_store else 0)
        chunk = min(c.prefill_chunk, model.max_len)
        self._sched = Scheduler(SchedulerConfig(
            slots=model.slots, max_len=model.max_len, prefill_tokens=c.prefill_tokens,
            max_chunk=chunk, max_prefill_rows=c.prefill_rows,
            chunk_buckets=tuple(sorted({min(b, chunk) for b in c.chunk_buckets})),
            row_buckets=(*(b for b in (1, 2, 4, 8, 16, 32, 64) if b < c.prefill_rows),
                         c.prefill_rows),
            length_buckets=c.length_buckets))
        self._runner = ModelRunner(model, RunnerConfig(
            eos_id=self.eos_id, graphs=c.cuda_graphs, batch_buckets=c.batch_buckets,
            min_new_steps=c.min_new_steps, ignore_eos=c.ignore_eos,
            penalty_window=c.penalty_window, ring=max(1, c.stream_interval) + 3,
            store_rows=ho.store_rows, store_cols=ho.width,
            move_buckets=MOVE_BUCKETS if c.move_graphs else ()), self._sched.config)
        if c.text_slots > 0:
            self._text = TextLane(model, c.text_slots, c.text_max_len)
        if model.device.type == "cuda" and c.cuda_graphs:
            self._runner.capture(self._clock.now)
        return model

    async def close(self) -> None:
        self._stop = True
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            await asyncio.to_thread(thread.join, 30)
        for q in self._streams.values():
            q.put_nowait(("", None, None, True, EngineFailed("the engine closed")))
        self._streams.clear()

    def wait_drained(self, timeout: float) -> bool:
        """Block until the step loop has read back every step it launched and
        has nothing to run, or ``timeout`` s pass (False). From then until new
        work arrives its counters stay still (for tests and benchmarks that
        read them)."""
        return self._drained.wait(timeout)

    @property
    def healthy(self) -> bool:
        return self._thread is not None and self._dead is None

    def dead_reason(self) -> str | None:
        """Why the step loop is gone for good (it raised, or its thread ended
        without ``close``), or None while it runs (and before ``start``)."""
        if self._dead is not None:
            return f"the torch engine's loop died: {type(self._dead).__name__}: {self._dead}"
        thread = self._thread
        if thread is not None and not thread.is_alive() and not self._stop:
            return "the torch engine's thread ended"
        return None

    # --- requests (event loop) ---------------------------------------------------

    async def generate(self, request: TokenRequest) -> AsyncGenerator[CodeDelta[np.ndarray], None]:
        """Steps of ``request`` as they are sampled, merged per read: each
        ``CodeDelta`` carries every step that arrived since the last one."""
        dead = self.dead_reason()
        if dead is not None:
            raise EngineDead(dead)
        model = self.model
        pending = self._pending(request, model)
        rid = request.request_id
        if rid in self._streams:
            raise EngineFailed(f"request id {rid} is already running")
        if self._tally.waiting + self._inbox.qsize() >= self.config.max_waiting:
            raise Overloaded(f"the engine queue is full ({self.config.max_waiting} waiting)",
                             retry_after_ms=self.config.retry_after_ms)
        q: asyncio.Queue[_Event] = asyncio.Queue()
        self._streams[rid] = q
        self._tally.requests += 1
        self._tally.prompt_tokens += len(request.prompt_token_ids)
        self._inbox.put(("submit", pending))
        self._wake.set()
        started = pending.submitted
        count = 0
        finished = False
        try:
            while True:
                events = [await q.get()]
                while not q.empty():
                    events.append(q.get_nowait())
                codes: list[tuple[int, ...]] = []
                hidden: list[np.ndarray] = []
                error: BaseException | None = None
                for _rid, c, h, done, err in events:
                    if c is not None:
                        codes.extend(map(tuple, c.tolist()))
                        if h is not None:
                            hidden.append(h)
                    if err is not None:
                        error = err
                    finished = finished or done
                if codes:
                    before, count = count, count + len(codes)
                    self._tally.times.observe(before, count, self._clock.now() - started)
                    yield CodeDelta(tuple(codes), np.concatenate(hidden)
                                    if request.want_hidden and hidden else None)
                if error is not None:
                    self._tally.failed += 1
                    raise error
                if finished:
                    return
        finally:
            self._streams.pop(rid, None)
            if not finished:
                self._tally.aborted += 1
                self._inbox.put(("abort", rid))
                self._wake.set()

    def _pending(self, request: TokenRequest, model: ChatLM) -> EngineRequest:
        min_new = (1 << 40) if self.config.ignore_eos else self.config.min_new_steps
        return EngineRequest(request, prefill_inputs(request, model, min_new=min_new),
                             self._clock.now())

    async def refine(self, request: TokenRequest) -> list[int]:
        """Generate text ids (the refine-text lane): ``prompt_token_ids`` are text
        ids, ``stop_token_ids[0]`` ends it (not returned), at most ``max_tokens``.
        Cancelling the caller frees its slot."""
        model = self.model
        if self._text is None:
            raise EngineFailed("the engine has no refine-text lane (text_slots = 0)")
        dead = self.dead_reason()
        if dead is not None:
            raise EngineDead(dead)
        check_refine(request, model, self._text.max_len)
        rid = request.request_id
        if rid in self._text_futs:
            raise EngineFailed(f"request id {rid} is already running")
        job = TextJob(request=request, seed=draw_seed(request.sampling.seed))
        fut: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        self._text_futs[rid] = fut
        self._inbox.put(("text", job))
        self._wake.set()
        try:
            return await fut
        finally:
            self._text_futs.pop(rid, None)
            if not fut.done() or fut.cancelled():  # a cancelled caller cancels ``fut`` too
                self._inbox.put(("abort_text", rid))
                self._wake.set()

    def _resolve_text(self, results: list[TextResult]) -> None:
        for rid, ids, err in results:
            fut = self._text_futs.get(rid)
            if fut is None or fut.done():
                continue
            if err is not None:
                fut.set_exception(err)
            else:
                fut.set_result(ids or [])

    async def abort(self, request_id: str) -> None:
        q = self._streams.pop(request_id, None)
        if q is not None:
            self._tally.aborted += 1
            self._inbox.put(("abort", request_id))
            self._wake.set()
            q.put_nowait((request_id, None, None, True, None))

    @property
    def hidden_store(self) -> Any:
        """The device tensor ``[rows, hidden]`` a store index points into (None
        without ``hidden_store``); valid after ``start``."""
        return self.runner.store if self._runner is not None else None

    @property
    def store_zero_index(self) -> int:
        """A store index whose row is always zeros (padding)."""
        return self._handover.zero_index

    def release_hidden(self, request_id: str) -> None:
        """With ``hidden_store``: the consumer of ``request_id`` reads its store
        indices no more (call it once the request's decode is done or dropped;
        the store row is reused only after this and the request's end). A no-op
        otherwise, and for unknown or already released requests."""
        if self.config.hidden_store:
            self._inbox.put(("release", request_id))
            self._wake.set()

    def stats(self) -> EngineStats:
        return self._tally.snapshot(in_flight=len(self._streams))

    def counters(self) -> dict[str, tuple[str, float]]:
        """Extra counters for /metrics (``rtserver_engine_<name>_total``): ``rate()`` of
        each over ``rate(rtserver_engine_steps_total)`` gives host seconds, GPU seconds,
        rows and prefill positions per step (``counters.metric_counters``)."""
        return metric_counters(self.counters_)

    def store_rows_kept(self) -> int:
        """Hidden-state store rows a consumer still holds (0 without a store)."""
        ho = self._ho
        return ho.kept if ho is not None else 0

    def slots_in_use(self) -> int:
        return self._tally.running

    def _deliver(self, events: list[_Event], batch: Batch | None = None) -> None:
        streams = self._streams
        if batch is not None:
            codes, hidden, ends, done = batch.codes, batch.hidden, batch.ends, batch.done
            for j, rid in enumerate(batch.rids):
                q = streams.get(rid)
                if q is not None:
                    a, z = ends[j], ends[j + 1]
                    q.put_nowait((rid, codes[a:z], hidden[a:z] if hidden is not None else None,
                                  rid in done, None))
        for ev in events:
            q = streams.get(ev[0])
            if q is not None:
                q.put_nowait(ev)

    # --- the step loop (engine thread) ------------------------------------------------

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        runner = self.runner
        stream = (torch.cuda.stream(runner.stream) if runner.stream is not None
                  else contextlib.nullcontext())
        sched = self._sched
        assert sched is not None
        c = self.counters_
        store = runner.store is not None
        prev: Record | None = None
        # the last read's hand-overs, posted after the next launch (``_post_held``)
        held: tuple[list[_Event], Batch | None] = ([], None)
        try:
            with stream:
                while not self._stop:
                    t0 = time.perf_counter()
                    cpu0 = time.thread_time()
                    ph = [0.0] * 6  # launch, read, post: wall and CPU (StepCounters)
                    self._take_inbox()
                    out: list[_Event] = []
                    self._expire_waiting(out)
                    rec = None
                    if not sched.idle:
                        ho = self._handover
                        plan = sched.schedule(ho.free if store else None)
                        for ch in plan.chunks:
                            if ch.start == 0:
                                req: EngineRequest = ch.seq.payload
                                req.handle, req.gen = ho.give(
                                    ch.seq.rid, keep=store and req.request.want_hidden)
                        if store and self._n_hidden > 0:
                            self._stage_store(plan)
                        if not plan.empty:
                            self._drained.clear()
                            ta, ca = time.perf_counter(), time.thread_time()
                            try:
                                rec = runner.launch(plan, self._inputs, self._n_hidden > 0)
                            except Exception as exc:  # OOM, or a bug in a shape
                                log.exception("engine step failed")
                                self._fail_plan(plan, out, exc)
                            ph[0] += time.perf_counter() - ta
                            ph[1] += time.thread_time() - ca
                    text = self._text is not None and self._text.busy
                    if text:
                        self._text_turn()
                    # the last read's hand-overs go out now, after this launch and
                    # before the wait: the event loop's thread takes them (and the
                    # GIL) while this one waits on the GPU, instead of in the middle
                    # of the launch, whose every torch call lets go of the GIL
                    held = self._post_held(held, out, ph)
                    waited = cpu_waited = 0.0
                    if prev is not None:
                        tw, cw = time.perf_counter(), time.thread_time()
                        c.gpu_s += runner.wait(prev)
                        tr, cr = time.perf_counter(), time.thread_time()  # the read's start
                        waited, cpu_waited = tr - tw, cr - cw  # CUDA spins in the wait
                        c.wait_s += waited
                        c.syncs += 1
                        read: list[_Event] = []
                        held = (read, self._read(prev, read))
                        ph[2] += time.perf_counter() - tr
                        ph[3] += time.thread_time() - cr
                    prev = rec
                    tally = self._tally
                    tally.running, tally.waiting = sched.running, sched.waiting
                    tally.kv_cache_usage = sched.running / sched.config.slots
                    if prev is None:  # nothing in flight: no launch comes to post after
                        held = self._post_held(held, [], ph)
                    if rec is not None:
                        c.count(rec.plan, time.perf_counter() - t0 - waited,
                                time.thread_time() - cpu0 - cpu_waited, ph)
                    elif not text:
                        self._drained.set()
                        self._wake.wait(0.05)
                        self._wake.clear()
            self._post_held(held, [], [0.0] * 6)
        except BaseException as exc:  # a bug in the loop itself: fail everything
            log.exception("torch engine loop died")
            self._dead = exc
            err = EngineDead(f"the torch engine's loop died: {type(exc).__name__}: {exc}")
            self._post([*held[0], *((rid, None, None, True, err) for rid in list(self._streams))],
                       held[1])
            if self._text_futs and self._loop is not None and not self._loop.is_closed():
                results: list[TextResult] = [(rid, None, err) for rid in list(self._text_futs)]
                with contextlib.suppress(RuntimeError):
                    self._loop.call_soon_threadsafe(self._resolve_text, results)

    def _post_held(self, held: tuple[list[_Event], Batch | None], out: list[_Event],
                   ph: list[float]) -> tuple[list[_Event], Batch | None]:
        """Post ``held`` (a read's events and batch) then ``out`` (this turn's
        failures, which follow the deltas of the same requests); returns the
        empty hold."""
        events, batch = held
        if events or out or batch is not None:
            tp, cp = time.perf_counter(), time.thread_time()
            self._post([*events, *out] if out else events, batch)
            ph[4] += time.perf_counter() - tp
            ph[5] += time.thread_time() - cp
        return ([], None)

    def _inputs(self, seq: Seq) -> PrefillInputs:
        req: EngineRequest = seq.payload
        return req.inputs

    @property
    def _handover(self) -> Handover:
        assert self._ho is not None
        return self._ho

    def _read(self, rec: Record, out: list[_Event]) -> Batch | None:
        """Hand each request its step of ``rec`` (already copied out); finish those
        that ended. Returns the turn's hand-overs (None: nobody is handed any);
        single events go to ``out``."""
        runner, ho = self.runner, self._handover
        vq, r = runner.vq, rec.ring
        ring = runner.np_ring_i[r]
        plan = rec.plan
        p0 = runner.p0
        for i, ch in enumerate(plan.chunks):
            if ch.final and not ch.seq.done:
                self._step_of(ch.seq, r, p0 + i, int(ring[p0 + i, vq]), out)
        b = len(plan.rows)
        if b:
            rows = plan.rows
            hs, gs = ho.rows_of(rows, lambda: ([s.payload.handle for s in rows],
                                               [s.payload.gen for s in rows]))
            flags = ring[:b, vq]
            for i in ho.read_rows(hs, gs, r, flags):
                self._step_of(rows[i], r, i, int(flags[i]), out)
        batch = ho.flush(runner.np_ring_i, runner.np_ring_h if self._n_hidden > 0 else None)
        if batch is not None:
            self._tally.generation_tokens += batch.ends[-1]
        for seq in self._ending:
            self._end(seq)
        self._ending.clear()
        return batch

    def _stage_store(self, plan: Any) -> None:
        """Where each output row of ``plan``'s step goes in the hidden-state store."""
        ho, rows = self._handover, plan.rows
        hs, _ = ho.rows_of(rows, lambda: ([s.payload.handle for s in rows],
                                          [s.payload.gen for s in rows]))
        finals = [(i, ch.seq.payload.handle) for i, ch in enumerate(plan.chunks) if ch.final]
        ho.store_index(self.runner.staged_store_index(), hs, finals, self.runner.p0)

    def _step_of(self, seq: Seq, ring: int, row: int, flag: int, out: list[_Event]) -> None:
        """One row read back alone: a prefill's first step, or a flagged decode row."""
        req: EngineRequest = seq.payload
        rid = req.request.request_id
        if flag & FLAG_BAD:
            self._end(seq)
            out.append((rid, None, None, True, EngineFailed(
                f"request {rid}: the model produced non-finite values")))
            return
        done = bool(flag & FLAG_DONE)
        self._handover.hold_one(req.handle, ring, row, done)
        if done:
            self._ending.append(seq)  # after the flush: it reads the handle

    def _end(self, seq: Seq) -> None:
        sched = self._sched
        assert sched is not None
        if not seq.done:
            sched.finish(seq)
            self._handover.take_back(seq.payload.handle, seq.payload.gen)
            if seq.payload.request.want_hidden:
                self._n_hidden -= 1

    def _fail_plan(self, plan: Any, out: list[_Event], exc: Exception) -> None:
        why = (f"out of GPU memory in a step: {exc}" if isinstance(exc, torch.OutOfMemoryError)
               else f"engine step failed: {type(exc).__name__}: {exc}")
        for seq in {id(s): s for s in (*plan.rows, *(ch.seq for ch in plan.chunks))}.values():
            if not seq.done:
                self._end(seq)
                out.append((seq.rid, None, None, True, EngineFailed(why)))
        if self.model.device.type == "cuda" and isinstance(exc, torch.OutOfMemoryError):
            torch.cuda.empty_cache()

    def _text_turn(self) -> None:
        lane = self._text
        assert lane is not None
        jobs = [*lane.live.values(), *lane.waiting]
        try:
            results = lane.turn()
        except Exception as exc:  # OOM or a bug: fail the lane's jobs, not the codes
            log.exception("refine-text step failed")
            err = EngineFailed(f"refine-text failed: {type(exc).__name__}: {exc}")
            results = [(j.request.request_id, None, err) for j in jobs]
            for j in jobs:
                lane.drop(j.request.request_id)
        if results and self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._resolve_text, results)

    def _post(self, events: list[_Event], batch: Batch | None = None) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # loop closing
                loop.call_soon_threadsafe(self._deliver, events, batch)

    def _take_inbox(self) -> None:
        sched = self._sched
        assert sched is not None
        while True:
            try:
                kind, item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "submit":
                req: EngineRequest = item
                sched.add(Seq(rid=req.request.request_id, prompt_len=len(req.inputs.ids),
                              priority=req.request.priority, submitted=req.submitted,
                              payload=req))
                if req.request.want_hidden:
                    self._n_hidden += 1
            elif kind == "text" and self._text is not None:
                self._text.waiting.append(item)
            elif kind == "abort_text" and self._text is not None:
                self._text.drop(str(item))
            elif kind == "release":
                self._handover.release(str(item))
            else:
                found = sched.get(str(item))
                if found is not None:
                    self._end(found)

    def _expire_waiting(self, out: list[_Event]) -> None:
        sched = self._sched
        assert sched is not None
        if not sched.waiting:
            return
        for seq in sched.expire(self._clock.now() - self.config.max_queue_s):
            if seq.payload.request.want_hidden:
                self._n_hidden -= 1
            out.append((seq.rid, None, None, True, Overloaded(
                f"no engine slot free for {self.config.max_queue_s:g} s",
                retry_after_ms=self.config.retry_after_ms)))
