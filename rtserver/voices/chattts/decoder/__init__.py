"""ChatTTS's audio side: GPT hidden states (or DVAE codes) -> mel -> Vocos -> 24 kHz PCM.

Own torch modules that load the upstream ``asset/Decoder.safetensors``,
``asset/DVAE.safetensors`` and ``asset/Vocos.safetensors`` (``checkpoint``),
windowed and batched decoding with exact padding (``model``), the streaming
chunked decode across streams (``stream``), the receptive-field measurement
(``measure``) and a GPU self-check (``selfcheck``). ``config`` is light (no torch).
"""
