"""The GPU worker's seam without a model: a ``WorkerServer`` serving fake
voices on an ipc socket and a front end's ``WorkerLink`` / ``RemoteVoice`` in
the same loop, over real ZMQ sockets."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import msgspec
import numpy as np
import pytest

from rtserver.audio.pcm import PcmChunk
from rtserver.clock import ManualClock
from rtserver.config import ConfigError, GpuConfig, load_config
from rtserver.errors import (
    Busy,
    EngineDead,
    EngineFailed,
    EngineLost,
    EngineUnavailable,
    Overloaded,
    UnknownVoice,
)
from rtserver.logs import current_request_id, request_scope
from rtserver.server.state import AppState
from rtserver.voices import registry
from rtserver.voices.base import MODEL_OUTPUT_MARK, Marks, SynthesisRequest, VoiceInfo
from rtserver.voices.registry import FamilyVoices, VoiceFamily, register_family
from rtserver.worker import messages as m
from rtserver.worker.metrics import WorkerCollector
from rtserver.worker.placement import capacity_of, split_specs
from rtserver.worker.proc import ENGINE_DEAD_EXIT, WorkerServer
from rtserver.worker.remote import RemoteVoice, WorkerLink, load_server_voices

RATE = 24000
CHUNK = RATE // 10  # 100 ms
CONFIG = GpuConfig(heartbeat_s=0.05, timeout_s=1.0, request_buffer_s=1.0)
# silence would take a minute to count: what a test sees sooner came another way
DEAF = GpuConfig(heartbeat_s=0.05, timeout_s=60.0, request_buffer_s=1.0)


class FakeVoice:
    """``chunks`` chunks of 100 ms whose first sample is the chunk's index;
    ``hang``: one chunk, then waits until cancelled; ``hold``: the first
    chunk waits for it (a request queued for its first output); ``linger``:
    after its chunks, waits until cancelled. Counts what is open."""

    def __init__(self, name: str, *, chunks: int = 5, hang: bool = False,
                 die: bool = False, pause_s: float = 0.0,
                 hold: asyncio.Event | None = None, linger: bool = False) -> None:
        self._info = VoiceInfo(name=name, family="fake", sample_rate=RATE, chunk_plan_ms=(100.0,))
        self.chunks, self.hang, self.die, self.pause_s = chunks, hang, die, pause_s
        self.hold, self.linger = hold, linger
        self.open = 0
        self.cancelled = 0
        self.requests: list[SynthesisRequest] = []
        self.log_ids: list[str | None] = []  # the request id its log lines would carry

    @property
    def info(self) -> VoiceInfo:
        return self._info

    async def warm_up(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def synthesize(self, request: SynthesisRequest) -> AsyncIterator[PcmChunk]:
        self.open += 1
        self.requests.append(request)
        self.log_ids.append(current_request_id())
        try:
            if self.hold is not None:
                await self.hold.wait()
            for i in range(self.chunks):
                if request.marks is not None:
                    request.marks.mark(MODEL_OUTPUT_MARK)
                samples = np.zeros(CHUNK, np.float32)
                samples[0] = i
                yield PcmChunk(samples, RATE)
                if self.die:
                    raise EngineDead("the engine thread crashed")
                if self.hang:
                    await asyncio.Event().wait()
                await asyncio.sleep(self.pause_s)
            if self.linger:
                await asyncio.Event().wait()
        except (asyncio.CancelledError, GeneratorExit):
            self.cancelled += 1
            raise
        finally:
            self.open -= 1


async def until(cond: Callable[[], bool], within: float = 5.0) -> None:
    """Wait until ``cond()`` holds (polling an observable state)."""
    deadline = asyncio.get_running_loop().time() + within
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.01)


class Rig:
    def __init__(self, tmp: Path, voices: list[FakeVoice], capacity: int = 0,
                 config: GpuConfig = CONFIG, send_hwm: int = 120_000) -> None:
        self.endpoint = f"ipc://{tmp}/w.sock"
        self.voices = voices
        self.capacity = capacity
        self.config = config
        self.send_hwm = send_hwm
        self.stop = asyncio.Event()
        self.server: WorkerServer | None = None
        self.task: asyncio.Task[int] | None = None

    def start_worker(self) -> None:
        self.stop = asyncio.Event()
        self.server = WorkerServer({v.info.name: v for v in self.voices},
                                   by_spec={v.info.name: v.info.name for v in self.voices},
                                   default=self.voices[0].info.name,
                                   capacity={"fake": self.capacity}, config=self.config,
                                   send_hwm=self.send_hwm)
        self.task = asyncio.create_task(self.server.serve(self.endpoint, self.stop))

    async def stop_worker(self) -> None:
        assert self.task is not None
        self.stop.set()
        assert await self.task == 0


@contextlib.asynccontextmanager
async def rig(tmp: Path, voices: list[FakeVoice], capacity: int = 0,
              worker: GpuConfig = CONFIG, link: GpuConfig = CONFIG, send_hwm: int = 120_000
              ) -> AsyncIterator[tuple[Rig, WorkerLink, dict[str, RemoteVoice]]]:
    r = Rig(tmp, voices, capacity, worker, send_hwm)
    r.start_worker()
    front = WorkerLink(r.endpoint, link)
    try:
        ready = await asyncio.wait_for(front.start(), 10)
        remote = {e.name: RemoteVoice(front, VoiceInfo(**msgspec.structs.asdict(e)))
                  for e in ready.voices}
        yield r, front, remote
    finally:
        await front.close()
        if r.task is not None and not r.task.done():
            await r.stop_worker()


def request(rid: str, *, first: bool = True, marks: Marks | None = None,
            clock: ManualClock | None = None) -> SynthesisRequest:
    if clock is None:
        return SynthesisRequest(text="hello", request_id=rid, first=first, marks=marks)
    return SynthesisRequest(text="hello", request_id=rid, first=first, marks=marks, clock=clock,
                            deadline=clock.now() + 2.0)


def test_messages_round_trip_and_refuse_garbage() -> None:
    msg = m.Synthesize(request_id="a-1", voice="chattts:alice", text="Hi.", first=True,
                       deadline=12.5, want_marks=True)
    assert m.decode_down(m.encode(msg)) == msg
    up = m.Failed(request_id="a-1", code="overloaded", message="full", retry_after_ms=250)
    assert m.decode_up(m.encode(up)) == up
    with pytest.raises(msgspec.DecodeError):
        m.decode_down(m.encode(up))  # an up message is not a down one


async def test_audio_in_order_with_the_info_and_the_mark(tmp_path: Path) -> None:
    """Chunks arrive whole and in order; the info is the worker's; the model
    output mark comes back on the front end's own clock."""
    voice = FakeVoice("fake:a")
    async with rig(tmp_path, [voice]) as (_, _, remote):
        rv = remote["fake:a"]
        assert rv.info == voice.info
        clock = ManualClock(1000.0)
        marks = Marks(clock)
        got = [c async for c in rv.synthesize(request("r1", marks=marks, clock=clock))]
    assert [int(c.samples[0]) for c in got] == [0, 1, 2, 3, 4]
    assert all(len(c.samples) == CHUNK and c.sample_rate == RATE for c in got)
    # the worker saw a deadline 2 s ahead on its clock; the mark is near the
    # front end's clock (1000 s), not the worker's monotonic time
    seen = voice.requests[0]
    assert seen.deadline is not None and 1.5 < seen.deadline - seen.clock.now() <= 2.0
    assert abs(marks[MODEL_OUTPUT_MARK] - 1000.0) < 1.0


