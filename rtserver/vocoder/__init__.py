"""Chunked, batched codec vocoders (SNAC 24 kHz for Orpheus).

Import from the modules: ``rtserver.vocoder.config`` is light; ``stream``,
``batcher`` and ``snac_model`` load torch.
"""
