from __future__ import annotations

import importlib.util
import os

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
