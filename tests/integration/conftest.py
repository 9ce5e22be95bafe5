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


def pytest_configure(config: pytest.Config) -> None:
    """The integrations (integrations/*/) import as their packages would installed."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "integrations"
    for name in ("pipecat", "livekit"):
        path = str(root / name)
        if path not in sys.path:
            sys.path.insert(0, path)
