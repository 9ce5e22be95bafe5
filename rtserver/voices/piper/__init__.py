"""The Piper family: ONNX VITS voices on the CPU, decoded in chunks.

``voice`` (the voice and its graphs), ``graph`` (the split at the decoder),
``blocked`` and ``bf16`` (the decoder's fast layouts), ``plan`` (chunk sizes),
``espeak`` (phonemes), ``synthesis_pool`` (the CPU threads), ``family`` (the
registry entry and the ``[piper]`` section).
"""
