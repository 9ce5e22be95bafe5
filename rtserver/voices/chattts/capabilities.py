"""What ChatTTS voices can do (``ready.voice_info``, ``GET /v1/voices``).

One place per family: a feature that lands flips its line here.
"""

from __future__ import annotations

from rtserver.protocol.messages import WORD_TIMING_ESTIMATED, VoiceCapabilities

CAPABILITIES = VoiceCapabilities(
    word_timing=WORD_TIMING_ESTIMATED,  # the GPT's steps carry no word boundaries
    lexicon=(),  # planned: ("alias",)
    ssml=(),
    # Bracket tags pass the normalizers to the model as they are (upstream's
    # in-text tokens; voices/chattts/text.py keeps every [...] run).
    control_tokens=("[laugh]", "[uv_break]", "[v_break]", "[lbreak]"),
    speed=False,  # planned: [speed_N] per context
    lora=False,
)
