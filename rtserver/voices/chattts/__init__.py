"""ChatTTS voices (``chattts:<speaker>``): the upstream loader (``assets``),
speaker strings (``speaker``), text and prompt layout (``text``), and the voice
on rtserver's torch engine with chattts-dec's streaming decoder (``voice``)."""
