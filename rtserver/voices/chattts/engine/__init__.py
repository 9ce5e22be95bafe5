"""rtserver's own torch engine: continuous batching over KV slots for
multi-codebook LMs (ChatTTS' GPT). ``model`` holds the forward pass,
``sampling`` the batched per-request sampler, ``engine`` the scheduler thread
behind the ``TokenEngine`` seam. Needs torch."""
