"""Audio: PCM chunks, resampling, Opus framing."""
