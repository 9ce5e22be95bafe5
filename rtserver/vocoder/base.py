"""The one vocoder seam the token-engine voices use.

A ``Vocoder`` opens a ``VocoderStream`` per segment; the voice pushes the
model's output as it arrives (SNAC code frames, ChatTTS steps with their
hidden states: ``X``) and gets the PCM chunks each push completes, in order;
``finish`` flushes the lookahead at the segment's end; ``close`` frees the
stream's state at once (a cancel). ``PlannedStream`` is the shared
implementation; families differ only in their window type and model.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from rtserver.audio.pcm import PcmChunk

X_contra = TypeVar("X_contra", contravariant=True)


class VocoderStream(Protocol[X_contra]):
    """One segment's decode state."""

    async def push(self, x: X_contra) -> list[PcmChunk]: ...

    async def finish(self) -> list[PcmChunk]: ...

    def close(self) -> None: ...


class Vocoder(Protocol[X_contra]):
    """A loaded vocoder model shared by every stream of a voice family."""

    def open_stream(self, *, first: bool = False,
                    held_s: float | None = None) -> VocoderStream[X_contra]:
        """A segment's stream; ``first``: a context's first segment (the
        vocoder may plan its chunks for it, ``BatchedVocoder.first_chunking``);
        ``held_s``: the audio its listener holds now, before this segment's
        (from the request's ``deadline``; None: not known)."""
        ...

    async def close(self) -> None: ...
