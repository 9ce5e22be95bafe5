"""Chunked, batched codec vocoders (SNAC 24 kHz for Orpheus)."""

from rtserver.vocoder.chunking import ChunkConfig, ChunkPlanner, DecodeJob, SeamJoiner
from rtserver.vocoder.stream import SnacVocoder, VocoderConfig, VocoderStream

__all__ = [
    "ChunkConfig",
    "ChunkPlanner",
    "DecodeJob",
    "SeamJoiner",
    "SnacVocoder",
    "VocoderConfig",
    "VocoderStream",
]
