"""What Piper voices can do (``ready.voice_info``, ``GET /v1/voices``).

One place per family: a feature that lands flips its line here.
"""

from __future__ import annotations

from rtserver.protocol.messages import WORD_TIMING_ESTIMATED, VoiceCapabilities

CAPABILITIES = VoiceCapabilities(
    word_timing=WORD_TIMING_ESTIMATED,  # spread by characters (planned: the model's durations)
    lexicon=(),  # planned: ("alias", "phoneme")
    ssml=(),  # planned: ("break", "sub", "phoneme", "prosody")
    control_tokens=(),
    speed=False,  # planned: length_scale per context
    lora=False,
)
