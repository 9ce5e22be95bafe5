"""What ChatTTS voices can do (``ready.voice_info``, ``GET /v1/voices``).

One place per family: a feature that lands flips its line here. Word
timing, lexicon, SSML and speed are filled in per voice from its
``VoiceInfo.word_timing`` and ``VoiceInfo.controls`` (``VoiceInfo.describe``).
"""

from __future__ import annotations

from rtserver.protocol.messages import VoiceCapabilities

CAPABILITIES = VoiceCapabilities(
    # Bracket tags pass the normalizers to the model as they are (upstream's
    # in-text tokens; voices/chattts/text.py keeps every [...] run).
    control_tokens=("[laugh]", "[uv_break]", "[v_break]", "[lbreak]"),
    lora=False,
)
