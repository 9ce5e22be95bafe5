from __future__ import annotations

import os

# vLLM on CPU (slow tests) must stay small; harmless for the rest.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