async def test_the_front_end_measures_each_chunks_delay(tmp_path: Path) -> None:
    """Every chunk's time from the worker's send to the reader is observed."""
    from prometheus_client import CollectorRegistry, generate_latest

    from rtserver.worker.remote import LinkCollector

    async with rig(tmp_path, [FakeVoice("fake:a")]) as (_, link, remote):
        got = [c async for c in remote["fake:a"].synthesize(request("r1"))]
        reg = CollectorRegistry()
        reg.register(LinkCollector(link))
        body = generate_latest(reg).decode()
    assert len(got) == 5
    assert "rtserver_gpu_worker_chunk_delay_seconds_count 5.0" in body
    assert "rtserver_gpu_worker_up 1.0" in body


async def test_cancel_reaches_the_voice_and_frees_the_request(tmp_path: Path) -> None:
    voice = FakeVoice("fake:a", hang=True)
    async with rig(tmp_path, [voice]) as (r, link, remote):
        gen = remote["fake:a"].synthesize(request("r1"))
        await gen.__anext__()
        assert voice.open == 1
        await until(lambda: link.active("fake") == 1)  # the worker's published load
        await gen.aclose()  # the core stops early: Cancel goes down
        await until(lambda: voice.open == 0)
        assert voice.cancelled == 1
        await until(lambda: link.active("fake") == 0)
        assert r.server is not None and not r.server.active["fake"]


