"""Leak-free stand-ins for two calls of piper-tts's espeak-ng bridge.

piper-tts (1.8.0) phonemizes through its C module ``piper.espeakbridge``,
which leaks on every text:

- ``get_phonemes`` appends each clause's tuple to the list it returns without
  releasing its own reference (``PyList_Append(list, Py_BuildValue(...))``),
  so every clause's tuple and strings live forever (measured: one reference
  too many on each tuple; ~1 KB per call on a corpus reply);
- piper calls ``set_voice`` before every text, and espeak-ng's native memory
  grows by ~1.3 KB a call even when the voice does not change.

``patch_espeakbridge`` puts in the same ``get_phonemes`` through ctypes on
the same library (espeak-ng is linked into the bridge and exports its API),
returning what the bridge returns, and a ``set_voice`` that skips the voice
already set. Piper calls both under its own lock, so the one espeak-ng
state stays consistent. Measured on the bench corpus's replies, 4,000
phonemizations: RSS 73.4 -> 81.4 MB with the bridge's calls, 72.6 flat with
these; and 0.48 ms of CPU per reply instead of 0.62 (no voice reload per
text). ``bench/results/rss-2026-12-03``.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

# espeak-ng's speak_lib.h and translate.h, as piper's espeakbridge.c uses them
_CHARS_AUTO = 0
_PHONEMES_IPA = 0x02
_CLAUSE_TYPE_CLAUSE = 0x00040000
_CLAUSE_TYPE_SENTENCE = 0x00080000
_TERMINATORS = {
    40 | 0x0000 | _CLAUSE_TYPE_SENTENCE: ".",
    40 | 0x2000 | _CLAUSE_TYPE_SENTENCE: "?",
    45 | 0x3000 | _CLAUSE_TYPE_SENTENCE: "!",
    20 | 0x1000 | _CLAUSE_TYPE_CLAUSE: ",",
    30 | 0x0000 | _CLAUSE_TYPE_CLAUSE: ":",
    30 | 0x1000 | _CLAUSE_TYPE_CLAUSE: ";",
}

Clause = tuple[str | None, str, bool]
_lock = threading.Lock()
_patched = False
ORIGINAL: dict[str, Callable[..., Any]] = {}  # the bridge's own calls, once replaced


def phonemes_function(library_path: str) -> Callable[[str], list[Clause]] | None:
    """``get_phonemes`` on the espeak-ng in ``library_path``, or None when the
    library does not export ``espeak_TextToPhonemesWithTerminator``."""
    lib = ctypes.CDLL(library_path)
    fn = getattr(lib, "espeak_TextToPhonemesWithTerminator", None)
    if fn is None:
        return None
    fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_int,
                   ctypes.POINTER(ctypes.c_int)]
    fn.restype = ctypes.c_char_p

    def get_phonemes(text: str) -> list[Clause]:
        """(IPA phonemes, terminator, ends a sentence) per clause of ``text``."""
        if "\0" in text:  # as the bridge's "s" argument format
            raise ValueError("embedded null character")
        data = ctypes.create_string_buffer(text.encode("utf-8"))
        cursor = ctypes.c_void_p(ctypes.addressof(data))
        clauses: list[Clause] = []
        while cursor.value is not None:  # espeak-ng sets it to NULL after the last clause
            terminator = ctypes.c_int(0)
            phonemes = fn(ctypes.byref(cursor), _CHARS_AUTO, _PHONEMES_IPA,
                          ctypes.byref(terminator))
            kind = terminator.value & 0x000FFFFF
            clauses.append((None if phonemes is None else phonemes.decode("utf-8"),
                            _TERMINATORS.get(kind, ""),
                            kind & _CLAUSE_TYPE_SENTENCE == _CLAUSE_TYPE_SENTENCE))
        return clauses

    return get_phonemes


def patch_espeakbridge(bridge: Any) -> bool:
    """Replace the leaking calls of ``bridge`` (the module ``piper.espeakbridge``,
    imported by ``piper.py`` alone), once per process; False when its library
    cannot be called directly (then it is left as it is)."""
    global _patched
    with _lock:
        if _patched:
            return True
        path = getattr(bridge, "__file__", None)
        get_phonemes = phonemes_function(path) if path else None
        if get_phonemes is None:
            return False
        initialize, set_voice = bridge.initialize, bridge.set_voice
        current: list[str | None] = [None]

        def initialize_once(data_dir: str) -> None:
            initialize(data_dir)
            current[0] = None

        def set_voice_once(voice: str) -> None:
            if voice != current[0]:
                set_voice(voice)
                current[0] = voice

        ORIGINAL.update(initialize=initialize, set_voice=set_voice,
                        get_phonemes=bridge.get_phonemes)
        bridge.initialize = initialize_once
        bridge.set_voice = set_voice_once
        bridge.get_phonemes = get_phonemes
        _patched = True
        return True


__all__ = ["ORIGINAL", "patch_espeakbridge", "phonemes_function"]
