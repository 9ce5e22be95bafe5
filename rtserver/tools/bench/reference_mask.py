"""The audio-token constraint for the reference Orpheus code on random weights.

The reference (``orpheus_tts``) builds its own ``SamplingParams``, so the
per-request mask rtserver passes in ``extra_args`` never reaches it. This vLLM
logits processor applies the same Orpheus layout to *every* request: output
position ``i`` samples an audio token of slot ``i % 7``, and end of speech is
allowed at frame boundaries. With random weights both sides then emit audio
tokens at the same per-token cost. Loaded by vLLM's worker by name:
``logits_processors=["rtserver.tools.bench.reference_mask:AudioOnlyMask"]``.

Two differences from rtserver's ``AUDIO_MASK``, both so that the reference's
own decoder does not trip over random codes (it would on real weights too,
more rarely): code 0 of every slot is left out (``tokens_decoder`` drops a
code 0 with ``if token > 0``, which shifts every later slot by one), and only
``END_OF_SPEECH`` ends a request (vLLM stops on it through the checkpoint's
``generation_config.json``; the reference's own stop id 49158 is not an audio
token, and ``END_OF_AI`` would be decoded as a misplaced code).
"""

from __future__ import annotations

from typing import Any

from rtserver.engine.vllm_mask import CyclicMaskLogitsProcessor
from rtserver.voices.orpheus import codes as ot

REFERENCE_MASK_KEY: tuple[Any, ...] = (
    tuple((lo + 1, hi) for lo, hi in (ot.slot_range(s) for s in range(ot.FRAME_TOKENS))),
    (ot.END_OF_SPEECH,),
)


class AudioOnlyMask(CyclicMaskLogitsProcessor):
    """``CyclicMaskLogitsProcessor`` with one fixed mask for every request."""

    def _key_for(self, params: Any) -> tuple[Any, ...] | None:
        return REFERENCE_MASK_KEY
