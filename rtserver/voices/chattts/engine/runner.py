"""The torch engine's model runner: device state, CUDA graphs, one sync per step.

It does what a scheduler ``Plan`` says (``scheduler.py``) and nothing else:

1. **moves**: one parallel gather/scatter of KV rows and per-slot state
   (compaction: decoding requests stay in slots ``0..B-1``), padded to a
   bucket of moves with scratch-onto-scratch ones: a CUDA graph per
   ``(moves, L)``;
2. **decode**: rows ``0..B-1`` (``B`` bucketed), attention over a length
   bucket, then sampling (temperature, repetition penalty, top-p, top-k per
   request and codebook), the next step's inputs, and stop detection (EOS or
   a stop id in any codebook, the step budget, the end of the slot), all on
   the device: a CUDA graph per ``(B, L)``;
3. **prefill**: the plan's prompt chunks in one padded batch (a graph per
   ``(rows, chunk, L)``); a prompt's last chunk samples its first step and
   writes the slot's decode state, so it decodes from the next step on;
4. **one copy out**: the step's codes and flags (and hidden states when a
   request wants them) go to a pinned ring buffer with non-blocking copies,
   then one event. With a hidden-state store (``RunnerConfig.store_rows``)
   the hidden states stay on the device instead: one ``index_copy_`` puts each
   output row into the store at the index the engine staged for it.
   ``wait`` on that event is the step's only host sync; the engine launches
   step ``t + 1`` before it waits on step ``t``.

Device state per slot (slot ``slots`` is scratch, for a prefill's padded rows):
``istate`` int64 (codes in, position, step, seed, min_new, top_k, step
budget, stop ids), ``fstate`` float32 (temperature, top-p, penalty) and the
penalty history. A slot that is not decoding reads position ``max_len``
(scratch), so the padded rows of a decode graph never write into a prompt.
On the CPU the same code runs eagerly and the copies are plain copies.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch

from rtserver.engine.capture_streams import capture_stream
from rtserver.voices.chattts.engine.model import ChatLM
from rtserver.voices.chattts.engine.sampling import PENALTY_WINDOW, sample_codes
from rtserver.voices.chattts.engine.scheduler import Plan, SchedulerConfig, bucket, shapes

log = logging.getLogger(__name__)

MAX_STOPS = 4  # stop ids per request the device checks (beside EOS)
FLAG_DONE = 1
FLAG_BAD = 2  # non-finite hidden state or logits
MOVE_BUCKETS = (1, 2, 4, 8)
S = TypeVar("S", bound=tuple[int, ...])  # a graph's shape


@dataclass(frozen=True, slots=True)
class RunnerConfig:
    eos_id: int
    graphs: bool = True  # CUDA only
    batch_buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 192, 256, 384, 512)
    min_new_steps: int = 1
    ignore_eos: bool = False
    penalty_window: int = PENALTY_WINDOW
    ring: int = 8  # steps the pinned output ring holds (>= stream_interval + 2)
    # The hidden-state store: rows x columns (handles + 2 rows of max_len + 1
    # steps, see ``handover``); 0: hidden states go to the pinned ring.
    store_rows: int = 0
    store_cols: int = 0
    # Move counts a step's moves are padded to (scratch -> scratch), each a CUDA
    # graph per length bucket; more moves run eagerly. A step's moves are 0-3 in
    # steady traffic (1.6 slots a step at 256 streams through the server), and
    # eagerly they were 62 of the engine thread's 331 samples at 512 streams
    # (py-spy, bench/results/h100-2026-12-06-s18): a dozen indexing launches.
    move_buckets: tuple[int, ...] = MOVE_BUCKETS


@dataclass
class Record:
    """A launched step: what it ran and where its output lands."""

    number: int
    plan: Plan
    ring: int  # index into the pinned ring
    hidden: bool  # hidden states were copied out
    done_event: Any = None  # torch.cuda.Event (None on the CPU)
    start_event: Any = None
    launched: float = 0.0


class ModelRunner:
    """Owns the device state and graphs of one ``ChatLM`` (engine thread only)."""

    def __init__(self, model: ChatLM, cfg: RunnerConfig, sched: SchedulerConfig) -> None:
        self.model = model
        self.cfg = cfg
        self.sched = sched
        dev = self.device = model.device
        self.cuda = dev.type == "cuda"
        c = model.cfg
        vq = self.vq = c.num_vq
        s1 = model.slots + 1
        self.scratch_slot = model.slots
        # istate columns
        self.POS, self.STEP, self.SEED, self.MIN_NEW, self.TOPK, self.MAXSTEPS = range(vq, vq + 6)
        self.STOP = vq + 6
        ni = self.STOP + MAX_STOPS
        self.istate = torch.zeros((s1, ni), dtype=torch.int64, device=dev)
        self.istate[:, self.POS] = model.max_len
        self.fstate = torch.ones((s1, 3), dtype=torch.float32, device=dev)
        self.hist = torch.full((s1, vq, cfg.penalty_window), c.num_audio_tokens,
                               dtype=torch.int64, device=dev)
        # outputs of a step: decode rows at 0.., prefill rows at ``self.p0``..
        self.p0 = model.slots
        self.pmax = sched.max_prefill_rows
        rows = self.p0 + self.pmax
        self.out_i = torch.zeros((rows, vq + 1), dtype=torch.int32, device=dev)
        self.out_h = torch.zeros((rows, c.hidden_size), dtype=torch.float32, device=dev)
        # prefill inputs: ids then metadata (int64), speaker vector then sampling (float32)
        self.tmax = sched.max_chunk
        (self.M_SLOT, self.M_START, self.M_LAST, self.M_FINAL, self.M_INJECT, self.M_SEED,
         self.M_MIN_NEW, self.M_TOPK, self.M_MAXSTEPS) = range(9)
        self.M_STOP = 9
        self.nm = self.M_STOP + MAX_STOPS
        self.pf_i = torch.zeros((self.pmax, self.tmax + self.nm), dtype=torch.int64, device=dev)
        self.pf_f = torch.zeros((self.pmax, c.hidden_size + 3), dtype=torch.float32, device=dev)
        self.mv = torch.zeros((2, s1), dtype=torch.int64, device=dev)
        # host side: pinned (CUDA) staging, two deep (a step's inputs are written
        # while the step before may still be copying the other half in)
        pin = self.cuda
        self.h_pf_i = torch.zeros((2, *self.pf_i.shape), dtype=torch.int64, pin_memory=pin)
        self.h_pf_f = torch.zeros((2, *self.pf_f.shape), dtype=torch.float32, pin_memory=pin)
        self.h_mv = torch.zeros((2, *self.mv.shape), dtype=torch.int64, pin_memory=pin)
        self.ring_i = torch.zeros((cfg.ring, *self.out_i.shape), dtype=torch.int32,
                                  pin_memory=pin)
        # (empty with a store: hidden states then stay on the device)
        self.ring_h = torch.zeros((cfg.ring, rows, 0 if cfg.store_rows else c.hidden_size),
                                  dtype=torch.float32, pin_memory=pin)
        # numpy views, made once (no per-step tensor -> numpy conversions)
        self.np_pf_i = self.h_pf_i.numpy()
        self.np_pf_f = self.h_pf_f.numpy()
        self.np_mv = self.h_mv.numpy()
        self.np_ring_i = self.ring_i.numpy()
        self.np_ring_h = self.ring_h.numpy()
        # the hidden-state store (device), and each step's staged store indices
        self.store: torch.Tensor | None = None
        if cfg.store_rows:
            self.store = torch.zeros((cfg.store_rows * cfg.store_cols, c.hidden_size),
                                     dtype=torch.float32, device=dev)
            self.si = torch.zeros(rows, dtype=torch.int64, device=dev)
            self.h_si = torch.zeros((2, rows), dtype=torch.int64, pin_memory=pin)
            self.np_si = self.h_si.numpy()
        self._decode_graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self._prefill_graphs: dict[tuple[int, int, int], torch.cuda.CUDAGraph] = {}
        self._move_graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self._move_cap = min(max(cfg.move_buckets, default=0), s1)
        self._turn = 0
        self.waits = 0  # host syncs made (one per step read back)
        self._batches = sorted({min(b, model.slots) for b in cfg.batch_buckets} | {model.slots})
        self._events: list[tuple[Any, Any]] = []
        self.stream: Any = None
        if self.cuda:
            self._events = [(torch.cuda.Event(enable_timing=True),
                             torch.cuda.Event(enable_timing=True)) for _ in range(cfg.ring)]
            # the GPT's own stream, high priority: the decoder's kernels yield to it
            self.stream = torch.cuda.Stream(device=dev, priority=-1)

    # --- shapes ------------------------------------------------------------------------

    def move_shapes(self) -> list[tuple[int, int]]:
        return [(m, n) for m in sorted({min(m, self._move_cap) for m in self.cfg.move_buckets})
                for n in _reachable(self.sched.length_buckets, 1, self.model.max_len)]

    def decode_shapes(self) -> list[tuple[int, int]]:
        return [(b, n) for b in self._batches
                for n in _reachable(self.sched.length_buckets, 1, self.model.max_len)]

    def prefill_shapes(self) -> list[tuple[int, int, int]]:
        return [(rb, tb, n) for rb, tb in shapes(self.sched)
                for n in _reachable(self.sched.length_buckets, tb, self.model.max_len)]

    def _decode_b(self, rows: int) -> int:
        if not self._decode_graphs:
            return rows  # eager: no padding
        return bucket(rows, self._batches, self.model.slots)

    # --- the device programs (graph-safe: no host syncs, static shapes) ------------------

    def _sample(self, hidden: torch.Tensor, ist: torch.Tensor, fst: torch.Tensor,
                hist: torch.Tensor, step: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                  torch.Tensor]:
        logits = self.model.code_logits(hidden)
        codes = sample_codes(
            logits, temperature=fst[:, 0], top_p=fst[:, 1], top_k=ist[:, self.TOPK],
            penalty=fst[:, 2], history=hist, seed=ist[:, self.SEED], step=step,
            min_new=ist[:, self.MIN_NEW], eos_id=self.cfg.eos_id)
        bad = ~(torch.isfinite(hidden).all(dim=-1) & torch.isfinite(logits).flatten(1).all(-1))
        stop = (codes == self.cfg.eos_id).any(dim=1) | (
            codes[:, :, None] == ist[:, None, self.STOP:self.STOP + MAX_STOPS]).flatten(1).any(1)
        return codes, bad, stop

    def _decode(self, b: int, length: int) -> None:
        model, vq = self.model, self.vq
        ist = self.istate[:b]
        pos = ist[:, self.POS]
        hidden = model.decode(ist[:, :vq], pos, length)
        step = ist[:, self.STEP]
        codes, bad, stop = self._sample(hidden, ist, self.fstate[:b], self.hist[:b], step)
        new_pos = pos + 1
        step1 = step + 1
        done = stop | (step1 >= ist[:, self.MAXSTEPS]) | (new_pos >= model.max_len)
        self.out_i[:b, :vq] = codes.to(torch.int32)
        self.out_i[:b, vq] = done.to(torch.int32) | (bad.to(torch.int32) * FLAG_BAD)
        self.out_h[:b] = hidden
        self.hist[:b] = torch.cat([self.hist[:b, :, 1:], codes[:, :, None]], dim=2)
        self.istate[:b, :vq] = codes
        self.istate[:b, self.POS] = new_pos.clamp(max=model.max_len)
        self.istate[:b, self.STEP] = step1

    def _prefill(self, n: int, t: int, length: int) -> None:
        model, vq, h = self.model, self.vq, model_hidden(self.model)
        meta = self.pf_i[:n, self.tmax:]
        ids = self.pf_i[:n, :t]
        slot = meta[:, self.M_SLOT]
        start = meta[:, self.M_START]
        emb = model.emb_text[ids]
        vec = self.pf_f[:n, :h]
        emb = torch.where((ids == meta[:, self.M_INJECT, None])[:, :, None],
                          vec[:, None, :].to(emb.dtype), emb)
        hidden = model.prefill_chunk(emb, slot, start, meta[:, self.M_LAST], length)
        # the request's decode state, as the decode step reads it
        new = torch.zeros((n, self.istate.shape[1]), dtype=torch.int64, device=self.device)
        new[:, self.SEED] = meta[:, self.M_SEED]
        new[:, self.MIN_NEW] = meta[:, self.M_MIN_NEW]
        new[:, self.TOPK] = meta[:, self.M_TOPK]
        new[:, self.MAXSTEPS] = meta[:, self.M_MAXSTEPS]
        new[:, self.STOP:self.STOP + MAX_STOPS] = meta[:, self.M_STOP:self.M_STOP + MAX_STOPS]
        fnew = self.pf_f[:n, h:h + 3]
        hist0 = torch.full((n, vq, self.cfg.penalty_window), model.cfg.num_audio_tokens,
                           dtype=torch.int64, device=self.device)
        step0 = torch.zeros(n, dtype=torch.int64, device=self.device)
        codes, bad, stop = self._sample(hidden, new, fnew, hist0, step0)
        final = meta[:, self.M_FINAL] == 1
        end = meta[:, self.M_LAST] + start + 1  # the prompt's length, on its last chunk
        new[:, :vq] = codes
        new[:, self.STEP] = 1
        done = stop | (new[:, self.MAXSTEPS] <= 1) | (end >= model.max_len)
        keep = self.istate[slot]
        new = torch.where(final[:, None], new, keep)
        new[:, self.POS] = torch.where(final, end, model.max_len)  # not final: scratch
        self.istate[slot] = new
        self.fstate[slot] = torch.where(final[:, None], fnew, self.fstate[slot])
        hist1 = torch.cat([hist0[:, :, 1:], codes[:, :, None]], dim=2)
        self.hist[slot] = torch.where(final[:, None, None], hist1, self.hist[slot])
        p0 = self.p0
        self.out_i[p0:p0 + n, :vq] = codes.to(torch.int32)
        self.out_i[p0:p0 + n, vq] = done.to(torch.int32) | (bad.to(torch.int32) * FLAG_BAD)
        self.out_h[p0:p0 + n] = hidden

    def _moves(self, m: int, length: int) -> None:
        src, dst = self.mv[0, :m], self.mv[1, :m]
        for cache in (self.model.k_cache, self.model.v_cache):
            cache[:, dst, :, :length] = cache[:, src, :, :length]
        self.istate[dst] = self.istate[src]
        self.fstate[dst] = self.fstate[src]
        self.hist[dst] = self.hist[src]

    # --- a step ---------------------------------------------------------------------

    def staged_store_index(self) -> np.ndarray:
        """The host buffer of store indices (one per output row) the next
        ``launch`` reads when it wants hidden states and a store is kept."""
        return self.np_si[self._turn % 2]

    def launch(self, plan: Plan, fill: Any, want_hidden: bool) -> Record:
        """Launch ``plan``'s step; nothing here waits on the device. ``fill(chunk)``
        gives a chunk's host-side inputs (see ``PrefillInputs``)."""
        k = self._turn % 2
        rec = Record(number=self._turn, plan=plan, ring=self._turn % self.cfg.ring,
                     hidden=want_hidden, launched=time.perf_counter())
        self._turn += 1
        stream = None
        if self._events:
            rec.start_event, rec.done_event = self._events[rec.ring]
            # the model's device named: Event.record() with no stream asks
            # torch.cuda.current_stream(), whose device lookup runs is_available ->
            # getenv on every call (py-spy at 256 rows on an H100: 16 of the launch's
            # 39 samples in the record; bench/results/h100-2026-12-06-s18)
            stream = torch.cuda.current_stream(self.device)
            rec.start_event.record(stream)
        if plan.moves:
            m = len(plan.moves)
            mv = self.np_mv[k]
            mv[0, :m] = [a for a, _ in plan.moves]
            mv[1, :m] = [b for _, b in plan.moves]
            if m <= self._move_cap:  # padded to its bucket: scratch onto itself
                mb = bucket(m, self.cfg.move_buckets, self._move_cap)
                mv[:, m:mb] = self.scratch_slot
                m = mb
            self.mv.copy_(self.h_mv[k], non_blocking=True)  # whole: contiguous
            g = self._move_graphs.get((m, plan.move_length))
            if g is not None:
                g.replay()
            else:
                self._moves(m, plan.move_length)
        b = len(plan.rows)
        if b:
            bb = self._decode_b(b)
            g = self._decode_graphs.get((bb, plan.length))
            if g is not None:
                g.replay()
            else:
                self._decode(bb, plan.length)
        n = len(plan.chunks)
        if n:
            self._stage_prefill(plan, k, fill)
            t = bucket(max(c.length for c in plan.chunks), self.sched.chunk_buckets,
                       self.sched.max_chunk)
            nb = bucket(n, self.sched.row_buckets, self.pmax) if self._prefill_graphs else n
            t = t if self._prefill_graphs else max(c.length for c in plan.chunks)
            self.pf_i[:nb].copy_(self.h_pf_i[k, :nb], non_blocking=True)
            self.pf_f[:nb].copy_(self.h_pf_f[k, :nb], non_blocking=True)
            g = self._prefill_graphs.get((nb, t, plan.prefill_length))
            if g is not None:
                g.replay()
            else:
                self._prefill(nb, t, plan.prefill_length)
        r, p0 = rec.ring, self.p0
        to_ring = want_hidden and self.store is None
        if want_hidden and self.store is not None:
            self.si.copy_(self.h_si[k], non_blocking=True)
            self.store.index_copy_(0, self.si, self.out_h)
        if b:
            self.ring_i[r, :b].copy_(self.out_i[:b], non_blocking=True)
            if to_ring:
                self.ring_h[r, :b].copy_(self.out_h[:b], non_blocking=True)
        if n:
            self.ring_i[r, p0:p0 + n].copy_(self.out_i[p0:p0 + n], non_blocking=True)
            if to_ring:
                self.ring_h[r, p0:p0 + n].copy_(self.out_h[p0:p0 + n], non_blocking=True)
        if rec.done_event is not None:
            rec.done_event.record(stream)
        return rec

    def _stage_prefill(self, plan: Plan, k: int, fill: Any) -> None:
        pi, pf = self.np_pf_i[k], self.np_pf_f[k]
        t0, h = self.tmax, model_hidden(self.model)
        n = len(plan.chunks)
        nb = bucket(n, self.sched.row_buckets, self.pmax)
        for i, c in enumerate(plan.chunks):
            inp: PrefillInputs = fill(c.seq)
            pi[i, :c.length] = inp.ids[c.start:c.start + c.length]
            pi[i, c.length:t0] = 0
            pi[i, t0:] = (c.slot, c.start, c.length - 1, int(c.final), inp.inject_id,
                          inp.seed, inp.min_new, inp.top_k, inp.max_steps, *inp.stops)
            if inp.vector is not None:
                pf[i, :h] = inp.vector
            pf[i, h:] = inp.sampling
        for i in range(n, nb):  # padded rows: the scratch slot, nothing final
            pi[i, :] = 0
            pi[i, t0 + self.M_SLOT] = self.scratch_slot
            pi[i, t0 + self.M_INJECT] = -1
            pi[i, t0 + self.M_MAXSTEPS] = 1
            pf[i, h:] = 1.0

    def wait(self, rec: Record) -> float:
        """The step's one host sync: its output is in the pinned ring after this.
        Returns the step's GPU time in seconds (0 on the CPU)."""
        self.waits += 1
        if rec.done_event is None:
            return 0.0
        rec.done_event.synchronize()
        return float(rec.start_event.elapsed_time(rec.done_event)) / 1000

    # --- warm-up and graphs -----------------------------------------------------------

    def reset(self) -> None:
        """Forget what a warm-up wrote (in place: graphs hold these buffers)."""
        self.istate.zero_()
        self.istate[:, self.POS] = self.model.max_len
        self.fstate.fill_(1.0)
        self.hist.fill_(self.model.cfg.num_audio_tokens)
        self.model.k_cache.zero_()
        self.model.v_cache.zero_()

    def capture(self, clock: Any = time.monotonic) -> int:
        """Warm every decode and prefill shape, then capture a graph of each (CUDA).
        Returns the number of graphs."""
        if not (self.cuda and self.cfg.graphs):
            return 0
        dshapes, pshapes = self.decode_shapes(), self.prefill_shapes()
        self.pf_i[:, self.tmax + self.M_SLOT] = self.scratch_slot
        self.pf_i[:, self.tmax + self.M_INJECT] = -1
        t0 = clock()
        self._warm(dshapes, self._decode)
        self._warm(pshapes, self._prefill)
        pool = torch.cuda.graph_pool_handle()
        # a capture stream of the engine's own: its GEMMs get a cuBLAS workspace no
        # decoder graph shares (see rtserver.engine.capture_streams)
        stream = capture_stream(self.device)
        self._decode_graphs = self._graph_each(dshapes, self._decode, pool, stream)
        self._prefill_graphs = self._graph_each(pshapes, self._prefill, pool, stream)
        self._capture_moves(pool, stream)
        torch.cuda.synchronize()
        self.reset()
        torch.cuda.synchronize()
        log.info("captured %d decode, %d prefill and %d move CUDA graphs in %.1f s (decode "
                 "attention %s)", len(self._decode_graphs), len(self._prefill_graphs),
                 len(self._move_graphs), clock() - t0, self.model.attention)
        return self.graphs

    def _capture_moves(self, pool: Any, stream: Any) -> None:
        """A graph per move shape, moving scratch onto itself (so capture
        changes nothing). Moves are never needed as graphs: if one cannot be
        captured, every move stays eager and the engine says why."""
        self.mv.fill_(self.scratch_slot)
        mshapes = self.move_shapes()
        try:
            self._warm(mshapes, self._moves)
            self._move_graphs = self._graph_each(mshapes, self._moves, pool, stream)
        except RuntimeError as exc:  # a capture error names the op that broke it
            self._move_graphs = {}
            torch.cuda.synchronize()
            log.warning("moves stay eager: their CUDA graph did not capture (%s)", exc)

    def _warm(self, shapes: Sequence[S], program: Callable[..., None]) -> None:
        """``program(*shape)`` for every shape once, eagerly, on a side stream."""
        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for shape in shapes:
                program(*shape)
        torch.cuda.current_stream().wait_stream(side)

    @staticmethod
    def _graph_each(shapes: Sequence[S], program: Callable[..., None], pool: Any,
                    stream: Any) -> dict[S, torch.cuda.CUDAGraph]:
        """A CUDA graph of ``program(*shape)`` per shape, the largest first:
        later graphs reuse its memory in the shared ``pool``."""
        graphs: dict[S, torch.cuda.CUDAGraph] = {}
        for shape in reversed(shapes):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool, stream=stream, capture_error_mode="thread_local"):
                program(*shape)
            graphs[shape] = g
        return graphs

    @property
    def graphs(self) -> int:
        return len(self._decode_graphs) + len(self._prefill_graphs) + len(self._move_graphs)


@dataclass(frozen=True, slots=True)
class PrefillInputs:
    """A request's prefill inputs, host side (made once at submit)."""

    ids: np.ndarray  # int64 [prompt]
    vector: np.ndarray | None  # float32 [hidden], at ``inject_id`` positions
    inject_id: int  # -1: none
    seed: int
    min_new: int
    top_k: int
    max_steps: int
    stops: tuple[int, ...]  # MAX_STOPS ids, -1 padded
    sampling: tuple[float, float, float]  # temperature, top-p, repetition penalty


def model_hidden(model: ChatLM) -> int:
    return model.cfg.hidden_size


def _reachable(buckets: tuple[int, ...], lo: int, cap: int) -> list[int]:
    """Every value ``bucket(v, buckets, cap)`` takes for ``lo <= v <= cap``."""
    vals = {min(b, cap) for b in buckets if b >= lo}
    vals.add(cap)
    return sorted(v for v in vals if v >= lo)
