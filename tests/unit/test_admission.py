"""Admission (pure, injected time): token buckets, per-key rate limits, and
the first-heard-audio admission check (the prediction itself:
test_core_first_heard.py)."""

from __future__ import annotations

import dataclasses

import pytest

from rtserver.config import AdmissionConfig, ServerConfig
from rtserver.errors import (
    Busy,
    ControlFlood,
    EngineUnavailable,
    RateLimited,
    TooManyContexts,
)
from rtserver.server.admission import (
    MIN_PARSE_BYTES,
    InputBudget,
    KeyConcurrency,
    LoadAdmission,
    RateLimits,
    StartAdmission,
    TokenBucket,
)
from rtserver.server.gate import Gate, MessagePace, max_starting, reject_reason


def test_bucket_bursts_then_goes_at_its_rate() -> None:
    b = TokenBucket(per_s=2.0, capacity=4, now=0.0)
    assert [b.take(1, 0.0) for _ in range(4)] == [0.0] * 4
    assert b.take(1, 0.0) == pytest.approx(0.5)  # one token comes in 0.5 s
    assert b.take(1, 0.25) == pytest.approx(0.25)
    assert b.take(1, 0.5) == 0.0
    assert b.take(1, 0.5) > 0


def test_bucket_serves_a_request_larger_than_itself_when_full() -> None:
    b = TokenBucket(per_s=10.0, capacity=10, now=0.0)
    assert b.take(25, 0.0) == 0.0  # served, bucket now 15 in debt
    assert b.take(1, 0.0) == pytest.approx(1.6)  # 16 tokens short at 10/s
    assert b.take(1, 1.6) == 0.0


def limits(**kw: float) -> RateLimits:
    return RateLimits(dataclasses.replace(AdmissionConfig(), **kw))  # type: ignore[arg-type]


def test_contexts_per_minute_per_key_with_retry_after() -> None:
    rl = limits(contexts_per_minute=6)  # 6 a minute: one every 10 s
    for _ in range(6):
        rl.context("alice", now=0.0)
    with pytest.raises(RateLimited) as info:
        rl.context("alice", now=0.0, context="c7")
    err = info.value
    assert err.code.value == "rate_limited" and err.context == "c7"
    assert err.retry_after_ms == 10_000
    rl.context("bob", now=0.0)  # another key is untouched
    rl.context("alice", now=10.0)  # the retry time was right


def test_connections_and_characters() -> None:
    rl = limits(connections_per_minute=2, chars_per_minute=600)
    rl.connection("k", 0.0)
    rl.connection("k", 0.0)
    with pytest.raises(RateLimited) as info:
        rl.connection("k", 0.0)
    assert info.value.retry_after_ms == 30_000
    rl.chars("k", 500, 0.0)
    with pytest.raises(RateLimited) as info:
        rl.chars("k", 200, 0.0)
    assert info.value.retry_after_ms == 10_000  # 100 short at 10 a second
    rl.chars("k", 200, 10.0)


def test_a_zero_rate_is_off() -> None:
    rl = limits(contexts_per_minute=0)
    for _ in range(10_000):
        rl.context("k", 0.0)


def test_keys_are_bounded() -> None:
    rl = limits(rate_keys=100, contexts_per_minute=1)
    for i in range(1000):
        rl.context(f"addr:{i}", 0.0)
    assert len(rl) == 100


def test_key_concurrency_is_per_key_and_frees_on_release() -> None:
    c = KeyConcurrency(limit=2)
    c.acquire("backend")
    c.acquire("backend")
    with pytest.raises(TooManyContexts) as info:
        c.acquire("backend")
    assert info.value.retry_after_ms and info.value.retry_after_ms > 0
    c.acquire("other")  # another key has its own count
    c.release("backend")
    c.acquire("backend")
    assert (c.open("backend"), c.open("other")) == (2, 1)
    for _ in range(2):
        c.release("backend")
    assert c.open("backend") == 0


def test_http_concurrency_is_its_own_limit_not_max_contexts() -> None:
    default = AdmissionConfig().http_requests_per_key
    assert default > ServerConfig().max_contexts  # a backend's one key is not one connection
    c = KeyConcurrency(limit=0)  # off
    for _ in range(1000):
        c.acquire("backend")


