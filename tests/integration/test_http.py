"""HTTP endpoints on the WebSocket port, and API keys at the handshake."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from rtserver.client import HandshakeRejected, RtClient
from rtserver.testing.server_thread import ServerThread


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Content-Type", ""), err.read().decode()


def test_health_ready_voices_metrics_and_demo(server: ServerThread) -> None:
    assert get(server.http + "/health")[0] == 200
    assert get(server.http + "/ready")[0] == 200
    status, ctype, body = get(server.http + "/v1/voices")
    assert status == 200 and ctype.startswith("application/json")
    voices = json.loads(body)
    assert voices["default"] == "piper:en_US-joe-medium"
    assert voices["voices"][0]["sample_rate"] == 22050
    status, ctype, body = get(server.http + "/")
    assert status == 200 and ctype.startswith("text/html")
    assert get(server.http + "/../pyproject.toml")[0] == 404
    assert get(server.http + "/%2e%2e/pyproject.toml")[0] == 404
    assert get(server.http + "/no-such-file.js")[0] == 404
    assert get(server.http + "/v1/stream")[0] == 426


async def test_metrics_count_what_was_spoken(server: ServerThread) -> None:
    async with RtClient.connect(server.url) as client:
        assert (await client.say("Counting this one.")).ok
    status, ctype, body = get(server.http + "/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    for name in ("rtserver_ttfa_seconds_bucket", "rtserver_rtf_bucket",
                 "rtserver_active_connections", "rtserver_active_contexts",
                 "rtserver_audio_seconds_total", "rtserver_errors_total",
                 "rtserver_send_queue_seconds_bucket", "rtserver_send_queue_audio_seconds"):
        assert name in body, name
    sent = [line for line in body.splitlines()
            if line.startswith("rtserver_audio_seconds_total{")]
    assert sent and float(sent[0].split()[-1]) > 0.5


async def test_api_keys_are_checked_at_the_handshake() -> None:
    srv = ServerThread.with_settings(server={"api_keys": "k1,k2"}).start()
    try:
        with pytest.raises(HandshakeRejected) as info:
            await RtClient.connect(srv.url)
        assert "401" in str(info.value)
        with pytest.raises(HandshakeRejected):
            await RtClient.connect(srv.url, token="wrong")
        async with RtClient.connect(srv.url, token="k2") as client:
            assert client.ready.protocol == 1
        async with RtClient.connect(srv.url + "?token=k1") as client:
            assert client.ready.protocol == 1
        assert get(srv.http + "/health")[0] == 200  # probes need no key
    finally:
        srv.stop()