async def test_capacity_refuses_new_contexts_in_the_worker_and_the_gate(tmp_path: Path) -> None:
    voice = FakeVoice("fake:a", hang=True)
    async with rig(tmp_path, [voice], capacity=1) as (_, link, remote):
        rv = remote["fake:a"]
        held = rv.synthesize(request("r1"))
        await held.__anext__()
        # the worker refuses a second context's first segment over its capacity
        with pytest.raises(Busy) as exc:
            await rv.synthesize(request("r2")).__anext__()
        assert exc.value.retry_after_ms
        await until(lambda: link.active("fake") == 1)
        with pytest.raises(Busy):  # and the front end's admission knows it
            rv.admit("ctx")
        await held.aclose()
        await until(lambda: link.active("fake") == 0)
        rv.admit("ctx")


async def test_unknown_voice_is_unknown_voice(tmp_path: Path) -> None:
    async with rig(tmp_path, [FakeVoice("fake:a")]) as (_, link, _):
        ghost = RemoteVoice(link, VoiceInfo(name="fake:ghost", family="fake", sample_rate=RATE))
        with pytest.raises(UnknownVoice):
            await ghost.synthesize(request("r1")).__anext__()


async def test_a_front_end_that_goes_away_loses_its_requests(tmp_path: Path) -> None:
    voice = FakeVoice("fake:a", hang=True)
    async with rig(tmp_path, [voice]) as (r, _, _):
        other = WorkerLink(r.endpoint, CONFIG)
        ready = await asyncio.wait_for(other.start(), 10)
        rv = RemoteVoice(other, VoiceInfo(**msgspec.structs.asdict(ready.voices[0])))
        gen = rv.synthesize(request("r1"))
        await gen.__anext__()
        assert voice.open == 1
        # the front end's socket closes without a Cancel (its process died)
        other._sock.close(linger=0)
        await until(lambda: voice.open == 0)
        assert voice.cancelled == 1
        await other.close()


async def test_a_silent_front_end_is_dropped_and_told(tmp_path: Path) -> None:
    """A front end whose heartbeat stops (a stalled process) loses its
    requests in the worker, and is told so if it is still there, rather than
    waiting for ever."""
    voice = FakeVoice("fake:a", hang=True)
    async with rig(tmp_path, [voice], link=DEAF) as (_, link, remote):
        link._tasks[1].cancel()  # the heartbeat task: the worker hears nothing more
        gen = remote["fake:a"].synthesize(request("r1"))
        await gen.__anext__()
        with pytest.raises(EngineFailed, match="dropped"):
            await asyncio.wait_for(gen.__anext__(), 10)
        assert voice.open == 0 and voice.cancelled == 1


