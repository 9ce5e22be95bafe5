"""A real server on 127.0.0.1, the real client, the embedded Piper voice."""

from __future__ import annotations

import asyncio

import numpy as np

from rtserver.client import AudioFrames, RtClient
from rtserver.testing.server_thread import ServerThread
from rtserver.testing.wait import wait_until_async

from .util import http

REPLY = ("Sure, here is the plan for today. First, we meet Dr. Smith at 9:30 a.m. "
         "to review the $3.50 budget. Then we walk home.")


def speech_like(pcm: np.ndarray, rate: int, text: str) -> None:
    """Audio a listener would accept as speaking ``text``: long enough, not silent."""
    seconds = len(pcm) / rate
    # English TTS speaks ~10-25 characters per second.
    assert len(text) / 25 <= seconds <= len(text) / 8, seconds
    rms = float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2)))
    assert rms > 0.02, rms
    # voiced speech has most energy below 4 kHz and is not a constant tone
    frame = rate // 50
    energies = [float(np.mean(pcm[i:i + frame] ** 2)) for i in range(0, len(pcm) - frame, frame)]
    loud = sum(e > (0.1 * rms) ** 2 for e in energies)
    assert 0.3 < loud / len(energies) < 0.99


def active_contexts(server: ServerThread) -> int:
    """Contexts the server counts as running (the load its hints plan for)."""
    assert server.server is not None and server.server.app is not None
    app = server.server.app
    assert all(s.load is app.load for s in app.voice_stats.values())  # one, shared
    return int(server.call(lambda: app.load.active))


async def test_reply_streamed_word_by_word_comes_back_as_speech(server: ServerThread) -> None:
    async with RtClient.connect(server.url) as client:
        assert client.ready.protocol == 1
        ctx = await client.start()
        for word in REPLY.split(" "):
            await ctx.send_text(word + " ")
        await ctx.end()
        result = await ctx.collect()
    assert result.ok, (result.error, result.failure)
    assert result.done is not None and result.done.ttfa_ms is not None
    assert result.done.frames == result.frame_count
    assert result.pcm is not None
    speech_like(result.pcm, result.started.sample_rate, REPLY)
    # a jitter-buffer hint comes before the first frame
    hints = result.times.buffer_hints
    assert hints and result.times.first_frame_at is not None
    assert hints[0][0] <= result.times.first_frame_at
    assert hints[0][1].prebuffer_ms > 0 and hints[0][1].rtf > 0
    segments = [seg for _, seg in result.times.segments]
    assert len(segments) >= 3
    assert segments[0].seq == 0 and [s.index for s in segments] == list(range(len(segments)))
    # each segment's source points back into what was sent
    sent = "".join(w + " " for w in REPLY.split(" "))
    assert "Dr. Smith" in " ".join(s.text for s in segments)
    for seg in segments:
        start, end = seg.source
        assert 0 <= start < end <= len(sent)


async def test_first_audio_arrives_before_the_text_ends(server: ServerThread) -> None:
    async with RtClient.connect(server.url) as client:
        ctx = await client.start()
        await ctx.send_text("Hello there, ")
        first: AudioFrames | None = None
        async for event in ctx.events():
            if isinstance(event, AudioFrames):
                first = event
                break
        assert first is not None and first.seq == 0
        await ctx.send_text("this part was sent after the first audio came back.")
        await ctx.end()
        result = await ctx.collect()
    assert result.ok


async def test_two_contexts_at_once_on_one_connection(server: ServerThread) -> None:
    async with RtClient.connect(server.url) as client:
        a = await client.start("a", format="opus", sample_rate=48000)
        b = await client.start("b", format="pcm_s16le", sample_rate=16000, frame_ms=40)
        assert a.stream != b.stream
        await a.send_text("The first voice speaks about the weather today.")
        await b.send_text("The second one talks about trains and stations.")
        await a.end()
        await b.end()
        ra, rb = await asyncio.gather(a.collect(), b.collect())
    for r, text in ((ra, "The first voice speaks about the weather today."),
                    (rb, "The second one talks about trains and stations.")):
        assert r.ok
        assert r.pcm is not None
        speech_like(r.pcm, r.started.sample_rate, text)
    assert rb.started.frame_ms == 40 and rb.started.pre_skip == 0
    assert active_contexts(server) == 0  # the voices' load, for hints: back to idle


async def test_cancel_fences_the_context(server: ServerThread) -> None:
    sentence = "This sentence keeps the voice busy for a good while. "
    long_text = sentence * 12
    async with RtClient.connect(server.url) as client:
        ctx = await client.start()
        await ctx.send_text(sentence)
        await ctx.flush()
        seen: list[AudioFrames] = []
        async for event in ctx.events():
            if isinstance(event, AudioFrames):
                seen.append(event)
                break
        # the rest, its end and the cancel go out back to back: the server reads
        # the cancel right behind them. (All sent at once, the reply was done
        # 1.4-1.5 s after its first frame, so a test stalled that long saw
        # `done` and all 36 s of audio instead of a cancel.)
        await ctx.send_text(sentence * 11)
        await ctx.end()
        cancelled = await ctx.cancel()
        result = await ctx.collect()
        # nothing of the context after the fence; every frame seen is at or below it
        assert result.cancelled == cancelled
        assert result.done is None
        highest = max(m.end_seq - 1 for m in result.frames) if result.frames else -1
        assert highest <= cancelled.last_seq
        assert cancelled.last_seq >= seen[0].end_seq - 1
        assert result.audio_ms < len(long_text) * 40  # stopped long before the end
        # a cancel that crosses the fence is answered again, not an error
        again = await client.start("after")
        await again.send_text("And the next turn starts clean.")
        await again.end()
        assert (await again.collect()).ok
    assert active_contexts(server) == 0  # the cancelled context left the load too


async def test_the_first_segment_is_synthesized_before_its_cut(server: ServerThread) -> None:
    """The speculative first segment on the real server: the sixth word (the
    first segment's word limit) starts its synthesis before the next word
    confirms the cut; when the word goes on instead, the guess is dropped and
    the context speaks the longer word, whole and in order."""
    def guesses(outcome: str) -> float:
        _, _, body = http(server.http + "/metrics")
        return sum(float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines()
                   if line.startswith("rtserver_first_segment_speculations_total{")
                   and f'outcome="{outcome}"' in line)

    async with RtClient.connect(server.url) as client:
        before = {o: guesses(o) for o in ("started", "adopted", "dropped")}
        ctx = await client.start()
        for word in ("Here", " are", " the", " six", " words", " now"):
            await ctx.send_text(word)
        await wait_until_async(lambda: guesses("started") > before["started"],
                               "the guess started")
        await ctx.send_text(" and then the rest.")
        await ctx.end()
        first = await ctx.collect()

        ctx = await client.start()
        for word in ("Here", " are", " the", " six", " words", " no"):
            await ctx.send_text(word)
        await wait_until_async(lambda: guesses("started") > before["started"] + 1,
                               "the second guess started")
        await ctx.send_text("where to be seen.")
        await ctx.end()
        second = await ctx.collect()
    for result, text in ((first, "Here are the six words now"),
                         (second, "Here are the six words nowhere")):
        assert result.ok, (result.error, result.failure)
        segments = [seg for _, seg in result.times.segments]
        assert segments[0].text == text
        assert result.done is not None and result.done.frames == result.frame_count
        assert result.pcm is not None
        speech_like(result.pcm, result.started.sample_rate, result.done.spoken_text)
    assert guesses("adopted") == before["adopted"] + 1
    assert guesses("dropped") == before["dropped"] + 1
