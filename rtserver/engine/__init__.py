"""Token engines: the LM that writes a voice's codec tokens.

``base`` holds the seam (``TokenEngine``, ``TokenRequest``, ``EngineStats``) and
imports nothing heavy; ``vllm_engine`` needs vLLM (and torch).
"""

from rtserver.engine.base import (
    CyclicTokenMask,
    EngineCollector,
    EngineStats,
    HistogramData,
    SamplingSettings,
    TokenEngine,
    TokenRequest,
)

__all__ = [
    "CyclicTokenMask",
    "EngineCollector",
    "EngineStats",
    "HistogramData",
    "SamplingSettings",
    "TokenEngine",
    "TokenRequest",
]
