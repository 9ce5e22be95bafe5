"""The torch engine's hand-over bookkeeping, without torch: which steps each
request is handed when, out of a simulated pinned ring."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from rtserver.voices.chattts.engine.handover import Handover

VQ = 4


def ring_with(depth: int, rows: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    codes = np.zeros((depth, rows, VQ + 1), dtype=np.int32)
    codes[..., :VQ] = rng.integers(0, 626, (depth, rows, VQ))
    return codes, rng.standard_normal((depth, rows, 8)).astype(np.float32)


def test_the_handover_imports_no_torch() -> None:
    code = ("import sys, rtserver.voices.chattts.engine.handover; "
            "assert 'torch' not in sys.modules and 'asyncio' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_steps_are_handed_eagerly_then_in_blocks() -> None:
    """Two requests decoding side by side (rows swap places halfway): each is
    handed its first 3 steps one by one, then blocks of 4, every step exactly
    once and in order, as copies of what the ring held."""
    rng = np.random.default_rng(0)
    depth = 7
    ho = Handover(handles=4, hold=4, eager_steps=3)
    a, b = ho.give("a"), ho.give("b")
    got: dict[str, list[np.ndarray]] = {"a": [], "b": []}
    sizes: dict[str, list[int]] = {"a": [], "b": []}
    sent: dict[str, list[np.ndarray]] = {"a": [], "b": []}
    order = (a, b)
    codes, hidden = ring_with(depth, 2, rng)
    for step in range(15):
        r = step % depth
        fresh, fresh_h = ring_with(1, 2, rng)  # this step lands in entry r
        codes[r], hidden[r] = fresh[0], fresh_h[0]
        if step == 8:
            order = (b, a)  # compaction moved them
        rows = ("a", "b") if order[0] is a else ("b", "a")
        for i, rid in enumerate(rows):
            sent[rid].append(codes[r, i, :VQ].copy())
        flagged = ho.read_rows(np.array([order[0][0], order[1][0]]),
                               np.array([order[0][1], order[1][1]]), r, codes[r, :2, VQ])
        assert flagged == []
        batch = ho.flush(codes, hidden)
        if batch is None:
            continue
        assert not np.shares_memory(batch.codes, codes)
        assert batch.hidden is not None and not np.shares_memory(batch.hidden, hidden)
        for j, rid in enumerate(batch.rids):
            part = batch.codes[batch.ends[j]:batch.ends[j + 1]]
            got[rid].extend(part)
            sizes[rid].append(len(part))
    for rid in ("a", "b"):
        assert sizes[rid] == [1, 1, 1, 4, 4, 4]
        np.testing.assert_array_equal(np.array(got[rid]), np.array(sent[rid][:15]))


def test_a_flagged_row_and_a_stale_generation() -> None:
    """A row with a flag is returned to the caller (who holds it with its end);
    a row of a request that ended since the step was launched is skipped, also
    after its handle is given to a new request."""
    rng = np.random.default_rng(1)
    ho = Handover(handles=2, hold=4, eager_steps=0)
    a, b = ho.give("a"), ho.give("b")
    codes, _ = ring_with(4, 2, rng)
    codes[0, 1, VQ] = 1  # b's step ended it
    hs, gs = np.array([a[0], b[0]]), np.array([a[1], b[1]])
    assert ho.read_rows(hs, gs, 0, codes[0, :2, VQ]) == [1]
    ho.hold_one(b[0], 0, 1, done=True)
    batch = ho.flush(codes, None)
    assert batch is not None and batch.rids == ["b"] and batch.done == frozenset({"b"})
    assert batch.hidden is None
    ho.take_back(*b)
    c = ho.give("c")
    assert c[0] == b[0] and c[1] != b[1]
    codes[1, :2, VQ] = 0
    ho.read_rows(hs, gs, 1, codes[1, :2, VQ])  # the step after b's end: b's row is stale
    assert ho.held[c[0]] == 0 and ho.held[a[0]] == 2


def test_a_kept_handle_is_free_only_after_its_end_and_its_release() -> None:
    """With a store, a handle comes back once both the request ended and its
    consumer released it, in either order; an id used again before its first
    consumer released holds a second handle, and releases go oldest first."""
    ho = Handover(handles=3, hold=2, eager_steps=1, width=10)
    a = ho.give("a", keep=True)
    ho.take_back(*a)
    assert ho.free == 2 and ho.kept == 1  # ended, still read by its consumer
    ho.release("a")
    assert ho.free == 3 and ho.kept == 0
    ho.release("a")  # twice: nothing
    assert ho.free == 3
    b1 = ho.give("b", keep=True)
    ho.release("b")  # released first, ends later
    assert ho.free == 2
    b2 = ho.give("b", keep=True)  # the same id again, the first still running
    assert b2[0] != b1[0]
    ho.take_back(*b1)
    assert ho.free == 2 and ho.kept == 1  # b1 free now, b2 held
    ho.take_back(*b2)
    ho.release("b")
    assert ho.free == 3 and ho.kept == 0
    plain = ho.give("c")  # no consumer hold: free at its end
    ho.take_back(*plain)
    assert ho.free == 3


def test_store_indices_follow_each_handles_steps() -> None:
    """Decode rows write their next step's column, a prompt's final chunk its
    step 0, every other output row the scratch row; a batch hands over the
    indices of the steps it holds, in order."""
    w = 10
    ho = Handover(handles=4, hold=2, eager_steps=1, width=w)
    a, b = ho.give("a", keep=True), ho.give("b", keep=True)
    out = np.zeros(8, dtype=np.int64)  # decode rows 0..3, prefill rows 4..7
    ho.store_index(out, np.zeros(0, dtype=np.int64), [(0, a[0]), (1, b[0])], p0=4)
    scratch = 4 * w
    assert out.tolist() == [scratch] * 4 + [a[0] * w, b[0] * w, scratch, scratch]
    ho.hold_one(a[0], 0, 4, False)
    ho.hold_one(b[0], 0, 5, False)
    batch = ho.flush(np.zeros((3, 8, VQ + 1), dtype=np.int32), None)
    assert batch is not None and batch.hidden is not None
    assert batch.hidden.tolist() == [a[0] * w, b[0] * w]
    hs, gs = np.array([b[0], a[0]]), np.array([b[1], a[1]])
    for step in (1, 2):
        ho.store_index(out, hs, [], p0=4)
        assert out[:2].tolist() == [b[0] * w + step, a[0] * w + step]
        ho.read_rows(hs, gs, step, np.zeros(2, dtype=np.int32))
    batch = ho.flush(np.zeros((3, 8, VQ + 1), dtype=np.int32), None)
    assert batch is not None and batch.hidden is not None
    got = {rid: batch.hidden[batch.ends[j]:batch.ends[j + 1]].tolist()
           for j, rid in enumerate(batch.rids)}
    assert got == {"a": [a[0] * w + 1, a[0] * w + 2], "b": [b[0] * w + 1, b[0] * w + 2]}
