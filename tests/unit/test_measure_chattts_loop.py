"""``measure.chattts_loop``: the loop's CPU per second of ChatTTS audio, measured."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from rtserver.tools.measure.chattts_loop import measure


async def test_users_speak_and_the_loop_cpu_is_counted(tmp_path: Path) -> None:
    cost = await measure(2, 0.5, {"stream_interval": 8}, tmp_path)
    # each user finished at least its first sentence: the tiny model's step budget
    assert cost.audio_s > 2 * 1.0
    assert 0 < cost.loop_cpu_s <= cost.wall_s * 1.05
    assert cost.ms_per_audio_s == pytest.approx(1000 * cost.loop_cpu_s / cost.audio_s)
