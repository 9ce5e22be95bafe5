"""The torch engine's scheduler: who runs in the next step, and where (pure Python).

No torch, no asyncio: the model runner (``runner.py``) does what a ``Plan``
says, and the engine loop (``engine.py``) feeds the scheduler what arrived
and what finished. Tested without torch (``tests/unit/test_chattts_scheduler.py``).

The slot pool. A request holds one KV slot from its first prefill chunk to
its end. **Decoding requests always sit in slots ``0..B-1``** (``B`` = the
number decoding), so a step runs exactly ``B`` rows (bucketed for a CUDA
graph) and never pads up to the highest slot index. When a request leaves,
the highest decoding request moves into its hole; when a prefill completes,
the request moves to row ``B``. A ``Plan``'s ``moves`` are one parallel
assignment ``slot[dst] = slot[src]`` (every source read before any
destination is written), which the runner applies before the step.

Prefill never stalls decode (vLLM's chunked prefill): each plan carries at
most ``prefill_tokens`` padded prompt positions, in chunks of at most
``max_chunk`` positions per request, at most ``max_prefill_rows`` requests;
requests already prefilling continue first, then waiting ones are admitted
in order of priority, then arrival (a context's first segment before later
ones). A request whose last chunk is in a plan decodes from the next plan on.

Async scheduling (vLLM's): the loop launches step ``t + 1`` before it reads
step ``t``'s results, so a request that ended at step ``t`` runs one more
step whose output is dropped; ``finish`` frees its slot for the plan after.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any


def bucket(value: int, buckets: Sequence[int], cap: int) -> int:
    """The smallest bucket >= ``value``, at most ``cap`` (``cap`` if none is)."""
    for b in buckets:
        if b >= value:
            return min(b, cap)
    return cap


@dataclass(eq=False)
class Seq:
    """One request as the scheduler sees it; ``payload`` is the engine's own."""

    rid: str
    prompt_len: int
    priority: int = 0
    submitted: float = 0.0
    payload: Any = None
    slot: int = -1  # -1: waiting
    prefilled: int = 0  # prompt positions in the cache (or launched into it)
    decoding: bool = False
    done: bool = False
    seq_no: int = 0
    # decoding: plan ``k``'s step reads the input at position ``pos0 + k - step0``
    pos0: int = 0
    step0: int = 0


@dataclass(frozen=True, slots=True)
class Chunk:
    """Prompt positions ``start .. start + length - 1`` of ``seq`` into ``slot``;
    ``final``: the prompt's last chunk (its last position samples step 1)."""

    seq: Seq
    slot: int
    start: int
    length: int
    final: bool


@dataclass(frozen=True, slots=True)
class Plan:
    """One engine step: apply ``moves``, decode ``rows`` (row i = slot i = ``rows[i]``)
    over ``length`` cache positions, prefill ``chunks``."""

    moves: tuple[tuple[int, int], ...]  # (src slot, dst slot), one parallel assignment
    move_length: int  # cache positions the moves copy
    rows: tuple[Seq, ...]
    length: int  # cache positions the decode step attends over (>= every row's pos + 1)
    chunks: tuple[Chunk, ...]
    prefill_tokens: int  # padded positions: rows bucket x chunk bucket
    prefill_length: int  # cache positions the chunks attend over (a length bucket)

    @property
    def empty(self) -> bool:
        return not self.rows and not self.chunks


@dataclass
class SchedulerConfig:
    slots: int
    max_len: int
    prefill_tokens: int = 1024  # padded prompt positions per step
    max_chunk: int = 256  # prompt positions per request per step
    max_prefill_rows: int = 16  # requests prefilled per step
    chunk_buckets: tuple[int, ...] = (32, 64, 128, 256)
    row_buckets: tuple[int, ...] = (1, 2, 4, 8, 16)
    length_buckets: tuple[int, ...] = (128, 256, 512, 1024, 2048, 4096)


