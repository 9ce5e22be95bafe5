"""Lexicons, SSML and speed over the WebSocket, on a real server with the
embedded Piper voice (issue 29)."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from rtserver.client import LexiconEntry, RtClient, ServerError
from rtserver.client.events import ContextResult
from rtserver.testing.server_thread import ServerThread


async def speak(server: ServerThread, parts: list[str], **start: object) -> ContextResult:
    async with RtClient.connect(server.url) as client:
        ctx = await client.start(format="pcm_s16le", sample_rate=24000, **start)  # type: ignore[arg-type]
        for part in parts:
            await ctx.send_text(part)
        await ctx.end()
        return await ctx.collect()


def seconds(result: ContextResult) -> float:
    assert result.ok, (result.error, result.failure)
    assert result.pcm is not None
    return len(result.pcm) / result.started.sample_rate


def longest_silence_s(result: ContextResult) -> float:
    assert result.pcm is not None
    quiet = np.abs(result.pcm) < 1e-4
    best = run = 0
    for q in quiet:
        run = run + 1 if q else 0
        best = max(best, run)
    return best / result.started.sample_rate


async def test_an_alias_is_spoken_and_shown_in_the_segment(server: ServerThread) -> None:
    lexicon = [LexiconEntry(grapheme="rtserver", alias="are tee server")]
    result = await speak(server, ["We run rt", "server's API, not RTSERVERS."],
                         lexicon=lexicon)
    assert result.ok, result.error
    texts = [seg.text for _, seg in result.times.segments]
    assert texts == ["We run are tee server's API,", "not RTSERVERS."]
    assert result.done is not None and "are tee server's" in result.done.spoken_text


async def test_a_phoneme_entry_changes_the_audio(server: ServerThread) -> None:
    """Piper speaks the entry's IPA instead of espeak's reading: a word read
    as nine words takes seconds longer (VITS durations vary by run; the
    difference is far above that)."""
    text = ["Please count now."]
    plain = seconds(await speak(server, text))
    nine = "wˈʌn tˈuː θɹˈiː fˈɔːɹ fˈaɪv sˈɪks sˈɛvən ˈeɪt nˈaɪn"
    counted = seconds(await speak(server, text, lexicon=[
        LexiconEntry(grapheme="count", phoneme=nine)]))
    assert counted > plain + 1.5, (plain, counted)


async def test_bad_lexicons_are_refused_with_their_codes(server: ServerThread) -> None:
    async with RtClient.connect(server.url) as client:
        with pytest.raises(ServerError) as info:
            await client.start(lexicon=[LexiconEntry(grapheme="x" * 101, alias="y")])
        assert info.value.error.code == "lexicon_too_large"
        with pytest.raises(ServerError) as info:  # a symbol the voice's model lacks
            await client.start(lexicon=[LexiconEntry(grapheme="ok", phoneme="ǃǃ☃")])
        assert info.value.error.code == "bad_message" and "phoneme" in info.value.error.message
        ok = await client.start(lexicon=[LexiconEntry(grapheme="ok", alias="okay")])
        await ok.send_text("ok.")
        await ok.end()
        assert (await ok.collect()).ok


async def test_ssml_in_fragments_gives_breaks_of_silence(server: ServerThread) -> None:
    doc = ('<speak>Hello <sub alias="World Wide Web">W3C</sub>.<break time="1500ms"/>'
           '<prosody rate="fast">Good<phoneme ph="bˈaɪ">bye</phoneme> now.</prosody></speak>')
    parts = [doc[i:i + 7] for i in range(0, len(doc), 7)]  # tags split across fragments
    result = await speak(server, parts, text_format="ssml")
    assert result.ok, result.error
    segments = [seg for _, seg in result.times.segments]
    assert [s.text for s in segments] == ["Hello World Wide Web.", "Goodbye now."]
    silence = longest_silence_s(result)
    assert 1.5 <= silence < 1.9, silence  # the break, plus the voice's own edges


@pytest.mark.parametrize(("doc", "code", "what"), [
    ("<speak>Hi <emphasis>there</emphasis></speak>", "unsupported_ssml", "emphasis"),
    ('<speak>Hi <phoneme ph="☃">there</phoneme></speak>', "bad_message", "no phoneme"),
    ("<speak>Hi <break time='1s'></speak>", "bad_message", "well-formed"),
])
async def test_ssml_outside_the_subset_is_an_error_and_nothing_is_spoken(
        server: ServerThread, doc: str, code: str, what: str) -> None:
    result = await speak(server, [doc], text_format="ssml")
    assert [e.code for e in result.errors] == [code]
    assert what in result.errors[0].message
    assert result.done is not None and result.frame_count == 0  # never silently plain text


async def test_speed_changes_the_duration(server: ServerThread) -> None:
    text = ["The quick brown fox jumps over the lazy dog."]
    slow = seconds(await speak(server, text, speed=0.5))
    fast = seconds(await speak(server, text, speed=2.0))
    assert slow > 2.0 * fast, (slow, fast)
    async with RtClient.connect(server.url) as client:
        with pytest.raises(ServerError) as info:
            await client.start(speed=3.0)
        assert info.value.error.code == "bad_message" and "speed" in info.value.error.message


VOICE_PLS = """<?xml version="1.0" encoding="UTF-8"?>
<lexicon version="1.0" xmlns="http://www.w3.org/2005/01/pronunciation-lexicon"
         alphabet="ipa" xml:lang="en-US">
  <lexeme><grapheme>rtserver</grapheme><alias>are tee server</alias></lexeme>
  <lexeme><grapheme>count</grapheme>
    <phoneme>wˈʌn tˈuː θɹˈiː fˈɔːɹ fˈaɪv sˈɪks sˈɛvən ˈeɪt nˈaɪn</phoneme></lexeme>
</lexicon>
"""


def http_seconds(server: ServerThread, text: str) -> float:
    body = json.dumps({"model": "tts-1", "voice": "default", "input": text,
                       "response_format": "pcm"}).encode()
    request = urllib.request.Request(server.http + "/v1/audio/speech", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return len(response.read()) / 2 / 24000


async def test_a_voices_lexicon_from_a_pls_file_serves_both_apis(
        server: ServerThread, tmp_path: Path) -> None:
    pls = tmp_path / "voice.pls"
    pls.write_text(VOICE_PLS, encoding="utf-8")
    own = ServerThread.with_settings(voice={"lexicons": [f"en_US-joe-medium={pls}"]}).start()
    try:
        # the voice's alias, and a context's own entry before it
        result = await speak(own, ["rtserver, rtserver's."])
        assert [s.text for _, s in result.times.segments] == [
            "are tee server,", "are tee server's."]
        result = await speak(own, ["rtserver."], lexicon=[
            LexiconEntry(grapheme="RTServer", alias="our server")])
        assert [s.text for _, s in result.times.segments] == ["our server."]
        # the HTTP API speaks the voice's phonemes too
        plain = await asyncio.to_thread(http_seconds, server, "Please count now.")
        counted = await asyncio.to_thread(http_seconds, own, "Please count now.")
        assert counted > plain + 1.5, (plain, counted)
    finally:
        own.stop()
