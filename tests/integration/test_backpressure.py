"""A client that stops reading slows only itself, then is told `overloaded`."""

from __future__ import annotations

import asyncio
import json
import socket

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from rtserver.client import RtClient
from rtserver.protocol.messages import Done, ErrorMessage, parse_server_message
from rtserver.testing.server_thread import ServerThread
from rtserver.testing.wait import scaled, wait_until_async

from .util import metric

LONG = " ".join(["A stalled listener must not slow anyone else down at all."] * 20)


def small_window(srv: ServerThread) -> socket.socket:
    """A socket connected to ``srv`` with a 4 KiB receive buffer: unread audio
    fills it, then the server's, at once."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", srv.port))
    return sock


async def ask_for_long_pcm(ws: ClientConnection) -> None:
    """Wait for ``ready``, then ask for LONG as PCM at 48 kHz (96 kB a second
    of audio: buffers fill at once)."""
    await ws.recv()  # ready
    await ws.send(json.dumps({"type": "start", "context": "s",
                              "format": "pcm_s16le", "sample_rate": 48000}))
    await ws.send(json.dumps({"type": "text", "context": "s", "text": LONG}))
    await ws.send(json.dumps({"type": "end", "context": "s"}))


async def test_stalled_reader_gets_overloaded_and_others_are_unaffected() -> None:
    srv = ServerThread.with_settings(server={
        "overload_after_s": 1.0, "send_queue_ms": 2000, "socket_send_buffer": 16384,
    }).start()
    try:
        async with connect(srv.url, sock=small_window(srv), compression=None, max_size=None,
                           max_queue=1) as stalled:
            await ask_for_long_pcm(stalled)
            # the audio waiting for it shows on /metrics while it is stalled
            await wait_until_async(
                lambda: metric(srv, "rtserver_send_queue_audio_seconds") >= 1.0,
                "the stalled reader's queued audio on /metrics")
            # stop reading; meanwhile another client is served normally
            async with RtClient.connect(srv.url) as other:
                result = await other.say("Everyone else is served as usual.")
            assert result.ok
            # not reading until the server has given up on it (overload_after_s
            # of a send that does not move), by its own count
            await wait_until_async(
                lambda: metric(srv, "rtserver_errors_total", code="overloaded") >= 1,
                "the server finds the stalled reader overloaded")
            codes: list[str] = []
            try:
                while True:
                    msg = await asyncio.wait_for(stalled.recv(), scaled(10))
                    if isinstance(msg, str):
                        message = parse_server_message(msg)
                        if isinstance(message, ErrorMessage):
                            codes.append(message.code)
                        assert not isinstance(message, Done)
            except ConnectionClosed:
                pass
            assert "overloaded" in codes
            assert stalled.close_code == 1013
        await wait_until_async(lambda: metric(srv, "rtserver_send_queue_audio_seconds") == 0,
                               "no audio queued once the stalled reader is gone")
    finally:
        srv.stop()


TCP_CLOSE = 7  # Linux's TCP states (include/net/tcp_states.h): after a reset


def tcp_state(sock: socket.socket) -> int:
    """The socket's TCP state, as the kernel has it (TCP_INFO's first byte)."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]


async def test_a_client_that_reads_nothing_is_dropped_when_its_close_cannot_be_sent() -> None:
    """Overloaded, its error and close frame wait behind audio it never reads;
    past ``close_timeout_s`` the server resets the TCP connection rather than
    keep it (and its unsent audio) open."""
    srv = ServerThread.with_settings(server={
        "overload_after_s": 1.0, "close_timeout_s": 0.5, "socket_send_buffer": 16384,
    }).start()
    try:
        sock = small_window(srv)
        async with connect(srv.url, sock=sock, compression=None, max_size=None,
                           max_queue=1, ping_interval=None) as stalled:
            await ask_for_long_pcm(stalled)  # and from here on it reads nothing
            await wait_until_async(
                lambda: metric(srv, "rtserver_errors_total", code="overloaded") >= 1,
                "the server finds the reader overloaded")
            # its close cannot go out; the connection is reset, not left open
            await wait_until_async(lambda: tcp_state(sock) == TCP_CLOSE,
                                   "the server resets the connection")
            await wait_until_async(lambda: metric(srv, "rtserver_active_connections") == 0,
                                   "the server holds no connection")
            # its queued audio is let go after the connection's slot (another thread)
            await wait_until_async(lambda: metric(srv, "rtserver_send_queue_audio_seconds") == 0,
                                   "no audio queued for it")
            assert stalled.close_code is None  # no close frame ever reached it
    finally:
        srv.stop()