def test_load_admission_refuses_over_the_target_with_retry_after() -> None:
    adm = LoadAdmission(dataclasses.replace(AdmissionConfig(), first_heard_target_ms=1000,
                                            retry_min_ms=250, retry_max_ms=5000))
    adm.check(999.0)
    with pytest.raises(Busy) as info:
        adm.check(1100.0, context="c")
    assert info.value.code.value == "overloaded" and info.value.close_code is None
    assert info.value.retry_after_ms == 250  # 100 over: the minimum
    with pytest.raises(Busy) as info:
        adm.check(4000.0)
    assert info.value.retry_after_ms == 3000
    with pytest.raises(Busy) as info:
        adm.check(float("inf"))
    assert info.value.retry_after_ms == 5000


def test_load_admission_off() -> None:
    LoadAdmission(dataclasses.replace(AdmissionConfig(), first_heard_target_ms=0)).check(1e9)


# --- the gate -------------------------------------------------------------------------

def gate(**kw: float) -> Gate:
    return Gate(dataclasses.replace(AdmissionConfig(), **kw), ["v:a", "v:b"])  # type: ignore[arg-type]


def test_gate_start_checks_in_order_and_says_why() -> None:
    g = gate(contexts_per_minute=60, first_heard_target_ms=500, breaker_failures=1)
    g.start("k", "v:a", 0.0, "c1", lambda: 100.0)
    with pytest.raises(Busy) as info:
        g.start("k", "v:a", 0.0, "c2", lambda: 900.0)
    assert reject_reason(info.value) == "overloaded" and info.value.retry_after_ms == 400
    g.voice_failed("v:a", 0.0, "boom")
    with pytest.raises(EngineUnavailable) as e2:
        g.start("k", "v:a", 1.0, "c3", lambda: 100.0)
    assert reject_reason(e2.value) == "breaker_open"
    assert g.ready(1.0) == (False, "voice down: v:a")
    assert not g.engine_up("v:a", 1.0) and g.engine_up("v:b", 1.0)
    g.draining = True
    with pytest.raises(Busy) as e3:
        g.start("k", "v:b", 1.0, "c4", lambda: 100.0)
    assert reject_reason(e3.value) == "draining" and e3.value.retry_after_ms
    assert g.ready(1.0)[0] is False


def test_gate_dead_voice_and_prediction_not_asked_when_off() -> None:
    g = gate(first_heard_target_ms=0)

    def never() -> float:
        raise AssertionError("prediction asked for with the target off")
    g.start("k", "v:a", 0.0, "c", never)
    g.voice_failed("v:b", 0.0, "EngineDead", dead=True)
    assert g.engine_dead and not g.engine_up("v:b", 1e6)


def test_message_pace_throttles_then_calls_a_sustained_flood() -> None:
    cfg = dataclasses.replace(ServerConfig(), messages_per_s=100.0, message_burst=10)
    pace = MessagePace(cfg, 0.0)
    assert [pace.wait_s(0.0) for _ in range(10)] == [0.0] * 10
    now = 0.0
    with pytest.raises(ControlFlood):
        for _ in range(1000):  # a reader that sleeps as told, a client always there
            now += pace.wait_s(now)
    assert 3.0 < now < 3.2
    pace = MessagePace(cfg, 0.0)
    now = 0.0
    for _ in range(2000):  # a client at 90 a second is never called a flood
        assert pace.wait_s(now) == 0.0
        now += 1 / 90


def budget() -> InputBudget:
    # 10,000 B/s in bursts of 40,000; 10 messages/s in bursts of 20
    return InputBudget(bytes_per_s=10_000, byte_burst=40_000, messages_per_s=10,
                       message_burst=20, flood_after_s=1.0, now=0.0)


def test_input_budget_allows_its_burst_then_holds_until_it_refills() -> None:
    b = budget()
    assert b.allowed_bytes(0.0) == 40_000  # the whole byte burst may be parsed at once
    b.spend(40_000, 5, 0.0)
    assert b.allowed_bytes(0.0) == 0  # nothing more before it refills ...
    assert b.wait_s(0.0) == pytest.approx(MIN_PARSE_BYTES / 10_000)  # ... a parse's worth
    assert b.allowed_bytes(0.5) == 5000


def test_messages_counted_after_framing_put_the_budget_in_debt() -> None:
    b = budget()
    b.spend(100, 50, 0.0)  # 50 frames parsed: 30 over the burst of 20, 3 s of debt
    assert b.allowed_bytes(0.0) == 0
    assert b.wait_s(0.0) == pytest.approx(1.0)  # no later than the flood verdict
    assert b.over_since == 0.0


