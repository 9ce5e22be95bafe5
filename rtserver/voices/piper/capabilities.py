"""What Piper voices can do (``ready.voice_info``, ``GET /v1/voices``).

One place per family: a feature that lands flips its line here. Word
timing, lexicon, SSML and speed are filled in per voice from its
``VoiceInfo.word_timing`` and ``VoiceInfo.controls`` (``VoiceInfo.describe``).
"""

from __future__ import annotations

from rtserver.protocol.messages import VoiceCapabilities

CAPABILITIES = VoiceCapabilities(
    control_tokens=(),
    lora=False,
)
