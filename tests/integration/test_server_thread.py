"""ServerThread (rtserver/testing), which every server test stands on: a start
that fails, stop at any time, call() on the server's loop."""

from __future__ import annotations

import pytest

from rtserver.errors import ConfigError
from rtserver.testing.server_thread import ServerThread


def test_a_failed_start_reports_its_error_and_stops_cleanly() -> None:
    srv = ServerThread.with_settings(voice={"default": "/nonexistent/voice.onnx"})
    with pytest.raises(RuntimeError, match="failed to start") as exc:
        srv.start()
    assert isinstance(exc.value.__cause__, ConfigError), repr(exc.value.__cause__)
    assert "does not exist" in str(exc.value.__cause__)
    # start() returned once the thread had ended and asyncio.run had closed its
    # loop: the case where stop() used to raise 'Event loop is closed'
    assert not srv._thread.is_alive()
    srv.stop()
    srv.stop()
    with pytest.raises(RuntimeError, match="not running"):
        srv.call(lambda: 1)


def test_stop_before_start_does_nothing() -> None:
    ServerThread.with_settings().stop()


def test_call_returns_the_result_or_raises_the_error(server: ServerThread) -> None:
    assert server.call(lambda: 6 * 7) == 42
    with pytest.raises(ZeroDivisionError):
        server.call(lambda: 1 // 0)
