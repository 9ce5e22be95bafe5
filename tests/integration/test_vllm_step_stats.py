"""vLLM's decode step as the engine's stat sink sees it (no engine started):
the per-request inter-token latencies of each step give the step time."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from rtserver.engine.vllm_engine import VllmEngine, VllmEngineConfig
from rtserver.engine.vllm_stats import StatSink

pytestmark = [pytest.mark.vllm]


def step(tokens: int, itl: list[float], prompt: int = 0) -> SimpleNamespace:
    return SimpleNamespace(num_prompt_tokens=prompt, num_generation_tokens=tokens,
                           num_preempted_reqs=0, inter_token_latencies_iter=itl)


def test_step_time_and_batch_over_a_window() -> None:
    engine = VllmEngine(VllmEngineConfig(model="unused"))
    sink = StatSink(None, live=engine._live)  # type: ignore[arg-type]
    sink.record(None, step(4, [0.5] * 4))  # before the window
    before = engine.step_counters()
    sink.record(None, step(3, [0.020, 0.020, 0.020]))  # 3 requests decoding, 20 ms steps
    sink.record(None, step(0, []))  # an output with no tokens is no step
    sink.record(None, step(3, [0.030, 0.030, 0.030]))
    # a request's first token, with its prompt's 40 tokens: a step that held a prefill
    sink.record(None, step(4, [0.025] * 3, prompt=40))
    window = engine.step_counters().since(before)
    assert window == {"steps": 3, "tokens_per_step": 3.33, "step_ms": 25.0,
                      "prefill_step_share": 0.333}
    assert engine.step_counters().prefill_steps == 1
    assert engine.step_counters().since(engine.step_counters()) == {
        "steps": 0, "tokens_per_step": 0.0, "step_ms": 0.0, "prefill_step_share": 0.0}
