from __future__ import annotations

import fcntl
import importlib.util
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from rtserver.voices.chattts.assets import LmAssets

# The suite is deterministic: property tests draw the same examples on every run
# (hypothesis' default draws new ones each run, so two fresh clones could fail on
# different examples). `HYPOTHESIS_PROFILE=explore pytest ...` draws fresh random
# examples to hunt for bugs; a failure found that way becomes a plain test. The
# parity venv (tests/parity, scripts/setup-parity.sh) has no hypothesis.
if importlib.util.find_spec("hypothesis") is not None:
    from hypothesis import settings

    settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
    settings.register_profile("explore", database=None, print_blob=True)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# vLLM on CPU (slow tests) must stay small; harmless for the rest.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

# tests/parity runs upstream ChatTTS, which imports only in the parity venv
# (scripts/setup-parity.sh); tests/unit/test_chattts_parity.py runs it there.
if importlib.util.find_spec("ChatTTS") is None:
    collect_ignore = ["parity"]

# Two pytest-xdist workers (scripts/test.sh) share the machine's cores. A browser
# test plays audio in real time and asserts it never ran dry, as on a machine
# where the server has its cores to itself; so it runs alone: it holds this run's
# lock exclusively from its set-up to its tear-down, every other test holds it
# shared (fcntl locks: released with the process, whatever ends it).
@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:
        return (yield)
    mode = fcntl.LOCK_EX if item.get_closest_marker("browser") else fcntl.LOCK_SH
    with (Path(tempfile.gettempdir()) / f"rtserver-tests-{run}.lock").open("a") as lock:
        fcntl.flock(lock, mode)
        try:
            return (yield)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> LmAssets:
    """The tiny ChatTTS checkpoint's GPT side (no decoder), written once a test
    module (the torch engine's tests; torch imported only when asked for)."""
    from rtserver.tools.layouts.chattts import write_tiny_chattts
    from rtserver.voices.chattts.assets import load_lm_assets

    root = tmp_path_factory.mktemp("chattts")
    write_tiny_chattts(root, decoder=False)
    return load_lm_assets(root)
