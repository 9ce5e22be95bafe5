"""rtserver's own torch engine: continuous batching over KV slots for
multi-codebook LMs (ChatTTS' GPT). ``scheduler`` plans each step (pure Python),
``runner`` runs it on the device (graphs, sampling, stop detection, one copy
out), ``handover`` reads what each request is handed (numpy), ``engine`` is the
``TokenEngine`` seam and the step loop; ``model`` holds the forward pass,
``sampling`` the batched per-request sampler, ``text_lane`` the refine-text
lane. Needs torch (``scheduler`` and ``handover`` do not)."""
