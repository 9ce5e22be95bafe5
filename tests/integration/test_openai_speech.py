"""OpenAI's speech API on rtserver, through the official `openai` client."""

from __future__ import annotations

import base64
import io
import itertools
import json
import socket
from collections.abc import Iterator

import av
import numpy as np
import pytest

openai = pytest.importorskip("openai")

from rtserver.testing.server_thread import ServerThread  # noqa: E402
from rtserver.testing.wait import scaled, wait_until  # noqa: E402

TEXT = "Hello there. This answer comes from rtserver's speech API."


def client_for(server: ServerThread, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.http + "/v1", api_key=key, max_retries=0)


def decode(fmt: str, data: bytes) -> tuple[np.ndarray, int]:
    if fmt == "pcm":
        return np.frombuffer(data, "<i2").astype(np.float32) / 32768.0, 24000
    parts = []
    rate = 0
    with av.open(io.BytesIO(data)) as container:
        for frame in container.decode(audio=0):
            rate = frame.sample_rate
            parts.append(frame.to_ndarray().reshape(-1).astype(np.float32))
    return np.concatenate(parts), rate


def metric(server: ServerThread, name: str) -> float:
    import urllib.request

    body = urllib.request.urlopen(server.http + "/metrics", timeout=10).read().decode()
    return sum(float(line.split()[-1]) for line in body.splitlines()
               if line.startswith(name) and not line.startswith("#"))


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav", "pcm"])
def test_streamed_speech_decodes_in_each_format(server: ServerThread, fmt: str) -> None:
    client = client_for(server)
    with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="default", input=TEXT, response_format=fmt) as response:
        assert response.status_code == 200
        data = b"".join(response.iter_bytes())
    pcm, rate = decode(fmt, data)
    assert rate in (24000, 48000)  # Opus decodes at 48 kHz
    assert 2.0 < len(pcm) / rate < 8.0
    assert float(np.sqrt(np.mean(pcm ** 2))) > 0.01  # speech, not silence


def sse_events(lines: Iterator[str]) -> list[dict]:
    return [json.loads(line[len("data: "):]) for line in lines if line.startswith("data: ")]


def test_sse_deltas_then_done(server: ServerThread) -> None:
    client = client_for(server)
    with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="default", input=TEXT, response_format="pcm",
            stream_format="sse") as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response.iter_lines())
    assert events[-1]["type"] == "speech.audio.done"
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) >= 2 and len(deltas) == len(events) - 1
    pcm = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    assert 2.0 < len(pcm) / 2 / 24000 < 8.0


def test_speed_changes_the_length(server: ServerThread) -> None:
    client = client_for(server)

    def seconds(speed: float) -> float:
        with client.audio.speech.with_streaming_response.create(
                model="tts-1", voice="default", input="One two three four five six.",
                response_format="pcm", speed=speed) as response:
            return len(response.read()) / 2 / 24000

    normal, fast = seconds(1.0), seconds(2.0)
    # Piper speaks at the speed itself (length scale, issue 29): its phoneme
    # durations halve, each rounded up to a whole frame, and its pauses
    # shrink less, so 2x speed is ~0.6-0.65 of the length, not exactly 0.5
    assert 0.4 * normal < fast < 0.75 * normal, (normal, fast)


_greetings = itertools.count(3)


def test_a_repeat_answers_from_the_phrase_cache(server: ServerThread) -> None:
    client = client_for(server)
    # a phrase of its own: a repeat of the test (--count) must not find it cached
    text = f"A greeting that is said again and again, {next(_greetings)} times."
    hits = metric(server, "rtserver_phrase_cache_hits_total")

    def say(fmt: str) -> bytes:
        with client.audio.speech.with_streaming_response.create(
                model="tts-1", voice="default", input=text, response_format=fmt) as response:
            return response.read()

    first = say("mp3")
    assert metric(server, "rtserver_phrase_cache_hits_total") == hits
    assert say("mp3") == first
    assert metric(server, "rtserver_phrase_cache_hits_total") == hits + 1
    say("wav")  # another format is another phrase
    assert metric(server, "rtserver_phrase_cache_hits_total") == hits + 1


