"""A continuous-batching torch engine for multi-codebook LMs (ChatTTS' GPT).

One engine per process. Its step loop runs in its own thread (torch releases
the GIL in its kernels) and owns the model, the KV slots and the schedule;
the asyncio side only submits, aborts and reads results, which arrive once
per step through ``loop.call_soon_threadsafe``.

Each turn of the loop:

1. takes what arrived (new requests into a queue ordered by priority, then
   arrival: a context's first segment before later ones; aborts free their
   slot before the next step runs);
2. admits waiting requests while slots are free, at most ``prefill_tokens``
   prompt positions per turn, and prefills them in one padded batch, whose
   last positions give each its first step;
3. runs one decode step for every live slot: rows ``0..B-1`` with ``B``
   rounded up to a batch bucket and attention over a length bucket, a CUDA
   graph per ``(B, L)`` on the GPU (bf16), eager on the CPU (float32);
4. hands each request its step: 4 codes and, if it asked, the hidden state.

A request ends at a stop id in any codebook (upstream ChatTTS), at its step
budget, or at the end of its slot. Faults stay with their requests: a row
whose hidden state is not finite fails that request; an out-of-memory error
in a prefill fails the requests of that prefill; a full queue is
``Overloaded`` with ``retry_after_ms``.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import queue
import random
import threading
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rtserver.clock import SYSTEM_CLOCK, Clock
from rtserver.engine.base import (
    CodeDelta,
    EngineStats,
    HistogramAccumulator,
    TokenRequest,
)
from rtserver.engine.capture_streams import capture_stream
from rtserver.errors import EngineFailed, Overloaded
from rtserver.voices.chattts.engine.model import ChatLM
from rtserver.voices.chattts.engine.sampling import PENALTY_WINDOW, sample_codes
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
    batch_buckets: tuple[int, ...] = DEFAULT_BATCH_BUCKETS
    length_buckets: tuple[int, ...] = DEFAULT_LENGTH_BUCKETS
    prefill_tokens: int = 4096  # prompt positions prefilled per turn (padded)
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
    # The refine-text lane (text_lane.py): its own slots and KV cache; 0: off.
    text_slots: int = 0
    text_max_len: int = 512


@dataclass
class _Pending:
    request: TokenRequest
    ids: torch.Tensor  # prompt ids, CPU int64
    vector: torch.Tensor | None  # replaces the prompt's ``inject_id`` positions
    inject_id: int | None
    seed: int
    submitted: float


@dataclass
class _Live:
    pending: _Pending
    slot: int
    steps: int = 0
    length: int = 0  # positions in the cache
    # steps sampled but not yet handed over (stream_interval)
    held_codes: list[np.ndarray] = field(default_factory=list)
    held_hidden: list[np.ndarray] = field(default_factory=list)


# thread -> loop: (request id, codes [n, vq] or None, hidden [n, H] or None, done, error)
_Event = tuple[str, "np.ndarray | None", "np.ndarray | None", bool, "BaseException | None"]


class TorchCodeEngine:
    """``TokenEngine[CodeDelta]`` over :class:`ChatLM` (see the module docstring)."""

    def __init__(self, model_factory: Callable[[], ChatLM], config: TorchEngineConfig,
                 *, eos_id: int, name: str = "torch", clock: Clock = SYSTEM_CLOCK) -> None:
        self.config = config
        self._clock = clock  # queue waits, time to first step, capture times
        self.eos_id = eos_id
        self.name = name
        self._factory = model_factory
        self._model: ChatLM | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stop = False
        self._streams: dict[str, asyncio.Queue[_Event]] = {}
        self._dead: BaseException | None = None
        # thread-owned
        self._waiting: list[tuple[int, int, _Pending]] = []
        self._seq = itertools.count()
        self._live: dict[int, _Live] = {}
        self._by_id: dict[str, _Live] = {}
        self._free: list[int] = []
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self._text: TextLane | None = None
        self._graph_samples = True  # the graphs hold the sampler too (else forward only)
        self._text_futs: dict[str, asyncio.Future[list[int]]] = {}
        # stats (written by the thread; read by the loop: plain ints, no locking needed)
        self.steps_total = 0
        self.prefills_total = 0
        self._running = 0
        self._n_waiting = 0
        self._requests = 0
        self._aborted = 0
        self._failed = 0
        self._prompt_tokens = 0
        self._gen_tokens = 0
        self._ttft = HistogramAccumulator()
        self._t7 = HistogramAccumulator()
        self._t28 = HistogramAccumulator()

    # --- lifecycle ------------------------------------------------------------

    @property
    def model(self) -> ChatLM:
        if self._model is None:
            raise EngineFailed("the torch engine is not started")
        return self._model

    async def start(self) -> None:
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._model = await asyncio.to_thread(self._build)
        self._thread = threading.Thread(target=self._run, name=f"{self.name}-engine",
                                        daemon=True)
        self._thread.start()

    def _build(self) -> ChatLM:
        model = self._factory()
        slots = model.slots
        self._free = list(range(slots))
        heapq.heapify(self._free)
        self._alloc_state(model)
        if self.config.text_slots > 0:
            self._text = TextLane(model, self.config.text_slots, self.config.text_max_len)
        if model.device.type == "cuda" and self.config.cuda_graphs:
            self._capture_graphs(model)
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

    @property
    def healthy(self) -> bool:
        return self._thread is not None and self._dead is None

    # --- requests (event loop) ---------------------------------------------------

    async def generate(self, request: TokenRequest) -> AsyncGenerator[CodeDelta[np.ndarray], None]:
        """Steps of ``request`` as they are sampled, merged per read: each
        ``CodeDelta`` carries every step that arrived since the last one."""
        if self._dead is not None:
            raise EngineFailed(f"the torch engine has died: {self._dead}")
        model = self.model
        pending = self._pending(request, model)
        rid = request.request_id
        if rid in self._streams:
            raise EngineFailed(f"request id {rid} is already running")
        if self._n_waiting + self._inbox.qsize() >= self.config.max_waiting:
            raise Overloaded(f"the engine queue is full ({self.config.max_waiting} waiting)",
                             retry_after_ms=self.config.retry_after_ms)
        q: asyncio.Queue[_Event] = asyncio.Queue()
        self._streams[rid] = q
        self._requests += 1
        self._prompt_tokens += len(request.prompt_token_ids)
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
                        codes.extend(tuple(row) for row in c.tolist())
                        if h is not None:
                            hidden.append(h)
                    if err is not None:
                        error = err
                    finished = finished or done
                if codes:
                    now = self._clock.now()
                    before, count = count, count + len(codes)
                    if before == 0:
                        self._ttft.observe(now - started)
                    if before < 7 <= count:
                        self._t7.observe(now - started)
                    if before < 28 <= count:
                        self._t28.observe(now - started)
                    yield CodeDelta(tuple(codes), np.concatenate(hidden)
                                    if request.want_hidden and hidden else None)
                if error is not None:
                    self._failed += 1
                    raise error
                if finished:
                    return
        finally:
            self._streams.pop(rid, None)
            if not finished:
                self._aborted += 1
                self._inbox.put(("abort", rid))
                self._wake.set()

    def _pending(self, request: TokenRequest, model: ChatLM) -> _Pending:
        n = len(request.prompt_token_ids)
        if n == 0:
            raise EngineFailed("empty prompt")
        if request.max_tokens < 1:
            raise EngineFailed("max_tokens must be >= 1")
        if n + 1 > model.max_len:
            raise EngineFailed(f"prompt of {n} positions does not fit a slot of "
                               f"{model.max_len}")
        if request.mask is not None:
            raise EngineFailed("the torch engine does not take token masks")
        ids = torch.tensor(request.prompt_token_ids, dtype=torch.int64)
        if int(ids.min()) < 0 or int(ids.max()) >= model.cfg.num_text_tokens:
            raise EngineFailed("prompt id out of the text vocabulary")
        vector = inject = None
        if len(request.embeddings) > 1:
            raise EngineFailed("the torch engine takes one prompt embedding")
        for emb in request.embeddings:
            if len(emb.vector) != model.cfg.hidden_size:
                raise EngineFailed(f"prompt embedding of {len(emb.vector)} values, the model "
                                   f"needs {model.cfg.hidden_size}")
            vector = torch.tensor(emb.vector, dtype=torch.float32)
            inject = emb.token_id
        seed = request.sampling.seed
        if seed is None:
            seed = random.getrandbits(31)
        return _Pending(request=request, ids=ids, vector=vector, inject_id=inject,
                        seed=int(seed), submitted=self._clock.now())

    async def refine(self, request: TokenRequest) -> list[int]:
        """Generate text ids (the refine-text lane): ``prompt_token_ids`` are text
        ids, ``stop_token_ids[0]`` ends it (not returned), at most ``max_tokens``.
        Cancelling the caller frees its slot."""
        model = self.model
        if self._text is None:
            raise EngineFailed("the engine has no refine-text lane (text_slots = 0)")
        if self._dead is not None:
            raise EngineFailed(f"the torch engine has died: {self._dead}")
        n = len(request.prompt_token_ids)
        if n == 0 or not request.stop_token_ids:
            raise EngineFailed("refine needs a prompt and a stop id")
        if n + 1 > self._text.max_len:
            raise EngineFailed(f"refine prompt of {n} positions does not fit "
                               f"{self._text.max_len}")
        vocab = model.cfg.num_text_tokens
        if min(request.prompt_token_ids) < 0 or max(request.prompt_token_ids) >= vocab:
            raise EngineFailed("prompt id out of the text vocabulary")
        rid = request.request_id
        if rid in self._text_futs:
            raise EngineFailed(f"request id {rid} is already running")
        seed = request.sampling.seed
        job = TextJob(request=request,
                      seed=int(seed if seed is not None else random.getrandbits(31)))
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
            self._aborted += 1
            self._inbox.put(("abort", request_id))
            self._wake.set()
            q.put_nowait((request_id, None, None, True, None))

    def stats(self) -> EngineStats:
        slots = self._model.slots if self._model is not None else 1
        return EngineStats(
            running=self._running, waiting=self._n_waiting,
            kv_cache_usage=self._running / slots, in_flight=len(self._streams),
            requests_total=self._requests, aborted_total=self._aborted,
            failed_total=self._failed, prompt_tokens_total=self._prompt_tokens,
            generation_tokens_total=self._gen_tokens,
            ttft=self._ttft.snapshot(), t7=self._t7.snapshot(), t28=self._t28.snapshot())

    def counters(self) -> dict[str, tuple[str, float]]:
        """Extra counters for /metrics (``rate()`` of steps is steps per second)."""
        return {"decode_steps": ("Decode steps run (all live requests at once)",
                                 self.steps_total),
                "prefill_batches": ("Prefill batches run", self.prefills_total)}

    def slots_in_use(self) -> int:
        return self._running

    def _deliver(self, events: list[_Event]) -> None:
        for ev in events:
            q = self._streams.get(ev[0])
            if q is not None:
                q.put_nowait(ev)

    # --- the step loop (engine thread) ------------------------------------------------

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        model = self.model
        try:
            while not self._stop:
                self._take_inbox()
                self._running = len(self._live)
                self._n_waiting = len(self._waiting)
                text = self._text is not None and self._text.busy
                if not self._live and not self._waiting and not text:
                    self._wake.wait(0.05)
                    self._wake.clear()
                    continue
                out: list[_Event] = []
                self._expire_waiting(out)
                self._admit(model, out)
                if self._live:
                    self._decode(model, out)
                if text:
                    self._text_turn()
                self._running = len(self._live)
                self._n_waiting = len(self._waiting)
                if out:
                    self._post(out)
        except BaseException as exc:  # a bug in the loop itself: fail everything
            log.exception("torch engine loop died")
            self._dead = exc
            out = [(lv.pending.request.request_id, None, None, True,
                    EngineFailed(f"the engine died: {exc}")) for lv in self._live.values()]
            out += [(p.request.request_id, None, None, True,
                     EngineFailed(f"the engine died: {exc}")) for _, _, p in self._waiting]
            self._post(out)

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

    def _post(self, events: list[_Event]) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # loop closing
                loop.call_soon_threadsafe(self._deliver, events)

    def _take_inbox(self) -> None:
        while True:
            try:
                kind, item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "submit":
                p: _Pending = item
                heapq.heappush(self._waiting, (p.request.priority, next(self._seq), p))
            elif kind == "text" and self._text is not None:
                self._text.waiting.append(item)
            elif kind == "abort_text" and self._text is not None:
                self._text.drop(str(item))
            else:
                self._drop(str(item))

    def _drop(self, rid: str) -> None:
        live = self._by_id.pop(rid, None)
        if live is not None:
            self._live.pop(live.slot, None)
            heapq.heappush(self._free, live.slot)
            return
        before = len(self._waiting)
        self._waiting = [w for w in self._waiting if w[2].request.request_id != rid]
        if len(self._waiting) != before:
            heapq.heapify(self._waiting)

    def _expire_waiting(self, out: list[_Event]) -> None:
        if not self._waiting or self._free:
            return
        limit = self._clock.now() - self.config.max_queue_s
        keep = []
        for w in self._waiting:
            if w[2].submitted < limit:
                out.append((w[2].request.request_id, None, None, True, Overloaded(
                    f"no engine slot free for {self.config.max_queue_s:g} s",
                    retry_after_ms=self.config.retry_after_ms)))
            else:
                keep.append(w)
        if len(keep) != len(self._waiting):
            self._waiting = keep
            heapq.heapify(self._waiting)

    def _finish(self, live: _Live) -> None:
        self._live.pop(live.slot, None)
        self._by_id.pop(live.pending.request.request_id, None)
        heapq.heappush(self._free, live.slot)

    # --- state -----------------------------------------------------------------

    def _alloc_state(self, model: ChatLM) -> None:
        s, dev, vq = model.slots, model.device, model.cfg.num_vq
        self._codes_in = torch.zeros((s, vq), dtype=torch.int64, device=dev)
        self._pos = torch.zeros(s, dtype=torch.int64, device=dev)
        self._step = torch.zeros(s, dtype=torch.int64, device=dev)
        self._seed = torch.zeros(s, dtype=torch.int64, device=dev)
        self._min_new = torch.zeros(s, dtype=torch.int64, device=dev)
        self._temp = torch.ones(s, dtype=torch.float32, device=dev)
        self._top_p = torch.ones(s, dtype=torch.float32, device=dev)
        self._top_k = torch.zeros(s, dtype=torch.int64, device=dev)
        self._penalty = torch.ones(s, dtype=torch.float32, device=dev)
        self._hist = torch.full((s, vq, self.config.penalty_window),
                                model.cfg.num_audio_tokens, dtype=torch.int64, device=dev)
        self._codes_out = torch.zeros((s, vq), dtype=torch.int64, device=dev)
        self._hidden_out = torch.zeros((s, model.cfg.hidden_size), dtype=torch.float32,
                                       device=dev)
        self._bad = torch.zeros(s, dtype=torch.bool, device=dev)

    def _reset_state(self, model: ChatLM) -> None:
        for t in (self._codes_in, self._pos, self._step, self._seed, self._min_new,
                  self._top_k, self._codes_out, self._hidden_out, self._bad):
            t.zero_()
        for t in (self._temp, self._top_p, self._penalty):
            t.fill_(1.0)
        self._hist.fill_(model.cfg.num_audio_tokens)

    def _sample(self, model: ChatLM, hidden: torch.Tensor, idx: slice | torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = model.code_logits(hidden)
        codes = sample_codes(
            logits, temperature=self._temp[idx], top_p=self._top_p[idx], top_k=self._top_k[idx],
            penalty=self._penalty[idx], history=self._hist[idx], seed=self._seed[idx],
            step=self._step[idx], min_new=self._min_new[idx], eos_id=self.eos_id)
        bad = ~(torch.isfinite(hidden).all(dim=-1) & torch.isfinite(logits).flatten(1).all(-1))
        return codes, bad

    def _step_rows(self, model: ChatLM, b: int, length: int) -> None:
        """One decode step of rows ``0..b-1`` on the state buffers (graph-safe)."""
        self._forward_rows(model, b, length)
        self._sample_rows(model, b)

    def _forward_rows(self, model: ChatLM, b: int, length: int) -> None:
        self._hidden_out[:b] = model.decode(self._codes_in[:b], self._pos[:b], length)

    def _sample_rows(self, model: ChatLM, b: int) -> None:
        hidden = self._hidden_out[:b]
        codes, bad = self._sample(model, hidden, slice(0, b))
        self._codes_out[:b] = codes
        self._bad[:b] = bad
        self._hist[:b] = torch.cat([self._hist[:b, :, 1:], codes[:, :, None]], dim=2)
        self._codes_in[:b] = codes
        self._pos[:b] = (self._pos[:b] + 1).clamp(max=model.max_len - 1)
        self._step[:b] += 1

    # --- admit and prefill --------------------------------------------------------

    def _admit(self, model: ChatLM, out: list[_Event]) -> None:
        batch: list[_Pending] = []
        budget = self.config.prefill_tokens
        longest = 0
        while self._waiting and len(batch) < len(self._free):
            p = self._waiting[0][2]
            n = len(p.request.prompt_token_ids)
            padded = max(longest, n) * (len(batch) + 1)
            if batch and padded > budget:
                break
            heapq.heappop(self._waiting)
            batch.append(p)
            longest = max(longest, n)
        if not batch:
            return
        slots = [heapq.heappop(self._free) for _ in batch]
        lives = [_Live(pending=p, slot=s) for p, s in zip(batch, slots, strict=True)]
        for lv in lives:
            self._live[lv.slot] = lv
            self._by_id[lv.pending.request.request_id] = lv
        try:
            self._prefill(model, lives, out)
        except torch.OutOfMemoryError as exc:
            self._fail(lives, out, f"out of GPU memory in prefill: {exc}")
            if model.device.type == "cuda":
                torch.cuda.empty_cache()
        except Exception as exc:
            log.exception("prefill failed")
            self._fail(lives, out, f"prefill failed: {type(exc).__name__}: {exc}")

    def _fail(self, lives: list[_Live], out: list[_Event], why: str) -> None:
        for lv in lives:
            if self._by_id.get(lv.pending.request.request_id) is lv:
                self._finish(lv)
            out.append((lv.pending.request.request_id, None, None, True, EngineFailed(why)))

    def _prefill(self, model: ChatLM, lives: list[_Live], out: list[_Event]) -> None:
        dev = model.device
        self.prefills_total += 1
        n = len(lives)
        lengths = [len(lv.pending.request.prompt_token_ids) for lv in lives]
        t = max(lengths)
        embeds = torch.zeros((n, t, model.cfg.hidden_size), dtype=model.dtype, device=dev)
        for i, lv in enumerate(lives):
            p = lv.pending
            vec = p.vector.to(dev) if p.vector is not None else None
            embeds[i, :lengths[i]] = model.prompt_embeds(p.ids.to(dev), p.inject_id, vec)
        slots = torch.tensor([lv.slot for lv in lives], dtype=torch.int64)
        params = [lv.pending.request.sampling for lv in lives]
        self._temp[slots.to(dev)] = torch.tensor([max(s.temperature, 1e-5) for s in params],
                                                 dtype=torch.float32).to(dev)
        self._top_p[slots.to(dev)] = torch.tensor([s.top_p for s in params],
                                                  dtype=torch.float32).to(dev)
        self._top_k[slots.to(dev)] = torch.tensor([s.top_k for s in params]).to(dev)
        self._penalty[slots.to(dev)] = torch.tensor([s.repetition_penalty for s in params],
                                                    dtype=torch.float32).to(dev)
        self._seed[slots.to(dev)] = torch.tensor([lv.pending.seed for lv in lives]).to(dev)
        self._min_new[slots.to(dev)] = (1 << 40) if self.config.ignore_eos \
            else self.config.min_new_steps
        self._step[slots.to(dev)] = 0
        self._hist[slots.to(dev)] = model.cfg.num_audio_tokens
        sl = slots.to(dev)
        hidden = model.prefill(embeds, torch.tensor(lengths, device=dev), sl)
        codes, bad = self._sample(model, hidden, sl)
        self._hist[sl] = torch.cat([self._hist[sl][:, :, 1:], codes[:, :, None]], dim=2)
        self._codes_in[sl] = codes
        self._pos[sl] = torch.tensor(lengths, dtype=torch.int64).to(dev)
        self._step[sl] = 1
        for i, lv in enumerate(lives):
            lv.length = lengths[i]
        self._emit(lives, codes.cpu().numpy(), hidden.cpu().numpy(), bad.cpu().numpy(), out)

    # --- decode ----------------------------------------------------------------------

    def _bucket(self, value: int, buckets: tuple[int, ...], cap: int) -> int:
        for b in buckets:
            if b >= value:
                return min(b, cap)
        return cap

    def _decode(self, model: ChatLM, out: list[_Event]) -> None:
        top = max(self._live) + 1
        b = self._bucket(top, self.config.batch_buckets, model.slots)
        longest = max(lv.length for lv in self._live.values()) + 1
        length = self._bucket(longest, self.config.length_buckets, model.max_len)
        lives = list(self._live.values())
        try:
            graph = self._graphs.get((b, length))
            if graph is None:
                self._step_rows(model, b, length)
            else:
                graph.replay()
                if not self._graph_samples:  # graphs of the forward only
                    self._sample_rows(model, b)
            codes = self._codes_out[:b].cpu().numpy()
            hidden = self._hidden_out[:b].cpu().numpy()
            bad = self._bad[:b].cpu().numpy()
        except torch.OutOfMemoryError as exc:
            self._fail(lives, out, f"out of GPU memory in decode: {exc}")
            return
        self.steps_total += 1
        for lv in lives:
            lv.length += 1
        self._emit(lives, codes[[lv.slot for lv in lives]], hidden[[lv.slot for lv in lives]],
                   bad[[lv.slot for lv in lives]], out)

    def _emit(self, lives: list[_Live], codes: np.ndarray, hidden: np.ndarray,
              bad: np.ndarray, out: list[_Event]) -> None:
        """Hand each request its step (in blocks, see ``stream_interval``);
        finish those that ended."""
        max_len = self._model.max_len if self._model is not None else 0
        eager, interval = self.config.eager_steps, self.config.stream_interval
        stops = (codes == self.eos_id).any(axis=1)
        for i, lv in enumerate(lives):
            req = lv.pending.request
            rid = req.request_id
            if bad[i]:
                self._finish(lv)
                out.append((rid, None, None, True, EngineFailed(
                    f"request {rid}: the model produced non-finite values")))
                continue
            lv.steps += 1
            self._gen_tokens += 1
            c = codes[i]
            stop = bool(stops[i]) or (bool(req.stop_token_ids)
                                      and bool(np.isin(c, req.stop_token_ids).any()))
            done = stop or lv.steps >= req.max_tokens or lv.length + 1 >= max_len
            lv.held_codes.append(c.copy())
            if req.want_hidden:
                lv.held_hidden.append(hidden[i].copy())
            if done or lv.steps <= eager or len(lv.held_codes) >= interval:
                out.append((rid, np.stack(lv.held_codes),
                            np.stack(lv.held_hidden) if lv.held_hidden else None, done, None))
                lv.held_codes, lv.held_hidden = [], []
            if done:
                self._finish(lv)

    # --- CUDA graphs ---------------------------------------------------------------------

    def _capture_graphs(self, model: ChatLM) -> None:
        """A graph per (batch bucket, length bucket) of the whole step; if the
        sampler cannot be captured, graphs of the forward only (sampling eager);
        if nothing can, eager steps. State buffers are reset after."""
        for whole in (True, False):
            try:
                self._capture(model, whole)
            except RuntimeError as exc:
                log.warning("CUDA graph capture (%s) failed: %s",
                            "step" if whole else "forward", exc)
                self._graphs.clear()
                torch.cuda.synchronize()
                continue
            self._graph_samples = whole
            break
        self._reset_state(model)  # forget what the warm-up wrote (in place: graphs hold them)

    def _capture(self, model: ChatLM, whole: bool) -> None:
        batches = sorted({min(b, model.slots) for b in self.config.batch_buckets})
        lengths = sorted({min(n, model.max_len) for n in self.config.length_buckets})

        def step(b: int, n: int) -> None:
            if whole:
                self._step_rows(model, b, n)
            else:
                self._forward_rows(model, b, n)

        pool = torch.cuda.graph_pool_handle()
        # A capture stream of the engine's own: its GEMMs get a cuBLAS workspace no
        # decoder graph shares (see rtserver.engine.capture_streams).
        stream = capture_stream(model.device)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        t0 = self._clock.now()
        with torch.cuda.stream(side):
            for b in batches:
                for n in lengths:
                    step(b, n)  # warm kernels and allocator
        torch.cuda.current_stream().wait_stream(side)
        for b in reversed(batches):  # largest first: later graphs reuse its pool
            for n in reversed(lengths):
                g = torch.cuda.CUDAGraph()
                # thread_local: the decoder's threads may launch work meanwhile
                with torch.cuda.graph(g, pool=pool, stream=stream,
                                      capture_error_mode="thread_local"):
                    step(b, n)
                self._graphs[(b, n)] = g
        torch.cuda.synchronize()
        log.info("captured %d CUDA graphs of the %s in %.1f s", len(self._graphs),
                 "step" if whole else "forward", self._clock.now() - t0)
