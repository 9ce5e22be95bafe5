"""The transport: one port for HTTP and the WebSocket, the listening socket's options."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

import pytest

from rtserver.config import ServerConfig
from rtserver.server.app import bind_socket
from rtserver.testing.server_thread import ServerThread


def status_of(url: str, method: str = "GET") -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as err:
        return err.code


def test_reuse_port_lets_two_listeners_share_a_port() -> None:
    first = bind_socket(ServerConfig(host="127.0.0.1", port=0, reuse_port=True))
    port = first.getsockname()[1]
    try:
        second = bind_socket(ServerConfig(host="127.0.0.1", port=port, reuse_port=True))
        second.close()
        with pytest.raises(OSError):
            bind_socket(ServerConfig(host="127.0.0.1", port=port, reuse_port=False))
    finally:
        first.close()


def test_accepted_sockets_inherit_nodelay_and_the_send_buffer() -> None:
    sock = bind_socket(ServerConfig(host="127.0.0.1", port=0, socket_send_buffer=16384))
    sock.setblocking(True)
    try:
        client = socket.create_connection(sock.getsockname(), timeout=5)
        accepted, _ = sock.accept()
        assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        # Linux doubles SO_SNDBUF for bookkeeping (socket(7))
        assert accepted.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == 2 * 16384
        accepted.close()
        client.close()
    finally:
        sock.close()


def test_methods_head_and_unknown_websocket_paths(server: ServerThread) -> None:
    assert status_of(server.http + "/health", "HEAD") == 200
    assert status_of(server.http + "/health", "POST") == 405
    assert status_of(server.http + "/v1/voices", "DELETE") == 405


async def test_a_websocket_to_another_path_is_refused_with_404(server: ServerThread) -> None:
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    with pytest.raises(InvalidStatus) as info:
        async with connect(f"ws://127.0.0.1:{server.port}/elsewhere"):
            pass
    assert info.value.response.status_code == 404
