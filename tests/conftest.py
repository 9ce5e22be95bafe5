from __future__ import annotations

import importlib.util
import os

# vLLM on CPU (slow tests) must stay small; harmless for the rest.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

# tests/parity runs upstream ChatTTS, which imports only in the parity venv
# (scripts/setup-parity.sh); tests/unit/test_chattts_parity.py runs it there.
if importlib.util.find_spec("ChatTTS") is None:
    collect_ignore = ["parity"]
