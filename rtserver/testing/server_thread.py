"""A real rtserver on 127.0.0.1 in a background thread with its own loop.

Tests and benchmarks connect to it like any client would. ``ServerThread``
starts the server, waits until it is ready (voices warmed), and stops it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any

from rtserver.config import Config, load_config
from rtserver.server.app import RtServer


class ServerThread:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.server: RtServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="rtserver", daemon=True)

    @classmethod
    def with_settings(cls, **sections: dict[str, Any]) -> ServerThread:
        """``with_settings(server={"overload_after_s": 1})``: loopback, free port."""
        flags = {"server.host": "127.0.0.1", "server.port": 0}
        for section, values in sections.items():
            flags.update({f"{section}.{k}": v for k, v in values.items()})
        return cls(load_config(env={}, flags=flags))

    def start(self, timeout: float = 120.0) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("rtserver did not become ready")
        if self._error is not None:
            raise RuntimeError("rtserver failed to start") from self._error
        return self

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.port

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/stream"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def call(self, fn: Any) -> Any:
        """Run ``fn()`` on the server's loop and return its result (for inspection)."""
        assert self._loop is not None
        done = threading.Event()
        box: list[Any] = []

        def run() -> None:
            box.append(fn())
            done.set()

        self._loop.call_soon_threadsafe(run)
        done.wait(10)
        return box[0]

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=30)

    def _main(self) -> None:
        try:
            import uvloop
        except ImportError:
            asyncio.run(self._serve())
        else:
            uvloop.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        cfg = self.config
        if cfg.server.host != "127.0.0.1":
            cfg = dataclasses.replace(cfg, server=dataclasses.replace(cfg.server,
                                                                      host="127.0.0.1"))
        self.server = RtServer(cfg)
        try:
            await self.server.start(progress=lambda m: None)
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        await self._stop.wait()
        await self.server.close()