def test_a_connection_held_for_flood_after_s_is_a_flood() -> None:
    b = budget()
    b.spend(40_000, 0, 0.0)
    assert b.allowed_bytes(0.0) == 0  # held from 0 s
    assert b.allowed_bytes(0.5) == 5000  # what came back is parsed ...
    b.spend(5000, 0, 0.5)  # ... and spent at once: still over its budget
    assert b.allowed_bytes(0.9) == 0
    assert b.allowed_bytes(1.0) == 5000
    b.spend(5000, 0, 1.0)  # it spends all it gets, 1 s after it was first held
    with pytest.raises(ControlFlood):
        b.wait_s(1.0)


def test_a_client_that_slows_down_is_not_a_flood() -> None:
    b = budget()
    b.spend(40_000, 20, 0.0)
    assert b.allowed_bytes(0.0) == 0
    # nothing for 3 s: both buckets back above half, the hold forgotten
    assert b.allowed_bytes(3.0) == 30_000
    assert b.over_since is None
    b.spend(30_000, 20, 3.0)
    assert b.allowed_bytes(3.0) == 0  # held again from 3 s: a new count
    assert b.over_since == 3.0
    b.spend(b.allowed_bytes(3.9), 0, 3.9)
    assert b.wait_s(3.9) > 0  # held, and not a flood 0.9 s into it


def test_a_burst_is_let_in_limit_at_a_time_and_the_rest_spread_out() -> None:
    starts = StartAdmission(limit=8, retry_min_ms=250, retry_max_ms=10_000)
    starting = 0
    admitted, retries = 0, []
    for _ in range(24):  # 24 at once: nobody's first audio is out yet
        try:
            starts.check(starting, now=0.0, start_ms=lambda: 300.0)
        except Busy as err:
            assert err.code.value == "overloaded" and err.retry_after_ms is not None
            retries.append(err.retry_after_ms)
        else:
            admitted += 1
            starting += 1
    assert admitted == 8
    # the 16 refused come back in two waves of 8, one start's time apart
    assert retries == [300] * 8 + [600] * 8
    # once their first audio is out, new starts are admitted again
    starts.check(starting=7, now=0.5, start_ms=lambda: 300.0)


def test_start_retry_is_bounded_and_old_refusals_are_forgotten() -> None:
    starts = StartAdmission(limit=1, retry_min_ms=250, retry_max_ms=1000)
    waits = []
    for _ in range(6):
        with pytest.raises(Busy) as info:
            starts.check(1, now=0.0, start_ms=lambda: 0.0)  # nothing measured yet
        waits.append(info.value.retry_after_ms)
    assert waits == [250, 500, 750, 1000, 1000, 1000]
    with pytest.raises(Busy) as info:
        starts.check(1, now=StartAdmission.REFUSALS_WINDOW_S + 0.1, start_ms=lambda: 400.0)
    assert info.value.retry_after_ms == 400


def test_starting_limit_is_sized_per_core_and_can_be_off() -> None:
    assert max_starting(2.0, cores=2) == 4
    assert max_starting(0.0, cores=2) == 0
    StartAdmission(limit=0, retry_min_ms=1, retry_max_ms=2).check(10_000, 0.0, lambda: 1.0)


def test_gate_refuses_a_start_while_too_many_are_starting() -> None:
    g = Gate(dataclasses.replace(AdmissionConfig(), starting_per_core=1.0), ["v"])
    g.starts.limit = 2
    g.starting = lambda now: 2
    with pytest.raises(Busy) as info:
        g.start("k", "v", 0.0, "c", lambda: 120.0)
    assert info.value.retry_after_ms == 250  # at least retry_min_ms
    assert reject_reason(info.value) == "overloaded"
    g.starting = lambda now: 1
    g.start("k", "v", 0.0, "d", lambda: 120.0)


def test_a_batching_gpu_voice_is_not_held_to_the_cpu_start_limit() -> None:
    """The start limit is sized from this machine's cores: it holds voices whose
    CPU work bounds them, not a GPU engine (in process or behind a worker)."""
    g = Gate(dataclasses.replace(AdmissionConfig(), starting_per_core=1.0), ["cpu", "gpu"])
    g.starts.limit = 2
    g.starting = lambda now: 5
    g.start_limited = lambda voice: voice == "cpu"
    g.start("k", "gpu", 0.0, "a", lambda: 120.0)  # admitted: its engine batches
    with pytest.raises(Busy):
        g.start("k", "cpu", 0.0, "b", lambda: 120.0)