async def test_a_front_end_gone_mid_stream_is_seen_at_the_next_chunk(tmp_path: Path) -> None:
    """A send to a vanished front end fails (ROUTER_MANDATORY): its requests
    are cancelled then, not after the silence timeout (a minute here)."""
    voice = FakeVoice("fake:a", chunks=1000, pause_s=0.02)
    async with rig(tmp_path, [voice], worker=DEAF) as (r, _, _):
        other = WorkerLink(r.endpoint, CONFIG)
        ready = await asyncio.wait_for(other.start(), 10)
        rv = RemoteVoice(other, VoiceInfo(**msgspec.structs.asdict(ready.voices[0])))
        gen = rv.synthesize(request("r1"))
        await gen.__anext__()
        other._sock.close(linger=0)
        await until(lambda: voice.open == 0)
        assert voice.cancelled == 1
        await other.close()


async def test_a_consumer_that_does_not_take_its_audio_fails_overloaded(tmp_path: Path) -> None:
    voice = FakeVoice("fake:a", chunks=40, linger=True)  # 4 s, past the 1 s bound
    async with rig(tmp_path, [voice]) as (_, link, remote):
        gen = remote["fake:a"].synthesize(request("r1"))
        await gen.__anext__()
        # the worker sent all 40 without waiting for us; the front end, holding
        # more than 1 s not taken, cancelled the request there
        await until(lambda: voice.cancelled == 1)
        with pytest.raises(Overloaded):
            async for _ in gen:
                pass
        assert link.up  # one request failed; the worker is fine


