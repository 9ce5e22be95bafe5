"""The torch engine's step counters, without torch: what a step adds, and the
/metrics names a dashboard divides by ``rtserver_engine_steps_total``."""

from __future__ import annotations

import pytest

from rtserver.voices.chattts.engine.counters import PHASES, StepCounters, metric_counters
from rtserver.voices.chattts.engine.scheduler import Chunk, Plan, Seq


def test_each_step_adds_its_rows_prefill_moves_and_host_time_by_phase() -> None:
    a, b = Seq(rid="a", prompt_len=40), Seq(rid="b", prompt_len=300)
    decode = Plan(moves=((5, 1),), move_length=128, rows=(a, a, a), length=128, chunks=(),
                  prefill_tokens=0, prefill_length=0)
    mixed = Plan(moves=(), move_length=0, rows=(a,), length=128,
                 chunks=(Chunk(b, 2, 0, 256, False), Chunk(a, 3, 0, 40, True)),
                 prefill_tokens=512, prefill_length=256)
    c = StepCounters()
    c.count(decode, 0.002, 0.001, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    c.count(mixed, 0.004, 0.003, [0.5] * 6)
    assert (c.steps, c.decode_steps, c.rows, c.moves) == (2, 2, 4, 1)
    assert (c.prefill_batches, c.prefill_tokens, c.prefill_padded) == (1, 296, 512)
    assert (c.host_s, c.host_cpu_s) == pytest.approx((0.006, 0.004))
    assert (c.launch_s, c.launch_cpu_s, c.read_s, c.read_cpu_s, c.post_s, c.post_cpu_s) == \
        pytest.approx((1.5, 2.5, 3.5, 4.5, 5.5, 6.5))
    metrics = metric_counters(c)
    for phase, _ in PHASES:
        assert metrics[f"host_{phase}_seconds"][1] == getattr(c, f"{phase}_s")
        assert metrics[f"host_{phase}_cpu_seconds"][1] == getattr(c, f"{phase}_cpu_s")
    assert metrics["rows"][1] == 4 and metrics["prefill_padded_tokens"][1] == 512