def test_voices_and_models(server: ServerThread) -> None:
    client = client_for(server)
    assert "tts-1" in [m.id for m in client.models.list()]
    voices = client.get("/audio/voices", cast_to=object)
    assert "piper:en_US-joe-medium" in voices["voices"]  # type: ignore[index]


def status_and_error(fn) -> tuple[int, dict, dict]:  # type: ignore[no-untyped-def]
    with pytest.raises(openai.APIStatusError) as info:
        fn()
    resp = info.value.response
    return resp.status_code, resp.json()["error"], dict(resp.headers)


def test_bad_input_unknown_voice_and_too_long(server: ServerThread) -> None:
    client = client_for(server)
    speak = client.audio.speech.create
    status, err, _ = status_and_error(lambda: speak(model="tts-1", voice="default", input=TEXT,
                                                    response_format="ogg"))  # type: ignore
    assert status == 400 and err["code"] == "unsupported_format"
    status, err, _ = status_and_error(lambda: speak(model="tts-1", voice="default", input=TEXT,
                                                    speed=9.0))
    assert status == 400 and err["param"] == "speed"
    status, err, _ = status_and_error(lambda: speak(model="tts-1", voice="nobody", input=TEXT))
    assert status == 404 and err["code"] == "unknown_voice"
    limit = server.config.server.max_text_chars
    status, err, _ = status_and_error(lambda: speak(model="tts-1", voice="default",
                                                    input="a" * (limit + 1)))
    assert status == 413 and err["code"] == "text_too_long"
    status, err, _ = status_and_error(lambda: client.post(
        "/audio/speech", content=b"not json", cast_to=object))
    assert status == 400 and err["code"] == "bad_message"


def test_draining_is_503_with_retry_after(server: ServerThread) -> None:
    app = server.server.app  # type: ignore[union-attr]
    server.call(app.begin_drain)

    def undrain() -> None:
        app.draining = app.gate.draining = False

    try:
        status, err, headers = status_and_error(lambda: client_for(server).audio.speech.create(
            model="tts-1", voice="default", input=TEXT))
    finally:
        server.call(undrain)
    assert status == 503 and err["code"] == "overloaded"
    assert int(headers["retry-after"]) >= 1
    assert int(headers["retry-after"]) == -(-int(headers["retry-after-ms"]) // 1000)


def test_a_client_that_leaves_stops_the_speech(server: ServerThread) -> None:
    cancelled = metric(server, 'rtserver_contexts_total{outcome="cancelled"}')
    client = client_for(server)
    with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="default", input=TEXT * 20, response_format="pcm") as response:
        next(response.iter_bytes())
    wait_until(lambda: metric(server, 'rtserver_contexts_total{outcome="cancelled"}')
               > cancelled, "the server cancels the speech of a client that left")


@pytest.fixture
def keyed() -> Iterator[ServerThread]:
    # small send buffers, so a client that does not read holds its request open; a
    # server per test: the test spends its per-minute budget (a repeat would find none)
    srv = ServerThread.with_settings(server={"api_keys": "k1",
                                             "socket_send_buffer": 16384},
                                     admission={"contexts_per_minute": 2,
                                                "http_requests_per_key": 1}).start()
    yield srv
    srv.stop()


