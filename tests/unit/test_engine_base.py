"""Engine seam: histogram snapshots and the Prometheus collector's exposition."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator

import numpy as np
import numpy.typing as npt
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from rtserver.engine.base import (
    CodeDelta,
    EngineCollector,
    EngineStats,
    EngineTally,
    HistogramAccumulator,
    MultiCodebookEngine,
    PromptEmbedding,
    TokenRequest,
    TokenTimes,
)


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


def test_code_delta_holds_steps_of_equal_width_and_matching_hidden_rows() -> None:
    hidden = np.zeros((2, 8), dtype=np.float32)
    delta = CodeDelta(codes=((1, 2, 3, 4), (5, 6, 7, 8)), hidden=hidden)
    assert delta.codebooks == 4 and delta.hidden is hidden  # no copy of the array
    assert CodeDelta(codes=((9,),)).hidden is None
    with pytest.raises(ValueError, match="same number"):
        CodeDelta(codes=((1, 2), (3,)))
    with pytest.raises(ValueError, match="at least one step"):
        CodeDelta(codes=())
    with pytest.raises(ValueError, match="3 rows for 2 steps"):
        CodeDelta(codes=((1,), (2,)), hidden=np.zeros((3, 8)))


async def test_a_multi_codebook_engine_streams_code_deltas_through_the_protocol() -> None:
    class FakeMultiEngine:
        """Four codebooks, two steps per delta, hidden states on request."""

        def __init__(self) -> None:
            self.aborted: list[str] = []

        async def start(self) -> None:
            return None

        async def generate(self, request: TokenRequest
                           ) -> AsyncGenerator[CodeDelta[npt.NDArray[np.float32]], None]:
            try:
                for step in range(0, request.max_tokens, 2):
                    rows = ((step, 1, 2, 3), (step + 1, 1, 2, 3))
                    yield CodeDelta(rows, np.ones((2, 4), np.float32)
                                    if request.want_hidden else None)
            finally:
                self.aborted.append(request.request_id)

        async def abort(self, request_id: str) -> None:
            self.aborted.append(request_id)

        def stats(self) -> EngineStats:
            return EngineStats()

        async def close(self) -> None:
            return None

    engine: MultiCodebookEngine[npt.NDArray[np.float32]] = FakeMultiEngine()
    request = TokenRequest("r1", (1, 2), max_tokens=8, want_hidden=True,
                           embeddings=(PromptEmbedding(7, (0.5,) * 4),))
    firsts: list[int] = []
    async with contextlib.aclosing(engine.generate(request)) as stream:
        async for delta in stream:
            assert delta.hidden is not None and delta.hidden.shape == (2, 4)
            firsts += [codes[0] for codes in delta.codes]
            if len(firsts) == 4:
                break  # the consumer stops early: closing ends the request
    assert firsts == [0, 1, 2, 3]


def test_token_times_count_each_milestone_once_whatever_the_delta_sizes() -> None:
    times = TokenTimes()
    # one request in deltas of 1, 5, 30 tokens; another whose first delta holds 28
    for before, after, at in ((0, 1, 0.01), (1, 6, 0.02), (6, 36, 0.2), (0, 28, 0.5)):
        times.observe(before, after, at)
    times.observe(36, 40, 0.3)  # past every milestone: nothing
    ttft, t7, t28 = (h.snapshot() for h in (times.ttft, times.t7, times.t28))
    assert (ttft.count, t7.count, t28.count) == (2, 2, 2)
    assert abs(ttft.total - 0.51) < 1e-9
    assert abs(t7.total - 0.7) < 1e-9  # the delta that carried the 7th: 0.2 and 0.5
    assert abs(t28.total - 0.7) < 1e-9


def test_a_tally_snapshots_every_count_into_its_own_field() -> None:
    t = EngineTally()
    (t.running, t.waiting, t.kv_cache_usage, t.requests, t.aborted, t.failed, t.prompt_tokens,
     t.generation_tokens, t.prefix_queries, t.prefix_hits, t.preemptions) = (
        1, 2, 0.5, 3, 4, 5, 6, 7, 8, 9, 10)
    t.times.observe(0, 28, 0.1)
    s = t.snapshot(in_flight=11)
    assert (s.running, s.waiting, s.kv_cache_usage, s.requests_total, s.aborted_total,
            s.failed_total, s.prompt_tokens_total, s.generation_tokens_total,
            s.prefix_cache_queries_total, s.prefix_cache_hits_total, s.preemptions_total,
            s.in_flight) == (1, 2, 0.5, 3, 4, 5, 6, 7, 8, 9, 10, 11)
    assert (s.ttft.count, s.t7.count, s.t28.count) == (1, 1, 1)
