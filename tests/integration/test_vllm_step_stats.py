"""vLLM's decode step as the engine's stat sink sees it (no engine started):
the per-request inter-token latencies of each step give the step time."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from rtserver.engine.vllm_engine import VllmEngine, VllmEngineConfig
from rtserver.engine.vllm_stats import NoPrometheus, StatSink, stat_loggers

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


def test_vllm_keeps_no_prometheus_logger_of_its_own() -> None:
    """vLLM's own StatLoggerManager, given the engine's loggers: our sink gets
    each step, and vLLM's Prometheus logger (metrics rtserver never serves) is
    not made, so nothing registers vLLM's metrics or records into them."""
    from prometheus_client import REGISTRY
    from vllm.v1.metrics.loggers import PrometheusStatLogger, StatLoggerManager

    engine = VllmEngine(VllmEngineConfig(model="unused"))
    manager = StatLoggerManager(vllm_config=None,  # type: ignore[arg-type]
                                custom_stat_loggers=stat_loggers(engine._live),
                                enable_default_loggers=False)
    prometheus = [lg for lg in manager.stat_loggers if isinstance(lg, PrometheusStatLogger)]
    assert prometheus and all(isinstance(lg, NoPrometheus) for lg in prometheus)
    manager.record(None, step(3, [0.02] * 3))  # type: ignore[arg-type]
    manager.log()
    assert engine.step_counters().steps == 1
    assert not [m for m in REGISTRY.collect() if m.name.startswith("vllm:")]
