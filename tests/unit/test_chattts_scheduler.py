"""The torch engine's scheduler, without torch: admission, priorities, the
prefill budget, the slot pool and compaction, against a simulated device."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from rtserver.voices.chattts.engine.scheduler import (
    Plan,
    Scheduler,
    SchedulerConfig,
    Seq,
    bucket,
    shapes,
)


def make(slots: int = 4, max_len: int = 256, **kw: object) -> Scheduler:
    return Scheduler(SchedulerConfig(slots=slots, max_len=max_len, **kw))  # type: ignore[arg-type]


class Device:
    """What the runner would hold: each slot's owner (by id) and how many prompt
    positions of it are written; moves are one parallel assignment."""

    def __init__(self, slots: int) -> None:
        self.owner: list[str | None] = [None] * slots
        self.written: list[int] = [0] * slots

    def run(self, plan: Plan) -> None:
        owner, written = list(self.owner), list(self.written)
        for src, dst in plan.moves:  # every source read before any destination written
            self.owner[dst], self.written[dst] = owner[src], written[src]
        for ch in plan.chunks:
            if ch.start == 0:
                self.owner[ch.slot], self.written[ch.slot] = ch.seq.rid, 0
            assert self.owner[ch.slot] == ch.seq.rid
            assert self.written[ch.slot] == ch.start  # chunks arrive in order
            self.written[ch.slot] += ch.length


def test_the_scheduler_imports_no_torch() -> None:
    code = ("import sys, rtserver.voices.chattts.engine.scheduler; "
            "assert 'torch' not in sys.modules and 'asyncio' not in sys.modules, "
            "sorted(m for m in sys.modules if m in ('torch', 'asyncio'))")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_first_segments_go_first() -> None:
    """With one free slot, a first segment (priority 0) is admitted before a
    later segment (priority 1) that arrived earlier; the later one waits."""
    s = make(slots=1)
    s.add(Seq("later", 10, priority=1))
    s.add(Seq("first", 10, priority=0))
    plan = s.schedule()
    assert [c.seq.rid for c in plan.chunks] == ["first"]
    assert s.waiting == 1 and s.running == 1


def test_prefill_is_chunked_under_the_budget() -> None:
    """A long prompt goes in chunks of ``max_chunk``, continuing before new
    admissions; no plan carries more padded positions than the budget; decode
    rows run beside the chunks."""
    s = make(slots=8, max_len=1024, prefill_tokens=128, max_chunk=64, max_prefill_rows=4,
             chunk_buckets=(16, 32, 64), row_buckets=(1, 2, 4))
    dev = Device(8)
    s.add(Seq("short", 10))
    plan = s.schedule()
    dev.run(plan)
    assert [(c.seq.rid, c.start, c.length, c.final) for c in plan.chunks] == [
        ("short", 0, 10, True)]
    s.add(Seq("long", 150))
    for i in range(6):
        s.add(Seq(f"w{i}", 12))
    seen: list[tuple[str, int, int]] = []
    for _ in range(8):
        plan = s.schedule()
        dev.run(plan)
        s.check()
        assert plan.prefill_tokens <= 128
        assert [r.rid for r in plan.rows][:1] == ["short"]  # decoding all along
        seen += [(c.seq.rid, c.start, c.length) for c in plan.chunks]
    long = [x for x in seen if x[0] == "long"]
    assert long == [("long", 0, 64), ("long", 64, 64), ("long", 128, 22)]
    assert {x[0] for x in seen} == {"long", *(f"w{i}" for i in range(6))}
    assert s.decoding == 8 and s.waiting == 0
    for i, seq in enumerate(s._rows):
        assert dev.owner[i] == seq.rid and dev.written[i] == seq.prompt_len


def test_rows_stay_compact_under_random_traffic() -> None:
    """Whatever arrives and ends, the decoding requests are exactly slots 0..B-1,
    each in the slot its data was moved to, and a step never runs more rows than
    are decoding; ends are seen one step late (async scheduling)."""
    rng = random.Random(7)
    slots = 12
    s = make(slots=slots, max_len=512, prefill_tokens=256, max_chunk=32,
             max_prefill_rows=4, chunk_buckets=(8, 16, 32), row_buckets=(1, 2, 4))
    dev = Device(slots)
    n = 0
    last: Plan | None = None
    moved = 0
    for _ in range(600):
        for _ in range(rng.choice((0, 0, 1, 2, 3))):
            s.add(Seq(f"r{n}", rng.randint(1, 90), priority=rng.randint(0, 1)))
            n += 1
        if last is not None:  # the step before: some decoding rows ended
            for seq in last.rows:
                if not seq.done and rng.random() < 0.08:
                    s.finish(seq)
        if rng.random() < 0.05 and s.running:  # an abort, whatever its state
            victim = rng.choice(list(s._holder.values()))
            assert s.abort(victim.rid) is victim
        plan = s.schedule()
        moved += len(plan.moves)
        dsts = [d for _, d in plan.moves]
        assert len(set(dsts)) == len(dsts)
        dev.run(plan)
        s.check()
        assert len(plan.rows) == s.decoding <= slots
        for i, seq in enumerate(plan.rows):
            assert seq.slot == i and dev.owner[i] == seq.rid
            assert dev.written[i] == seq.prompt_len
        for seq in s._prefilling:
            assert dev.owner[seq.slot] == seq.rid and dev.written[seq.slot] == seq.prefilled
        if plan.rows:
            assert plan.length >= max(s.pos(q) for q in plan.rows)  # pos advanced already
        last = plan
    assert moved > 50 and n > 400


def test_moves_copy_what_the_cache_holds() -> None:
    """A move copies at least the positions its request has written."""
    s = make(slots=3, max_len=512, length_buckets=(128, 256, 512))
    for rid in ("a", "b", "c"):
        s.add(Seq(rid, 20))
    s.schedule()
    for _ in range(200):
        s.schedule()
    a = s._rows[0]
    s.finish(a)
    plan = s.schedule()
    assert plan.moves == ((2, 0),)
    c = s._rows[0]
    assert c.rid == "c" and plan.move_length >= s.pos(c)  # positions 0..pos-1
    assert plan.move_length == 256


def test_expire_and_abort_while_waiting() -> None:
    s = make(slots=1)
    s.add(Seq("run", 5, submitted=0.0))
    s.schedule()
    s.add(Seq("old", 5, submitted=1.0))
    s.add(Seq("new", 5, submitted=5.0))
    s.add(Seq("gone", 5, submitted=5.0))
    assert s.abort("gone") is not None and s.waiting == 2
    assert [q.rid for q in s.expire(before=3.0)] == ["old"]
    assert s.waiting == 1 and s.get("old") is None
    with pytest.raises(ValueError, match="does not fit"):
        s.add(Seq("huge", 256))


def test_buckets_and_shapes() -> None:
    assert bucket(3, (1, 2, 4), 8) == 4 and bucket(9, (1, 2, 4), 8) == 8
    assert bucket(300, (128, 256, 512), 400) == 400
    cfg = SchedulerConfig(slots=4, max_len=256, prefill_tokens=128, max_chunk=64,
                          max_prefill_rows=4, chunk_buckets=(32, 64), row_buckets=(1, 2, 4))
    assert list(shapes(cfg)) == [(1, 32), (1, 64), (2, 32), (2, 64), (4, 32)]
