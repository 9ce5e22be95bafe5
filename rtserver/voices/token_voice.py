"""What the token-engine voices (Orpheus, ChatTTS) share: the chunk timing a
``VoiceInfo`` advertises, the model-output mark, and the ``"auto"`` device."""

from __future__ import annotations

from rtserver.vocoder.chunking import ChunkConfig, stream_plan
from rtserver.voices.base import MODEL_OUTPUT_MARK, SynthesisRequest

# How many first chunks of a segment ``VoiceInfo.chunk_plan_ms`` lists (the
# hint maths plans the start of a segment with them).
PLANNED_CHUNKS = 8


def chunk_timing(chunking: ChunkConfig | None, sample_rate: int, frame_ms: float
                 ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``(chunk_plan_ms, chunk_cost_ms)`` of a streaming decoder with
    ``chunking`` whose model output is ``frame_ms`` of audio a frame; both
    empty when the decoder does not stream (``chunking`` None)."""
    steps = stream_plan(chunking, PLANNED_CHUNKS) if chunking is not None else []
    return (tuple(1000.0 * n / sample_rate for n, _ in steps),
            tuple(f * frame_ms for _, f in steps))


def mark_model_output(request: SynthesisRequest) -> None:
    """Record the first model output of a segment the core times (``marks``)."""
    if request.marks is not None and MODEL_OUTPUT_MARK not in request.marks:
        request.marks.mark(MODEL_OUTPUT_MARK)


def resolve_device(device: str) -> str:
    """A configured device, ``"auto"`` being CUDA when torch sees a GPU, else CPU."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
