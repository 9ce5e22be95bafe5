"""What Orpheus voices can do (``ready.voice_info``, ``GET /v1/voices``).

One place per family: a feature that lands flips its line here. Orpheus'
emotive tags (``<laugh>``, ``<sigh>``) are not control tokens here: the text
normalizer strips tags as HTML before the model sees them.
"""

from __future__ import annotations

import msgspec

from rtserver.protocol.messages import WORD_TIMING_ESTIMATED, VoiceCapabilities

CAPABILITIES = VoiceCapabilities(
    word_timing=WORD_TIMING_ESTIMATED,  # the codec tokens carry no word boundaries
    lexicon=(),  # planned: ("alias",)
    ssml=(),
    control_tokens=(),
    speed=False,
    lora=False,
)

# A voice that is a LoRA adapter on the base model (``orpheus:<adapter voice>``).
LORA_CAPABILITIES = msgspec.structs.replace(CAPABILITIES, lora=True)
