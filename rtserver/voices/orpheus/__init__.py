"""The Orpheus family: a Llama that writes SNAC codec ids, served by vLLM.

``voice`` (the voice, its config and the registry entry), ``codes`` (codec ids
in the vocabulary, 7 per 85 ms frame), ``layout`` (the model folder; the dummy
weights' config), ``snac_model`` and ``snac_stream`` (the chunked, batched
SNAC vocoder).
"""