async def test_a_front_end_that_stops_reading_never_stalls_the_worker(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Its queue fills (SNDHWM): that request fails in the worker, which
    serves another front end meanwhile. (The stalled link neither bounds its
    buffer nor times the worker out here: only the worker's side acts.)"""
    flood = FakeVoice("fake:flood", chunks=5000)  # 500 s of audio, 48 MB
    calm = FakeVoice("fake:calm", chunks=5, pause_s=0.01)
    patient = GpuConfig(heartbeat_s=0.05, timeout_s=60.0, request_buffer_s=1e6)
    async with rig(tmp_path, [flood, calm], link=patient, send_hwm=16) as (r, stalled, remote):
        other = WorkerLink(r.endpoint, CONFIG)
        ready = await asyncio.wait_for(other.start(), 10)
        mine = RemoteVoice(other, VoiceInfo(**msgspec.structs.asdict(ready.voices[1])))
        gen = remote["fake:flood"].synthesize(request("r1"))
        await gen.__anext__()
        stalled._tasks[0].cancel()  # its reader stops: nothing more is taken
        await until(lambda: flood.open == 0, within=30)
        assert flood.cancelled == 1  # stopped early, not run to its end
        assert "does not keep up" in caplog.text
        assert len([c async for c in mine.synthesize(request("r2"))]) == 5
        await other.close()


async def test_worker_lost_fails_requests_then_comes_back(tmp_path: Path) -> None:
    """Seen through the socket's disconnect (the link would wait a minute of
    silence), as when the worker's process is killed."""
    voice = FakeVoice("fake:a", hang=True)
    async with rig(tmp_path, [voice], link=DEAF) as (r, link, remote):
        rv = remote["fake:a"]
        epoch = link.ready.epoch if link.ready else ""
        gen = rv.synthesize(request("r1"))
        await gen.__anext__()
        await r.stop_worker()  # its socket closes, as when the process dies
        with pytest.raises(EngineLost):
            await asyncio.wait_for(gen.__anext__(), 5)
        assert rv.down() is not None
        with pytest.raises(EngineUnavailable):
            rv.admit("ctx")
        with pytest.raises(EngineLost):
            await rv.synthesize(request("r2")).__anext__()
        voice.hang = False
        r.start_worker()  # the supervisor's restart
        await until(lambda: rv.down() is None)
        assert link.ready is not None and link.ready.epoch != epoch
        got = [c async for c in rv.synthesize(request("r3"))]
        assert len(got) == 5


def test_load_tells_the_starts_and_an_older_workers_load_still_reads() -> None:
    load = m.Load(epoch="e", active={"fake": 3}, capacity={"fake": 8},
                  starting={"fake": 2}, starting_yours={"fake": 1}, rtf={"fake": 0.3})
    assert m.decode_up(m.encode(load)) == load

    class OlderLoad(msgspec.Struct, frozen=True, kw_only=True, tag="load"):
        epoch: str
        active: dict[str, int]
        capacity: dict[str, int]

    old = m.decode_up(m.encode(OlderLoad(epoch="e", active={"fake": 3}, capacity={"fake": 8})))
    assert isinstance(old, m.Load) and old.starting == {} and old.starting_yours == {}
    assert old.rtf == {}  # an older worker's: no r, the front end plans with its own
    # and an older front end reads a newer worker's Load (unknown fields ignored)
    assert msgspec.msgpack.decode(m.encode(load), type=OlderLoad).active == {"fake": 3}


# Pings once a second: what a link learns within half of that, the worker
# pushed (three times in a row below; a ping's answer would be late for some).
QUIET = GpuConfig(heartbeat_s=1.0, timeout_s=60.0, request_buffer_s=1.0)


async def test_every_front_end_hears_of_the_starts_queued_in_the_worker(tmp_path: Path) -> None:
    """First segments waiting in the worker for their first output, sent by
    one front end, reach every front end at once (pushed, not at the next
    ping): the others count them as starting elsewhere, the sender does not
    count its own twice; later segments are not starts; the first output
    ends a start."""
    hold = asyncio.Event()
    voice = FakeVoice("fake:a", hold=hold)
    async with rig(tmp_path, [voice], worker=QUIET, link=QUIET) as (r, a, remote):
        b = WorkerLink(r.endpoint, QUIET)
        ready = await asyncio.wait_for(b.start(), 10)
        on_b = RemoteVoice(b, VoiceInfo(**msgspec.structs.asdict(ready.voices[0])))
        on_a = remote["fake:a"]
        gens = [on_a.synthesize(request(f"a{i}")) for i in range(3)]
        gens.append(on_a.synthesize(request("a-later", first=False)))
        pending = [asyncio.create_task(g.__anext__()) for g in gens]
        await until(lambda: on_b.starting_elsewhere() == 3, within=0.5)
        assert b.starting("fake") == 3 and a.starting("fake") == 3
        assert on_a.starting_elsewhere() == 0  # its own: its core counts them
        pending.append(asyncio.create_task(on_b.synthesize(request("b0")).__anext__()))
        await until(lambda: on_a.starting_elsewhere() == 1 and b.starting("fake") == 4,
                    within=0.5)
        assert on_b.starting_elsewhere() == 3
        hold.set()  # first output for all: no start is left
        await asyncio.gather(*pending)
        await until(lambda: a.starting("fake") == 0 and b.starting("fake") == 0, within=0.5)
        assert on_a.starting_elsewhere() == on_b.starting_elsewhere() == 0
        assert r.server is not None and r.server.starting == {"fake": 0}
        for gen in gens:
            await gen.aclose()
        await b.close()


async def test_every_front_end_hears_the_r_of_the_requests_completed_in_the_worker(
        tmp_path: Path) -> None:
    """The worker measures each completed request's r (generation time /
    audio time) and every front end hears it with the next ``Load``: one that
    sent nothing yet can plan with it. A cancelled request is not a
    measurement."""
    hang = FakeVoice("fake:hang", hang=True)
    slow = FakeVoice("fake:slow", chunks=5, pause_s=0.04)  # 0.5 s of audio in >= 0.2 s
    async with rig(tmp_path, [slow, hang]) as (r, a, remote):
        b = WorkerLink(r.endpoint, CONFIG)
        ready = await asyncio.wait_for(b.start(), 10)
        on_b = RemoteVoice(b, VoiceInfo(**msgspec.structs.asdict(ready.voices[0])))
        async with contextlib.aclosing(remote["fake:hang"].synthesize(request("h"))) as gen:
            await gen.__anext__()
        await until(lambda: r.server is not None and r.server.active["fake"] == 0)
        seen = a.load
        await until(lambda: a.load is not seen)  # a Load sent after the cancel
        assert on_b.rtf_elsewhere() is None and a.rtf("fake") is None
        got = [c async for c in remote["fake:slow"].synthesize(request("s"))]
        assert len(got) == 5
        await until(lambda: on_b.rtf_elsewhere() is not None)
        rtf = on_b.rtf_elsewhere()
        assert rtf is not None and 0.4 <= rtf < 5.0  # five 40 ms pauses for 0.5 s
        await until(lambda: a.rtf("fake") is not None)  # the same Load, on a's socket
        assert a.rtf("fake") == rtf
        gauge = next(f for f in WorkerCollector(r.server).collect()
                     if f.name == "rtserver_gpu_worker_rtf")
        assert [(s.labels, s.value) for s in gauge.samples] == [({"family": "fake"}, rtf)]
        # b's server plans its hints with it (it has measured nothing itself)
        state = AppState(config=load_config(env={}, flags={}), voices={"fake:slow": on_b},
                         default_voice="fake:slow")
        stats = state.core.stats_for("fake:slow")
        assert stats.measured and stats.rtf.count == 0
        assert stats.rtf_estimate(0.9, time.monotonic()) == rtf
        await b.close()


async def test_a_request_cancelled_before_it_ran_frees_its_slot(tmp_path: Path) -> None:
    """A ``Cancel`` read in the same batch as its ``Synthesize`` cancels a task
    that never ran: its slot and its start are still given back."""
    voice = FakeVoice("fake:a")
    async with rig(tmp_path, [voice]) as (r, link, remote):
        for i in range(4):  # each sent and cancelled at once
            with link.request(m.Synthesize(request_id=f"r{i}", voice="fake:a", text="hi",
                                           first=True)):
                pass
        # read after them: the worker has handled the four
        assert len([c async for c in remote["fake:a"].synthesize(request("last"))]) == 5
        assert r.server is not None
        await until(lambda: r.server is not None and r.server.active["fake"] == 0)
        assert r.server.starting["fake"] == 0
        await until(lambda: link.active("fake") == 0 and link.starting("fake") == 0)


async def test_a_cancelled_request_gives_its_slot_back_before_the_next_start(
        tmp_path: Path) -> None:
    """A context that drops a request and starts another at once (a wrong
    speculative first segment, then the one cut) is not refused for the
    slot its dropped request held: the worker gives a slot back when it
    reads the ``Cancel``, not when the cancelled task has unwound."""
    voice = FakeVoice("fake:a", hang=True)
    async with rig(tmp_path, [voice], capacity=1) as (_, _, remote):
        rv = remote["fake:a"]
        for i in range(5):
            guess = rv.synthesize(request(f"guess{i}"))
            await guess.__anext__()
            await guess.aclose()  # its Cancel, then at once the next start
            real = rv.synthesize(request(f"real{i}"))
            await real.__anext__()  # not Busy
            await real.aclose()
            await until(lambda: voice.open == 0)


def test_every_field_of_a_voice_but_its_word_timing_crosses_the_link() -> None:
    """What a front end plans with (chunk plans, the first segment's too,
    capabilities) is the worker's voice's own: ``VoiceEntry`` names every
    ``VoiceInfo`` field except ``word_timing`` (word times do not cross)."""
    info_fields = set(VoiceInfo.__dataclass_fields__)
    assert set(m.VoiceEntry.__struct_fields__) == info_fields - {"word_timing"}
    info = VoiceInfo(name="fake:a", family="fake", sample_rate=RATE,
                     chunk_plan_ms=(32.0, 171.0), chunk_cost_ms=(85.0, 341.0),
                     first_chunk_plan_ms=(32.0, 100.0), first_chunk_cost_ms=(85.0, 200.0),
                     batch_rows=512)
    entry = m.VoiceEntry(**{f: getattr(info, f) for f in m.VoiceEntry.__struct_fields__})
    again = msgspec.msgpack.decode(msgspec.msgpack.encode(entry), type=m.VoiceEntry)
    assert VoiceInfo(**msgspec.structs.asdict(again)) == info


async def test_two_front_ends_may_use_the_same_request_id(tmp_path: Path) -> None:
    """Front ends number their requests on their own; the worker's engines
    still see distinct ids, and each front end gets its own audio."""
    voice = FakeVoice("fake:a")
    async with rig(tmp_path, [voice]) as (r, _, remote):
        other = WorkerLink(r.endpoint, CONFIG)
        ready = await asyncio.wait_for(other.start(), 10)
        mine = RemoteVoice(other, VoiceInfo(**msgspec.structs.asdict(ready.voices[0])))

        async def speak(rv: RemoteVoice) -> int:
            return len([c async for c in rv.synthesize(request("ctx-1"))])

        assert await asyncio.gather(speak(remote["fake:a"]), speak(mine)) == [5, 5]
        await other.close()
    ids = [req.request_id for req in voice.requests]
    assert len(set(ids)) == 2 and all(i.endswith("/ctx-1") for i in ids)


async def test_an_engine_that_dies_fails_the_request_and_ends_the_worker(tmp_path: Path) -> None:
    voice = FakeVoice("fake:a", die=True)
    async with rig(tmp_path, [voice]) as (r, _, remote):
        chunks = 0
        with pytest.raises(EngineFailed) as exc:
            async for _ in remote["fake:a"].synthesize(request("r1")):
                chunks += 1
        # the engine's own reason, not the worker's loss: what the worker sent
        # before its socket closed is read (the link's pipe outlives the
        # disconnect; no ZMQ_IMMEDIATE)
        assert "crashed" in str(exc.value) and not isinstance(exc.value, EngineLost)
        assert chunks <= 1
        assert r.task is not None
        # the worker exits with its status for the supervisor to restart it
        assert await asyncio.wait_for(r.task, 10) == ENGINE_DEAD_EXIT


async def test_a_request_before_hello_is_refused(tmp_path: Path) -> None:
    """A ``Synthesize`` on a connection that has not said ``Hello`` was queued
    for the worker before this one (a link's pipe outlives a disconnect, and
    its front end failed the request already): refused, never run."""
    import zmq
    import zmq.asyncio

    voice = FakeVoice("fake:a")
    async with rig(tmp_path, [voice]) as (r, _, _):
        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(r.endpoint)
        try:
            await sock.send(m.encode(m.Synthesize(request_id="stale", voice="fake:a",
                                                  text="hi", first=True)))
            got = m.decode_up(await asyncio.wait_for(sock.recv(), 5))
            assert isinstance(got, m.Failed) and got.code == "engine_failed"
            await sock.send(m.encode(m.Hello(pid=1)))
            assert isinstance(m.decode_up(await asyncio.wait_for(sock.recv(), 5)), m.Ready)
        finally:
            sock.close(linger=0)
            ctx.term()
    assert voice.requests == []


async def test_the_contexts_request_id_crosses_to_the_worker(tmp_path: Path) -> None:
    """The worker's log lines about a request carry the id of the context it
    speaks for (rtserver.logs), as the front end's do."""
    voice = FakeVoice("fake:a", chunks=1)
    async with rig(tmp_path, [voice]) as (_, _, remote):
        with request_scope("turn-42"):
            assert len([c async for c in remote["fake:a"].synthesize(request("r1"))]) == 1
        assert len([c async for c in remote["fake:a"].synthesize(request("r2"))]) == 1
    assert voice.log_ids == ["turn-42", None]


async def test_an_engine_that_dies_while_idle_ends_the_worker(tmp_path: Path) -> None:
    """No request in flight: the worker reads its families' probes
    (``VoiceSet.dead``) and exits ``ENGINE_DEAD_EXIT`` all the same."""
    voice = FakeVoice("fake:a")
    dead: dict[str, str] = {}
    reads: list[int] = []

    def probe() -> dict[str, str]:
        reads.append(1)
        return dead

    server = WorkerServer({"fake:a": voice}, by_spec={"fake:a": "fake:a"}, default="fake:a",
                          capacity={"fake": 0}, config=CONFIG, dead=probe)
    stop = asyncio.Event()
    task = asyncio.create_task(server.serve(f"ipc://{tmp_path}/w.sock", stop))
    try:
        await until(lambda: len(reads) >= 2)  # serving, and read healthy twice
        assert not task.done()
        dead["fake:a"] = "its loop died"
        assert await asyncio.wait_for(task, 10) == ENGINE_DEAD_EXIT
    finally:
        stop.set()
        await asyncio.gather(task, return_exceptions=True)


async def _never_here(specs: object, section: object, settings: object,
                     progress: object) -> FamilyVoices:
    raise AssertionError("a front end loaded a GPU family's voice itself")


@pytest.fixture
def fake_family(monkeypatch: pytest.MonkeyPatch) -> VoiceFamily:
    """The "fake" family, registered for one test (the registry's way in its own tests)."""
    registry.families()  # the built-in ones first
    monkeypatch.setattr(registry, "_FAMILIES", dict(registry._FAMILIES))
    return register_family(VoiceFamily(name="fake", load=_never_here))


async def test_a_front_end_serves_local_and_worker_voices_together(
        tmp_path: Path, fake_family: VoiceFamily) -> None:
    """Piper in the front end, the GPU family's voices through the worker
    (their family's loader never runs here), the default first."""
    async with rig(tmp_path, [FakeVoice("fake:a"), FakeVoice("fake:b")]) as (r, _, _):
        cfg = load_config(env={}, flags={"voice.default": "fake:a",
                                         "voice.extra": "piper:en_US-joe-medium",
                                         "gpu.families": "fake", "gpu.endpoint": r.endpoint})
        voices = await load_server_voices(cfg, progress=lambda msg: None)
        try:
            assert voices.default == "fake:a"
            assert list(voices.voices) == ["fake:a", "piper:en_US-joe-medium", "fake:b"]
            assert isinstance(voices.voices["fake:b"], RemoteVoice)
            assert not isinstance(voices.voices["piper:en_US-joe-medium"], RemoteVoice)
            got = [c async for c in voices.voices["fake:b"].synthesize(request("r1"))]
            assert len(got) == 5
        finally:
            await voices.close()


def test_specs_split_between_the_front_end_and_the_worker() -> None:
    cfg = load_config(env={}, flags={"voice.default": "chattts:alice",
                                     "voice.extra": "piper:en_US-joe-medium,orpheus:tara",
                                     "gpu.endpoint": "ipc:///nowhere"})
    local, remote = split_specs(cfg)
    assert local == ["piper:en_US-joe-medium"]
    assert remote == ["chattts:alice", "orpheus:tara"]
    assert capacity_of(cfg, "chattts") == 64  # chattts.slots
    assert capacity_of(cfg, "orpheus") == 256  # orpheus.max_num_seqs


@pytest.mark.parametrize("ms", ["0", "0.05", "101"])
def test_a_gil_switch_outside_its_range_is_refused(ms: str) -> None:
    with pytest.raises(ConfigError, match=r"gpu\.gil_switch_ms"):
        load_config(env={"RTSERVER_GPU_GIL_SWITCH_MS": ms}, flags={})
    assert load_config(env={"RTSERVER_GPU_GIL_SWITCH_MS": "0.5"}, flags={}).gpu.gil_switch_ms == 0.5


def test_front_end_imports_no_torch() -> None:
    """The serving path of a front end (server, remote voices, config) in a
    fresh interpreter leaves torch and vLLM out of ``sys.modules``."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from rtserver.config import load_config\n"
            "import rtserver.cli, rtserver.server.app, rtserver.worker.remote\n"
            "import rtserver.worker.placement as r\n"
            "cfg = load_config(env={}, flags={'voice.default': 'chattts:alice', "
            "'gpu.endpoint': 'ipc:///nowhere'})\n"
            "print(r.split_specs(cfg))\n"
            "bad = [m for m in ('torch', 'vllm', 'transformers') if m in sys.modules]\n"
            "sys.exit(f'imported {bad}' if bad else 0)\n")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr


