"""Origin allow-list, browser tokens and keys at the handshake, /metrics key."""

from __future__ import annotations

import json

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from rtserver.client import HandshakeRejected, RtClient
from rtserver.protocol.messages import Ready
from rtserver.testing.server_thread import ServerThread

from .util import http, recv_message


async def test_origins_not_on_the_list_get_403_null_included() -> None:
    srv = ServerThread.with_settings(server={"origins": "https://app.example"}).start()
    try:
        for origin in ("https://evil.example", "null", "http://app.example"):
            with pytest.raises(InvalidStatus) as info:
                async with connect(srv.url, compression=None, origin=origin):  # type: ignore[arg-type]
                    pass
            assert info.value.response.status_code == 403
        async with connect(srv.url, compression=None,
                           origin="https://app.example") as ws:  # type: ignore[arg-type]
            assert isinstance(await recv_message(ws), Ready)
        async with RtClient.connect(srv.url):  # no Origin: not a browser
            pass
        _, _, body = http(srv.http + "/metrics")
        assert b'rtserver_rejected_total{reason="origin"} 3.0' in body
    finally:
        srv.stop()


async def test_tokens_are_minted_with_a_key_and_open_the_stream() -> None:
    srv = ServerThread.with_settings(
        server={"api_keys": "secret-key"},
        admission={"metrics_need_key": True, "token_ttl_s": 60}).start()
    try:
        status, _, _ = http(srv.http + "/v1/tokens", "POST")
        assert status == 401
        status, _, _ = http(srv.http + "/v1/tokens", "POST",
                            {"Authorization": "Bearer wrong-key"})
        assert status == 401
        status, _, body = http(srv.http + "/v1/tokens", "POST",
                               {"Authorization": "Bearer secret-key",
                                "Content-Type": "application/json"},
                               json.dumps({"ttl_s": 30}).encode())
        assert status == 200
        minted = json.loads(body)
        token = minted["token"]
        assert minted["expires_in_s"] == 30 and "secret-key" not in token
        # a browser opens the stream with ?token=
        async with connect(f"{srv.url}?token={token}", compression=None) as ws:
            assert isinstance(await recv_message(ws), Ready)
        for bad in (token[:-3] + "abc", "secret-ke", ""):
            with pytest.raises(InvalidStatus) as info:
                async with connect(f"{srv.url}?token={bad}", compression=None):
                    pass
            assert info.value.response.status_code == 401
        with pytest.raises(HandshakeRejected):
            async with RtClient.connect(srv.url, token="nope"):
                pass
        async with RtClient.connect(srv.url, token="secret-key"):
            pass
        assert http(srv.http + "/metrics")[0] == 401
        assert http(srv.http + "/metrics", headers={"Authorization": "Bearer secret-key"})[0] \
            == 200
        assert http(srv.http + "/health")[0] == 200  # probes need no key
    finally:
        srv.stop()


async def test_connections_are_rate_limited_at_the_handshake() -> None:
    srv = ServerThread.with_settings(admission={"connections_per_minute": 2}).start()
    try:
        for _ in range(2):
            async with connect(srv.url, compression=None) as ws:
                assert isinstance(await recv_message(ws), Ready)
        with pytest.raises(InvalidStatus) as info:
            async with connect(srv.url, compression=None):
                pass
        response = info.value.response
        assert response.status_code == 429
        assert 0 < int(response.headers["Retry-After"]) <= 30
        body = json.loads(response.body)
        assert body["code"] == "rate_limited" and 0 < body["retry_after_ms"] <= 30_000
        assert int(response.headers["retry-after-ms"]) == body["retry_after_ms"]
    finally:
        srv.stop()


async def _handshake(srv: ServerThread, forwarded_for: str) -> int:
    """The handshake's HTTP status for a client the proxy names ``forwarded_for``."""
    try:
        async with connect(srv.url, compression=None,
                           additional_headers={"X-Forwarded-For": forwarded_for}) as ws:
            assert isinstance(await recv_message(ws), Ready)
    except InvalidStatus as exc:
        return exc.response.status_code
    return 101


@pytest.mark.parametrize("trusted", [True, False], ids=["trusted-proxy", "untrusted-peer"])
async def test_per_client_limits_behind_a_proxy(trusted: bool) -> None:
    # the test's connections come from 127.0.0.1: the proxy, or a peer nobody trusts
    proxy = "127.0.0.1" if trusted else "192.0.2.1"
    srv = ServerThread.with_settings(server={"forwarded_allow_ips": proxy},
                                     admission={"connections_per_minute": 2}).start()
    try:
        assert [await _handshake(srv, "198.51.100.7") for _ in range(2)] == [101, 101]
        if trusted:  # each forwarded client has its own budget
            assert await _handshake(srv, "198.51.100.7") == 429
            assert await _handshake(srv, "198.51.100.8, 127.0.0.1") == 101
        else:  # the header is ignored: every client is the peer's address
            assert await _handshake(srv, "198.51.100.8") == 429
    finally:
        srv.stop()
