"""OpenAI compatibility of the speech API, checked with the official `openai`
client and plain HTTP: OpenAI's voice names and voice objects, `instructions`,
OpenAI's error shape on every error, the SSE stream's shape (mid-stream errors
included), CORS, and the framework's `/openapi.json` and `/docs`."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

openai = pytest.importorskip("openai")

from rtserver.config import OPENAI_VOICES  # noqa: E402
from rtserver.testing.server_thread import ServerThread  # noqa: E402

from . import fault_voice  # noqa: E402, F401  (registers the faulty:* test voices)
from .test_openai_speech import TEXT, decode  # noqa: E402
from .util import http  # noqa: E402

FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
ORIGIN = "https://app.example"
ERROR_KEYS = {"message", "type", "param", "code"}


def client_for(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.http + "/v1", api_key="none", max_retries=0)


def assert_speech(fmt: str, data: bytes, text: str = TEXT) -> None:
    """Decodable, about as long as the text takes to say, and not silent."""
    pcm, rate = decode(fmt, data)
    seconds = len(pcm) / rate
    assert 0.06 * len(text) / 1.5 < seconds < 0.12 * len(text), seconds  # ~15 chars a second
    assert float(np.sqrt(np.mean(pcm ** 2))) > 0.01


def openai_error_of(status_headers_body: tuple[int, dict[str, str], bytes]
                    ) -> tuple[int, dict[str, Any]]:
    status, _, body = status_headers_body
    obj = json.loads(body)
    # the request-id middleware adds "request_id" beside and inside "error"
    assert set(obj) - {"request_id"} == {"error"}, obj
    assert set(obj["error"]) - {"request_id"} == ERROR_KEYS, obj
    return status, obj["error"]


@pytest.fixture(scope="module")
def configured() -> Iterator[ServerThread]:
    """CORS for one origin, instructions ignored, a voice map of its own and a
    voice that fails mid-stream."""
    srv = ServerThread.with_settings(
        server={"cors_origins": ORIGIN},
        voice={"extra": "faulty:die"},
        admission={"first_heard_target_ms": 0},  # the test voice's rates are odd
        openai={"ignore_instructions": True,
                "voices": "marin=piper:en_US-joe-medium,voice_1234=default"}).start()
    yield srv
    srv.stop()


def test_alloy_speaks(server: ServerThread) -> None:
    """OpenAI's voice names speak (the default map: the server's default voice)."""
    data = client_for(server).audio.speech.create(
        model="gpt-4o-mini-tts", voice="alloy", input=TEXT, response_format="wav").read()
    assert_speech("wav", data)


@pytest.mark.parametrize("fmt", FORMATS)
async def test_the_async_client_streams_every_format(server: ServerThread, fmt: str) -> None:
    client = openai.AsyncOpenAI(base_url=server.http + "/v1", api_key="none", max_retries=0)
    async with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="nova", input=TEXT, response_format=fmt) as response:
        assert response.status_code == 200
        data = b"".join([chunk async for chunk in response.iter_bytes()])
    assert_speech(fmt, data)
    whole = await client.audio.speech.create(model="tts-1", voice="coral", input=TEXT,
                                             response_format=fmt)
    assert_speech(fmt, whole.content)
    await client.close()


def test_every_openai_name_and_a_voice_object_speak_the_mapped_voice(
        server: ServerThread) -> None:
    client = client_for(server)
    voices = client.get("/audio/voices", cast_to=object)
    default = voices["default"]  # type: ignore[index]
    assert voices["openai"] == dict.fromkeys(OPENAI_VOICES, default)  # type: ignore[index]

    def say(voice: Any) -> bytes:
        return client.audio.speech.create(model="tts-1", voice=voice, input="Mapped voices.",
                                          response_format="pcm").read()

    assert say("shimmer") == say({"id": "cedar"}) == say("default")
    with pytest.raises(openai.NotFoundError) as info:
        say({"id": "voice_nobody"})
    err = info.value.response.json()["error"]
    assert err["param"] == "voice" and err["code"] == "unknown_voice"


def test_instructions_are_refused_not_dropped(server: ServerThread) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client_for(server).audio.speech.create(model="gpt-4o-mini-tts", voice="alloy",
                                               input=TEXT, instructions="Speak cheerfully.")
    err = info.value.response.json()["error"]
    assert err["param"] == "instructions" and "ignore_instructions" in err["message"]


def test_instructions_ignored_when_configured_and_said_so(configured: ServerThread) -> None:
    with client_for(configured).audio.speech.with_streaming_response.create(
            model="gpt-4o-mini-tts", voice="marin", input=TEXT, response_format="flac",
            instructions="Speak cheerfully.") as response:
        assert response.headers["x-rtserver-ignored"] == "instructions"
        assert_speech("flac", response.read())


def test_a_configured_voice_map(configured: ServerThread) -> None:
    client = client_for(configured)
    mapped = client.get("/audio/voices", cast_to=object)["openai"]  # type: ignore[index]
    assert mapped["marin"] == "piper:en_US-joe-medium"
    assert mapped["voice_1234"] == mapped["alloy"] == configured.server.app.default_voice  # type: ignore[union-attr]
    data = client.audio.speech.create(model="tts-1", voice={"id": "voice_1234"}, input=TEXT,
                                      response_format="mp3").read()
    assert_speech("mp3", data)


def test_a_voice_map_to_a_voice_not_loaded_fails_the_start() -> None:
    srv = ServerThread.with_settings(openai={"voices": "alloy=piper:nobody"})
    with pytest.raises(RuntimeError) as info:
        srv.start()
    assert "alloy=piper:nobody" in repr(info.value.__cause__)


def test_every_error_is_in_openais_shape(server: ServerThread) -> None:
    base = server.http
    speech = base + "/v1/audio/speech"
    post_json = {"Content-Type": "application/json"}

    status, err = openai_error_of(http(base + "/v1/nothing-here"))
    assert status == 404 and err["code"] == "not_found"
    status, err = openai_error_of(http(base + "/v1/nothing-here", method="DELETE"))
    assert status == 404
    answer = http(speech)
    assert answer[1]["allow"] == "POST"
    status, err = openai_error_of(answer)
    assert status == 405 and err["code"] == "method_not_allowed"
    status, err = openai_error_of(http(speech, method="OPTIONS", headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST"}))
    assert status == 405  # no CORS configured on this server

    def post(obj: Any) -> tuple[int, dict[str, Any]]:
        return openai_error_of(http(speech, "POST", post_json, json.dumps(obj).encode()))

    for body, param in (({"voice": "alloy"}, "input"), ({"input": 3}, "input"),
                        ({"input": "  "}, "input"), ({"input": "Hi.", "speed": "fast"}, "speed"),
                        ({"input": "Hi.", "voice": {"name": "alloy"}}, "voice"),
                        ({"input": "Hi.", "stream_format": "ws"}, "stream_format")):
        status, err = post(body)
        assert (status, err["param"], err["type"]) == (400, param, "invalid_request_error"), body
    status, err = post({"input": "Hi.", "response_format": "ogg"})
    assert (status, err["code"], err["param"]) == (400, "unsupported_format", "response_format")
    status, err = openai_error_of(http(speech, "POST", post_json, b"{not json"))
    assert status == 400 and err["code"] == "bad_message"
    status, err = openai_error_of(http(speech, "POST", {
        "Content-Type": "application/x-www-form-urlencoded"}, b'{"input": "Hi."}'))
    assert status == 400 and "Content-Type: application/json" in err["message"]
    big = json.dumps({"input": "a" * (server.config.server.max_text_chars * 5)}).encode()
    status, err = openai_error_of(http(speech, "POST", post_json, big))
    assert (status, err["code"], err["param"]) == (413, "text_too_long", "input")


def sse_lines(response: Any) -> list[str]:
    return [line for line in response.iter_lines() if line]


def test_the_sse_stream_is_shaped_like_openais(server: ServerThread) -> None:
    with client_for(server).audio.speech.with_streaming_response.create(
            model="gpt-4o-mini-tts", voice="alloy", input=TEXT, response_format="pcm",
            stream_format="sse") as response:
        lines = sse_lines(response)
    assert all(line.startswith("data: ") for line in lines)  # no event: or id: fields
    events = [json.loads(line[6:]) for line in lines]
    *deltas, done = events
    assert deltas and all(set(e) == {"type", "audio"} and e["type"] == "speech.audio.delta"
                          for e in deltas)
    assert set(done) == {"type", "usage"} and done["type"] == "speech.audio.done"
    usage = done["usage"]
    assert set(usage) == {"input_tokens", "output_tokens", "total_tokens"}
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"] > 0
    pcm = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    assert_speech("pcm", pcm)


def test_a_mid_stream_failure_ends_sse_with_openais_error_object(
        configured: ServerThread) -> None:
    with client_for(configured).audio.speech.with_streaming_response.create(
            model="tts-1", voice="faulty:die", input=TEXT, response_format="pcm",
            stream_format="sse") as response:
        assert response.status_code == 200
        events = [json.loads(line[6:]) for line in sse_lines(response)]
    *deltas, last = events
    assert deltas and all(e["type"] == "speech.audio.delta" for e in deltas)
    # OpenAI's form: the error object alone, no event type of its own (its
    # client raises APIError for an event that carries "error"), with the
    # request's id beside and inside it, as on every JSON error body
    assert set(last) == {"error", "request_id"}
    assert set(last["error"]) == ERROR_KEYS | {"request_id"}
    assert last["error"]["code"] == "engine_failed"
    assert last["request_id"] == last["error"]["request_id"] == response.headers["x-request-id"]


def test_cors_preflight_and_answer_for_a_listed_origin(configured: ServerThread) -> None:
    speech = configured.http + "/v1/audio/speech"
    status, headers, _ = http(speech, "OPTIONS", {
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert status == 200
    assert headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in headers["access-control-allow-methods"]
    assert "authorization" in headers["access-control-allow-headers"].lower()
    status, headers, _ = http(speech, "OPTIONS", {
        "Origin": "https://elsewhere.example", "Access-Control-Request-Method": "POST"})
    assert status == 400 and "access-control-allow-origin" not in headers
    status, headers, body = http(speech, "POST", {"Origin": ORIGIN,
                                                  "Content-Type": "application/json"},
                                 json.dumps({"input": TEXT, "voice": "alloy",
                                             "response_format": "wav"}).encode())
    assert status == 200 and headers["access-control-allow-origin"] == ORIGIN
    assert "retry-after-ms" in headers["access-control-expose-headers"]
    assert_speech("wav", body)


def test_openapi_schema_and_docs(server: ServerThread) -> None:
    status, _, body = http(server.http + "/openapi.json")
    assert status == 200
    schema = json.loads(body)
    assert "/v1/audio/speech" in schema["paths"] and "/v1/tokens" in schema["paths"]
    speech = schema["components"]["schemas"]["SpeechBody"]["properties"]
    assert {"input", "voice", "instructions", "response_format", "speed",
            "stream_format"} <= set(speech)
    assert speech["speed"]["maximum"] == 4.0
    status, headers, body = http(server.http + "/docs")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert b"/openapi.json" in body and b"/docs-assets/swagger-ui-bundle.js" in body
    assert http(server.http + "/redoc")[0] == 200
    status, headers, body = http(server.http + "/docs-assets/swagger-ui-bundle.js")
    assert status == 200 and "javascript" in headers["content-type"] and len(body) > 100_000
    assert http(server.http + "/health", method="HEAD")[0] == 200
