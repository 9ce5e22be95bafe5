"""A real rtserver on 127.0.0.1 in a background thread with its own loop.

Tests and benchmarks connect to it like any client would. ``ServerThread``
starts the server, waits until it is ready (voices warmed), and stops it.

The thread's loop is handed out only while ``_serve`` runs on it, under a
lock: ``stop()`` and ``call()`` never post to a loop that is closing or
closed (a start that failed ends the thread at once, and ``asyncio.run``
closes its loop behind it). A start that failed is reported by ``start()``
(``RuntimeError`` from the start's own error) once the thread has released
what the start had opened; ``stop()`` afterwards is a no-op. A failure while
serving or closing is reported by ``stop()``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from rtserver.config import Config, load_config
from rtserver.server.app import RtServer
from rtserver.testing.wait import scaled

T = TypeVar("T")


class ServerThread:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.server: RtServer | None = None
        self._lock = threading.Lock()  # guards _loop, _stop and _stopping
        self._loop: asyncio.AbstractEventLoop | None = None  # set only while _serve runs
        self._stop: asyncio.Event | None = None
        self._stopping = False
        self._ready = threading.Event()  # set once the start succeeded, failed or the thread ended
        self._started = False  # the server's start succeeded
        self._start_error: BaseException | None = None
        self._error: BaseException | None = None  # the thread's error after a good start
        self._thread = threading.Thread(target=self._main, name="rtserver", daemon=True)

    @classmethod
    def with_settings(cls, **sections: dict[str, Any]) -> ServerThread:
        """``with_settings(server={"overload_after_s": 1})``: loopback, free port."""
        flags = {"server.host": "127.0.0.1", "server.port": 0}
        for section, values in sections.items():
            flags.update({f"{section}.{k}": v for k, v in values.items()})
        return cls(load_config(env={}, flags=flags))

    def start(self, timeout: float = 120.0) -> ServerThread:
        """Start and wait until ready (``timeout`` is scaled, ``rtserver.testing.wait``).
        A failed start raises ``RuntimeError`` from the start's error, after the
        thread has ended; ``TimeoutError`` if it is still starting at the limit."""
        self._thread.start()
        if not self._ready.wait(scaled(timeout)):
            raise TimeoutError(f"rtserver did not become ready in {scaled(timeout):.0f} s")
        if not self._started:
            self._join(30.0)  # the thread has closed what the start opened
            raise RuntimeError(f"rtserver failed to start: {self._start_error}") \
                from self._start_error
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

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the server's loop; its future (``RuntimeError`` if
        the server is not running)."""
        with self._lock:
            if self._loop is None:
                coro.close()
                raise RuntimeError("rtserver is not running")
            return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def call(self, fn: Callable[[], T], timeout: float = 10.0) -> T:
        """Run ``fn()`` on the server's loop and return its result or raise its
        error (for inspection); ``TimeoutError`` after ``scaled(timeout)``."""

        async def run() -> T:
            return fn()

        return self.submit(run()).result(scaled(timeout))

    def stop(self, timeout: float = 30.0) -> None:
        """Close the server and end the thread (any time, also after a failed
        or timed-out start, and twice). Raises what failed while it served or
        closed, or ``TimeoutError`` if the thread did not end in time."""
        with self._lock:
            self._stopping = True
            if self._loop is not None and self._stop is not None:
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread.ident is None:
            return  # never started
        self._join(timeout)
        if self._error is not None:
            error, self._error = self._error, None  # reported once
            raise RuntimeError(f"rtserver failed while serving or closing: {error!r}") \
                from error

    def _join(self, timeout: float) -> None:
        self._thread.join(scaled(timeout))
        if self._thread.is_alive():
            raise TimeoutError(f"the rtserver thread did not end in {scaled(timeout):.0f} s")

    def _main(self) -> None:
        try:
            import uvloop
        except ImportError:
            run: Callable[[Coroutine[Any, Any, None]], None] = asyncio.run
        else:
            run = uvloop.run
        try:
            run(self._serve())
        except BaseException as exc:  # the thread's end: start() or stop() raises it
            if not self._started:
                self._start_error = self._start_error or exc
            else:
                self._error = exc
        finally:
            self._ready.set()  # start() never waits on a thread that has ended

    async def _serve(self) -> None:
        stop = asyncio.Event()
        with self._lock:
            if self._stopping:
                stop.set()  # stop() came before the loop ran
            self._loop, self._stop = asyncio.get_running_loop(), stop
        try:
            cfg = self.config
            if cfg.server.host != "127.0.0.1":
                cfg = dataclasses.replace(cfg, server=dataclasses.replace(cfg.server,
                                                                          host="127.0.0.1"))
            self.server = RtServer(cfg)
            try:
                await self.server.start(progress=lambda m: None)
            except Exception as exc:
                self._start_error = exc
                self._ready.set()
                try:
                    await self.server.close()  # what the start opened (voices, socket)
                except Exception as close_exc:
                    exc.add_note(f"closing after the failed start also failed: {close_exc!r}")
                return
            self._started = True
            self._ready.set()
            await stop.wait()
            await self.server.close()
        finally:
            with self._lock:  # from here on the loop is closing: nobody posts to it
                self._loop = self._stop = None