@dataclass
class Scheduler:
    """Admission, priorities, the prefill budget and the slot pool (see the module)."""

    config: SchedulerConfig
    _waiting: list[tuple[int, int, Seq]] = field(default_factory=list)
    _by_id: dict[str, Seq] = field(default_factory=dict)
    _rows: list[Seq] = field(default_factory=list)  # decoding, row i in slot i
    _prefilling: list[Seq] = field(default_factory=list)  # in admission order
    _joining: list[Seq] = field(default_factory=list)  # last chunk launched; decode next plan
    _holder: dict[int, Seq] = field(default_factory=dict)  # slot -> its request
    _free: list[int] = field(default_factory=list)
    _seq: itertools.count[int] = field(default_factory=itertools.count)
    _rows_changed: bool = True
    _rows_view: tuple[Seq, ...] = ()
    _max_pos: int = 0
    _plans: int = 0  # plans made so far

    def __post_init__(self) -> None:
        self._free = list(range(self.config.slots))
        heapq.heapify(self._free)

    # --- what arrives ---------------------------------------------------------------

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        """Requests holding a slot (prefilling or decoding)."""
        return len(self._holder)

    @property
    def decoding(self) -> int:
        return len(self._rows)

    @property
    def idle(self) -> bool:
        return not self._waiting and not self._holder

    def get(self, rid: str) -> Seq | None:
        return self._by_id.get(rid)

    def add(self, seq: Seq) -> None:
        if seq.rid in self._by_id:
            raise ValueError(f"request id {seq.rid} is already scheduled")
        if seq.prompt_len < 1 or seq.prompt_len + 1 > self.config.max_len:
            raise ValueError(f"prompt of {seq.prompt_len} positions does not fit a slot of "
                             f"{self.config.max_len}")
        seq.seq_no = next(self._seq)
        self._by_id[seq.rid] = seq
        heapq.heappush(self._waiting, (seq.priority, seq.seq_no, seq))

    def finish(self, seq: Seq) -> None:
        """``seq`` ended (done, failed or aborted): its slot is free for the next plan;
        unknown or already finished requests are ignored."""
        if seq.done or self._by_id.get(seq.rid) is not seq:
            return
        seq.done = True
        del self._by_id[seq.rid]
        if seq.slot < 0:
            self._waiting = [w for w in self._waiting if w[2] is not seq]
            heapq.heapify(self._waiting)
            return
        if seq.decoding:
            self._rows_changed = True  # the hole is filled in the next plan
        elif seq in self._joining:
            self._joining.remove(seq)
        else:
            self._prefilling.remove(seq)
        del self._holder[seq.slot]
        heapq.heappush(self._free, seq.slot)

    def abort(self, rid: str) -> Seq | None:
        seq = self._by_id.get(rid)
        if seq is not None:
            self.finish(seq)
        return seq

    def expire(self, before: float) -> list[Seq]:
        """Waiting requests submitted before ``before`` while no slot is free:
        removed and returned (the engine fails them as overloaded)."""
        if not self._waiting or self._free:
            return []
        old = [w[2] for w in self._waiting if w[2].submitted < before]
        if old:
            self._waiting = [w for w in self._waiting if w[2].submitted >= before]
            heapq.heapify(self._waiting)
            for seq in old:
                seq.done = True
                del self._by_id[seq.rid]
        return old

    # --- the plan ----------------------------------------------------------------

    def pos(self, s: Seq) -> int:
        """The position ``s``'s next decode step reads (``max_len``: past its end)."""
        return min(s.pos0 + self._plans - s.step0, self.config.max_len)

    def schedule(self, admit: int | None = None) -> Plan:
        """The next step's plan; at most ``admit`` waiting requests start in it
        (None: as many as slots and the prefill budget allow)."""
        cfg = self.config
        origin: dict[int, int] = {}  # id(seq) -> its slot before this plan's moves
        moved: dict[int, Seq] = {}
        move_len = 0

        def place(s: Seq, dst: int) -> None:
            if id(s) not in origin:
                origin[id(s)] = s.slot
                moved[id(s)] = s
            s.slot = dst
            self._holder[dst] = s

        # 1. compact: decoding requests that ended leave holes in 0..B-1
        if self._rows_changed:
            live = [s for s in self._rows if not s.done]
            if len(live) != len(self._rows):
                n = len(live)
                holes = [i for i, s in enumerate(self._rows[:n]) if s.done]
                movers = [s for s in self._rows[n:] if not s.done]
                for hole, s in zip(holes, movers, strict=True):
                    move_len = max(move_len, self.pos(s) + 1)
                    self._take(hole)
                    self._give(s.slot)
                    place(s, hole)
                self._rows = sorted(live, key=lambda s: s.slot)
        # 2. requests whose last chunk was launched join the decode rows at row B
        for s in self._joining:
            target = len(self._rows)
            if s.slot != target:
                other = self._holder.get(target)
                old = s.slot
                move_len = max(move_len, s.prompt_len)
                if other is not None:  # a prefilling (or joining) request: swap
                    move_len = max(move_len, other.prefilled)
                    place(other, old)
                else:
                    del self._holder[old]
                    self._take(target)
                    self._give(old)
                place(s, target)
            s.decoding = True
            s.pos0, s.step0 = s.prompt_len, self._plans
            self._rows.append(s)
            self._rows_changed = True
        self._joining = []
        moves = tuple((origin[k], s.slot) for k, s in moved.items() if origin[k] != s.slot)
        # 3. prefill chunks under the budget: continuing ones first, then admissions
        chunks: list[Chunk] = []
        longest = 0

        def fits(n_rows: int, positions: int) -> bool:
            rb = bucket(n_rows, cfg.row_buckets, cfg.max_prefill_rows)
            tb = bucket(positions, cfg.chunk_buckets, cfg.max_chunk)
            return n_rows <= cfg.max_prefill_rows and (rb * tb <= cfg.prefill_tokens
                                                       or n_rows == 1)

        for s in list(self._prefilling):
            n = min(s.prompt_len - s.prefilled, cfg.max_chunk)
            if not fits(len(chunks) + 1, max(longest, n)):
                break
            chunks.append(self._chunk(s, n))
            longest = max(longest, n)
        while self._waiting and self._free and (admit is None or admit > 0):
            s = self._waiting[0][2]
            n = min(s.prompt_len, cfg.max_chunk)
            if not fits(len(chunks) + 1, max(longest, n)):
                break
            heapq.heappop(self._waiting)
            s.slot = heapq.heappop(self._free)
            self._holder[s.slot] = s
            self._prefilling.append(s)
            chunks.append(self._chunk(s, n))
            longest = max(longest, n)
            if admit is not None:
                admit -= 1
        prefill_tokens = prefill_length = 0
        if chunks:
            tb = bucket(longest, cfg.chunk_buckets, cfg.max_chunk)
            prefill_tokens = bucket(len(chunks), cfg.row_buckets, cfg.max_prefill_rows) * tb
            prefill_length = bucket(max(c.start for c in chunks) + tb, cfg.length_buckets,
                                    cfg.max_len)
        # 4. the decode rows, and how far they attend
        if self._rows_changed:
            self._rows_view = tuple(self._rows)
            self._max_pos = max((self.pos(s) for s in self._rows), default=0)
            self._rows_changed = False
        else:
            self._max_pos = min(self._max_pos + 1, cfg.max_len)
        rows = self._rows_view
        length = bucket(self._max_pos + 1, cfg.length_buckets, cfg.max_len) if rows else 0
        self._plans += 1
        return Plan(moves=moves,
                    move_length=bucket(move_len, cfg.length_buckets, cfg.max_len)
                    if moves else 0,
                    rows=rows, length=length, chunks=tuple(chunks),
                    prefill_tokens=prefill_tokens, prefill_length=prefill_length)

    def _chunk(self, s: Seq, n: int) -> Chunk:
        c = Chunk(seq=s, slot=s.slot, start=s.prefilled, length=n,
                  final=s.prefilled + n == s.prompt_len)
        s.prefilled += n
        if c.final:
            self._prefilling.remove(s)
            self._joining.append(s)
        return c

    def _take(self, slot: int) -> None:
        """``slot`` (free) is taken."""
        self._free.remove(slot)
        heapq.heapify(self._free)

    def _give(self, slot: int) -> None:
        """``slot`` is free again."""
        self._holder.pop(slot, None)
        heapq.heappush(self._free, slot)

    def check(self) -> None:
        """The invariants (for tests): decode rows are slots 0..B-1, every held
        slot has one holder, free and held slots partition the pool."""
        for i, s in enumerate(self._rows):
            assert s.slot == i and s.decoding, (i, s.slot)
        held = set(self._holder)
        assert not held & set(self._free)
        assert held | set(self._free) == set(range(self.config.slots))
        for slot, s in self._holder.items():
            assert s.slot == slot and not s.done


def shapes(cfg: SchedulerConfig) -> Iterable[tuple[int, int]]:
    """Every (rows bucket, chunk bucket) a prefill can have under ``cfg``."""
    for rb in cfg.row_buckets:
        if rb > cfg.max_prefill_rows:
            continue
        for tb in cfg.chunk_buckets:
            if tb <= cfg.max_chunk and (rb * tb <= cfg.prefill_tokens or rb == 1):
                yield rb, tb
