"""Token engines: the LM that writes a voice's codec tokens.

``base`` holds the seam (``TokenEngine``, ``TokenRequest``, ``EngineStats``) and
imports nothing heavy; ``vllm_engine`` needs vLLM (and torch).
"""

from rtserver.engine.base import (
    Adapter,
    CodeDelta,
    CyclicTokenMask,
    EngineCollector,
    EngineStats,
    HiddenStates,
    HistogramData,
    LoraEngine,
    MultiCodebookEngine,
    PromptEmbedding,
    SamplingSettings,
    SingleCodebookEngine,
    TokenEngine,
    TokenRequest,
)

__all__ = [
    "Adapter",
    "CodeDelta",
    "CyclicTokenMask",
    "EngineCollector",
    "EngineStats",
    "HiddenStates",
    "HistogramData",
    "LoraEngine",
    "MultiCodebookEngine",
    "PromptEmbedding",
    "SamplingSettings",
    "SingleCodebookEngine",
    "TokenEngine",
    "TokenRequest",
]
