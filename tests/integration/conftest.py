from __future__ import annotations

from collections.abc import Iterator

import pytest

from rtserver.testing.server_thread import ServerThread


@pytest.fixture(scope="session")
def server() -> Iterator[ServerThread]:
    """One real server with the embedded Piper voice, shared by the tests."""
    srv = ServerThread.with_settings(server={"max_contexts": 4}).start()
    yield srv
    srv.stop()