def hold_a_request(srv: ServerThread, key: str) -> socket.socket:
    """A client that asks for long speech and reads nothing: the request stays open."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", srv.port))
    body = json.dumps({"model": "tts-1", "voice": "default", "input": TEXT * 5,
                       "response_format": "pcm"}).encode()
    auth = b"Authorization: Bearer " + key.encode() + b"\r\n" if key else b""
    sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\n" + auth +
                 b"Content-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    assert sock.recv(12).startswith(b"HTTP/1.1 200")
    return sock


def test_api_keys_401_too_many_at_once_and_rate_limited_429(keyed: ServerThread) -> None:
    status, err, _ = status_and_error(lambda: client_for(keyed, "wrong").audio.speech.create(
        model="tts-1", voice="default", input=TEXT))
    assert status == 401 and err["code"] == "invalid_api_key"
    client = client_for(keyed, "k1")
    held = hold_a_request(keyed, "k1")  # the per-minute budget: 1 of 2 used
    try:
        status, err, headers = status_and_error(lambda: client.audio.speech.create(
            model="tts-1", voice="default", input=TEXT))
        assert status == 429 and err["code"] == "too_many_contexts"
        assert int(headers["retry-after"]) >= 1 and int(headers["retry-after-ms"]) >= 1
    finally:
        held.close()
    # the server learns that the held client left a moment after it does: wait
    # until it has ended that response (its own count, which a drain waits on)
    wait_until(lambda: speech_in_flight(keyed) == 0, "the held request is let go")
    assert len(client.audio.speech.create(
        model="tts-1", voice="default", input="Fine again.").read()) > 1000  # 2 of 2
    # a response read to its end has freed its slot: the next request at once is
    # refused for its rate, never as too many at once
    status, err, headers = status_and_error(lambda: client.audio.speech.create(
        model="tts-1", voice="default", input="One more."))
    assert status == 429 and err["code"] == "rate_limited"
    assert int(headers["retry-after"]) == -(-int(headers["retry-after-ms"]) // 1000) >= 1


def speech_in_flight(srv: ServerThread) -> int:
    """Speech responses the server has not ended (``SpeechApi.in_flight``; a
    response's client slot is freed before it ends)."""
    assert srv.server is not None
    return srv.call(lambda: srv.server._speech.in_flight)  # type: ignore[union-attr]


def test_a_phrase_too_long_for_the_cache_is_spoken_each_time() -> None:
    # 0.05 MB: one entry may hold 12.8 kB; this mp3 is ~40 kB
    srv = ServerThread.with_settings(cache={"max_mb": 0.05}).start()
    try:
        client = client_for(srv)
        bodies = []
        for _ in range(2):
            with client.audio.speech.with_streaming_response.create(
                    model="tts-1", voice="default", input=TEXT) as response:
                bodies.append(response.read())
        assert len(bodies[0]) > 20_000 and decode("mp3", bodies[1])[0].size > 0
        assert metric(srv, "rtserver_phrase_cache_hits_total") == 0
        assert metric(srv, "rtserver_phrase_cache_misses_total") == 2
        assert metric(srv, "rtserver_phrase_cache_entries") == 0
    finally:
        srv.stop()


def test_a_drain_lets_a_speech_response_finish() -> None:
    """A client that reads slower than real time keeps its response open past
    uvicorn's 5 s shutdown grace; the drain waits for it (drain_timeout_s)."""
    import time

    srv = ServerThread.with_settings(server={"socket_send_buffer": 16384,
                                             "drain_timeout_s": 60}).start()
    try:
        sock = hold_a_request(srv, "")  # ~14 s of 24 kHz PCM, read nothing yet
        assert srv.server is not None
        future = srv.submit(srv.server.drain())
        data = b""
        t0 = time.monotonic()
        while chunk := sock.recv(4096):
            data += chunk
            # a slow reader, 120 kB/s whatever recv returns (pacing only slows it):
            # over 10 s of speech (480 kB; it is ~880 kB) takes over 7 s, past
            # uvicorn's 5 s grace
            time.sleep(max(0.0, t0 + len(data) / 120_000 - time.monotonic()))
        took = time.monotonic() - t0
        sock.close()
        assert data.endswith(b"0\r\n\r\n")  # the whole chunked body, then its end
        assert len(data) > 10 * 48000  # over 10 s of speech
        assert took > 5.5  # it was open longer than uvicorn's own grace
        future.result(scaled(30))
    finally:
        srv.stop()
