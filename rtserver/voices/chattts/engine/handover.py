"""What the torch engine hands each request, read out of the runner's pinned ring
(numpy only: no torch, no asyncio).

Each step's codes, flags and hidden states land in one entry of a pinned ring
(``runner.py``). A request is handed its steps one by one for its first
``eager_steps`` (the first audio waits on them), then in blocks of ``hold``.
Until then each step stays where it landed, as a (ring entry, row) place held
in numpy arrays indexed by the request's *handle*: a small int it holds from
its first prompt chunk to its end. So a step's decode rows are read back with
a few vector operations, whatever their number, and a turn's hand-overs leave
as one ``Batch`` (one gather out of the ring; the event loop splits it).

A handle given back is given again with a new generation; a row whose
generation is stale (its request ended after the step was launched) is skipped.

**The hidden-state store** (``width > 0``): the runner keeps every step's hidden
state on the device, row ``handle`` column ``step`` of a ``[handles + 2, width]``
grid (flattened: index ``handle * width + step``; row ``handles`` is scratch, for
rows no request reads; row ``handles + 1`` stays zero, for padding). A batch then
carries those flat indices instead of gathered hidden states. A request that
keeps its handle (``give(rid, keep=True)``) holds it until both its engine end
(``take_back``) and its consumer (``release``) are done with it, so the decoder
reads a step that no later request overwrites.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Batch:
    """A turn's hand-overs in one piece: request ``rids[j]`` gets rows
    ``ends[j]:ends[j + 1]`` of ``codes`` (and of ``hidden``)."""

    rids: list[str]
    codes: np.ndarray  # [rows, vq], a fresh gather (never a view of the ring)
    hidden: np.ndarray | None  # [rows, hidden], or [rows] int64 store indices
    ends: list[int]  # len(rids) + 1
    done: frozenset[str]  # requests whose last step this is


class Handover:
    """The held steps of every running request (one thread only)."""

    def __init__(self, handles: int, hold: int, eager_steps: int, width: int = 0) -> None:
        self.gen = np.zeros(handles, dtype=np.int64)  # bumped when a handle is given back
        self.steps = np.zeros(handles, dtype=np.int64)  # steps read back
        self.held = np.zeros(handles, dtype=np.int64)  # places held
        self.ring = np.zeros((handles, hold), dtype=np.int64)
        self.row = np.zeros((handles, hold), dtype=np.int64)
        self.rid: list[str] = [""] * handles
        self._free = list(range(handles - 1, -1, -1))
        self.width = width  # store columns per handle; 0: no store
        self.launched = np.zeros(handles, dtype=np.int64)  # steps launched (store column)
        self.owners = np.zeros(handles, dtype=np.int8)  # engine (1) + consumer (1)
        # request -> the handles its consumers hold, oldest first (an id used again
        # before its last consumer released it holds a second handle)
        self._kept: dict[str, list[int]] = {}
        self.hold = hold
        self.eager = eager_steps
        self._vec: list[np.ndarray] = []  # handles handed steps this turn, in vectors
        self._one: list[tuple[int, bool]] = []  # and one by one: (handle, done)
        self._key: object = None  # the rows ``rows_of`` last saw, and their handles
        self._hg = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))

    @property
    def free(self) -> int:
        """Handles free now (requests that may start)."""
        return len(self._free)

    @property
    def store_rows(self) -> int:
        """Rows of the hidden-state store this layout needs (0: no store): one per
        handle, then the scratch row, then the zero row."""
        return len(self.gen) + 2 if self.width else 0

    @property
    def scratch_index(self) -> int:
        """Where output rows no request reads are written."""
        return len(self.gen) * self.width

    @property
    def zero_index(self) -> int:
        """A store index whose row is never written (zeros: padding)."""
        return (len(self.gen) + 1) * self.width

    @property
    def kept(self) -> int:
        """Handles whose consumer has not released them yet."""
        return sum(map(len, self._kept.values()))

    def give(self, rid: str, *, keep: bool = False) -> tuple[int, int]:
        """A handle for request ``rid``: (handle, generation). ``keep``: its
        consumer reads its store rows and ``release``-s them."""
        h = self._free.pop()
        self.steps[h] = self.held[h] = self.launched[h] = 0
        self.rid[h] = rid
        self.owners[h] = 1
        if keep:
            self.owners[h] = 2
            self._kept.setdefault(rid, []).append(h)
        return h, int(self.gen[h])

    def take_back(self, handle: int, gen: int) -> None:
        """The request holding (``handle``, ``gen``) ended; a second call is a no-op."""
        if handle >= 0 and self.gen[handle] == gen:
            self.gen[handle] += 1
            self._drop_owner(handle)

    def release(self, rid: str) -> None:
        """``rid``'s consumer reads its store rows no more (the oldest, if the id
        holds two); unknown or already released requests (or ones never given a
        handle) are ignored."""
        held = self._kept.get(rid)
        if held:
            self._drop_owner(held.pop(0))
            if not held:
                del self._kept[rid]

    def _drop_owner(self, handle: int) -> None:
        self.owners[handle] -= 1
        if self.owners[handle] == 0:
            self._free.append(handle)

    def store_index(self, out: np.ndarray, rows: np.ndarray, finals: list[tuple[int, int]],
                    p0: int) -> None:
        """Fill ``out`` (one store index per output row of a step about to launch):
        decode row i of handle ``rows[i]`` writes its next step, prefill row
        ``p0 + i`` of each final chunk ``(i, handle)`` its first; every other row
        the scratch row."""
        w = self.width
        out.fill(self.scratch_index)
        b = len(rows)
        if b:
            col = self.launched[rows]
            out[:b] = rows * w + np.minimum(col, w - 1)
            self.launched[rows] = col + 1
        for i, h in finals:
            out[p0 + i] = h * w
            self.launched[h] = 1
    def rows_of(self, key: object, handles: Callable[[], tuple[list[int], list[int]]]
                ) -> tuple[np.ndarray, np.ndarray]:
        """The (handles, generations) of a step's rows, from ``handles()`` when
        ``key`` (the scheduler's rows tuple, replaced when the batch changes) is
        new, else as last time."""
        if key is not self._key:
            self._key = key
            hs, gs = handles()
            self._hg = (np.array(hs, dtype=np.int64), np.array(gs, dtype=np.int64))
        return self._hg

    def read_rows(self, hs: np.ndarray, gs: np.ndarray, ring: int, flags: np.ndarray
                  ) -> list[int]:
        """Hold row i of ring entry ``ring`` for the request of handle ``hs[i]``,
        for every live row whose flag is 0; returns the live rows with a flag
        (ended or failed: the caller reads them with ``hold_one``)."""
        ok = self.gen[hs] == gs
        flagged: list[int] = []
        if flags.any():
            flagged = np.flatnonzero((flags != 0) & ok).tolist()
            ok &= flags == 0
        idx = np.flatnonzero(ok)
        hv = hs[idx]
        k = self.held[hv]
        self.ring[hv, k] = ring
        self.row[hv, k] = idx
        self.held[hv] = k + 1
        st = self.steps[hv] + 1
        self.steps[hv] = st
        emit = hv[(st <= self.eager) | (k + 1 >= self.hold)]
        if len(emit):
            self._vec.append(emit)
        return flagged

    def hold_one(self, handle: int, ring: int, row: int, done: bool) -> None:
        """Hold one step (a prompt's first step, or a flagged decode row)."""
        k = int(self.held[handle])
        self.ring[handle, k], self.row[handle, k] = ring, row
        self.held[handle] = k + 1
        self.steps[handle] += 1
        if done or self.steps[handle] <= self.eager or k + 1 >= self.hold:
            self._one.append((handle, done))

    def flush(self, ring_codes: np.ndarray, ring_hidden: np.ndarray | None) -> Batch | None:
        """This turn's hand-overs: one gather out of ``ring_codes`` ``[ring, rows,
        vq (+ flags)]`` and ``ring_hidden`` ``[ring, rows, hidden]`` (None: no
        hidden states; ignored with a store: its indices instead), or None if
        nobody is handed anything."""
        if not self._vec and not self._one:
            return None
        e = np.concatenate([*self._vec, np.array([h for h, _ in self._one], dtype=np.int64)])
        n = self.held[e]
        mask = np.arange(self.hold)[None, :] < n[:, None]
        rings, rows = self.ring[e][mask], self.row[e][mask]
        ends = np.zeros(len(e) + 1, dtype=np.int64)
        np.cumsum(n, out=ends[1:])
        vq = ring_codes.shape[-1] - 1
        # one flat index into the ring's (entry, row) pairs: np.take of whole rows
        # gathers ~1.8x faster than 2-D fancy indexing (256 rows of 768 floats)
        flat = rings * ring_codes.shape[1] + rows
        hidden = None
        if self.width:  # the store: each held step's index
            first = np.repeat(e * self.width + self.steps[e] - n, n)
            hidden = first + np.arange(len(rings)) - np.repeat(ends[:-1], n)
        elif ring_hidden is not None:
            hidden = np.take(ring_hidden.reshape(-1, ring_hidden.shape[-1]), flat, axis=0)
        batch = Batch(rids=list(map(self.rid.__getitem__, e.tolist())),
                      codes=np.take(ring_codes.reshape(-1, vq + 1), flat, axis=0)[:, :vq],
                      hidden=hidden,
                      ends=ends.tolist(),
                      done=frozenset(self.rid[h] for h, d in self._one if d))
        self.held[e] = 0
        self._vec.clear()
        self._one.clear()
        return batch
