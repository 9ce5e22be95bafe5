"""What Orpheus voices can do (``ready.voice_info``, ``GET /v1/voices``).

One place per family: a feature that lands flips its line here. Word
timing, lexicon, SSML and speed are filled in per voice from its
``VoiceInfo.word_timing`` and ``VoiceInfo.controls`` (``VoiceInfo.describe``). Orpheus'
emotive tags (``<laugh>``, ``<sigh>``) are not control tokens here: the text
normalizer strips tags as HTML before the model sees them.
"""

from __future__ import annotations

import msgspec

from rtserver.protocol.messages import VoiceCapabilities

CAPABILITIES = VoiceCapabilities(
    control_tokens=(),
    lora=False,
)

# A voice that is a LoRA adapter on the base model (``orpheus:<adapter voice>``).
LORA_CAPABILITIES = msgspec.structs.replace(CAPABILITIES, lora=True)
