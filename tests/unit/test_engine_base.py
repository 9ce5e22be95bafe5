"""Engine seam: histogram snapshots and the Prometheus collector's exposition."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from rtserver.engine.base import EngineCollector, EngineStats, HistogramAccumulator


def test_histogram_buckets_and_cumulative_counts() -> None:
    h = HistogramAccumulator(bounds=(0.01, 0.1))
    for v in (0.005, 0.01, 0.05, 3.0):
        h.observe(v)
    snap = h.snapshot()
    assert snap.counts == (2, 1, 1)  # <= 0.01, (0.01, 0.1], above
    assert snap.count == 4 and abs(snap.total - 3.065) < 1e-9
    assert snap.cumulative() == [("0.01", 2), ("0.1", 3), ("+Inf", 4)]


def test_collector_exposes_engine_stats() -> None:
    h = HistogramAccumulator()
    h.observe(0.012)
    stats = EngineStats(running=3, waiting=2, kv_cache_usage=0.25, in_flight=5,
                        generation_tokens_total=700, ttft=h.snapshot())
    registry = CollectorRegistry()
    registry.register(EngineCollector(lambda: stats, engine="vllm"))
    text = generate_latest(registry).decode()
    assert 'rtserver_engine_running_requests{engine="vllm"} 3.0' in text
    assert 'rtserver_engine_waiting_requests{engine="vllm"} 2.0' in text
    assert 'rtserver_engine_kv_cache_usage{engine="vllm"} 0.25' in text
    assert 'rtserver_engine_generation_tokens_total{engine="vllm"} 700.0' in text
    assert 'rtserver_engine_time_to_first_token_seconds_bucket{engine="vllm",le="0.01"} 0.0' \
        in text
    assert 'rtserver_engine_time_to_first_token_seconds_bucket{engine="vllm",le="0.02"} 1.0' \
        in text
    assert 'rtserver_engine_time_to_first_token_seconds_count{engine="vllm"} 1.0' in text
    assert 'rtserver_engine_time_to_7_tokens_seconds_count{engine="vllm"} 0.0' in text


def test_collector_exposes_time_to_7_and_28_tokens() -> None:
    t7, t28 = HistogramAccumulator(), HistogramAccumulator()
    t7.observe(0.04)
    t28.observe(0.16)
    t28.observe(0.25)
    registry = CollectorRegistry()
    registry.register(EngineCollector(lambda: EngineStats(t7=t7.snapshot(), t28=t28.snapshot()),
                                      engine="vllm"))
    text = generate_latest(registry).decode()
    assert 'rtserver_engine_time_to_7_tokens_seconds_bucket{engine="vllm",le="0.05"} 1.0' in text
    assert 'rtserver_engine_time_to_7_tokens_seconds_bucket{engine="vllm",le="0.03"} 0.0' in text
    assert 'rtserver_engine_time_to_28_tokens_seconds_bucket{engine="vllm",le="0.2"} 1.0' in text
    assert 'rtserver_engine_time_to_28_tokens_seconds_count{engine="vllm"} 2.0' in text
    assert 'rtserver_engine_time_to_28_tokens_seconds_sum{engine="vllm"} 0.41' in text
