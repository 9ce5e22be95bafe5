"""A TCP proxy on 127.0.0.1 that a test can cut: what a dropped network looks
like to a client (its connection ends without a WebSocket close), while the
server behind it stays up.

    proxy = await CutProxy.start("127.0.0.1", server_port)
    url = f"ws://127.0.0.1:{proxy.port}/v1/stream"
    ...
    await proxy.cut()          # every connection through it ends now
    proxy.accepted             # connections it has accepted so far
"""

from __future__ import annotations

import asyncio
import contextlib


class CutProxy:
    """Pipes each accepted connection to ``host:port``; ``cut()`` aborts them all."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._server: asyncio.Server | None = None
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self.accepted = 0

    @classmethod
    async def start(cls, host: str, port: int) -> CutProxy:
        proxy = cls(host, port)
        proxy._server = await asyncio.start_server(proxy._accept, "127.0.0.1", 0)
        return proxy

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def open(self) -> int:
        """Connections piped now."""
        return len(self._pairs)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        pair = (writer, up_writer)
        self._pairs.add(pair)
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            self._pairs.discard(pair)
            for w in pair:
                w.transport.abort()

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        dst.transport.abort()  # one side ended: the other ends with it

    async def cut(self) -> None:
        """Abort every connection through the proxy (no close handshake, as a
        network drop); new connections are accepted as before."""
        for client, upstream in list(self._pairs):
            client.transport.abort()
            upstream.transport.abort()

    async def close(self) -> None:
        await self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
