"""A spawned server that never gets ready, or exits first, is reported with
its log's tail: what CI shows is then enough to see where it stopped."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rtserver.tools.bench.server_proc import free_port, spawn

STUCK = "import time; print('loading voice x', flush=True); time.sleep(60)"


def test_a_server_never_ready_is_reported_with_its_log(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"not ready after 1 s; its log:\n.*loading voice x"):
        spawn([sys.executable, "-c", STUCK], free_port(), tmp_path / "server.log",
              ready_timeout_s=1.0)


def test_a_server_that_exits_first_is_reported_with_its_log(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"exited with 3 before ready:\n.*bad config"):
        spawn([sys.executable, "-c", "print('bad config'); raise SystemExit(3)"], free_port(),
              tmp_path / "server.log", ready_timeout_s=30.0)
