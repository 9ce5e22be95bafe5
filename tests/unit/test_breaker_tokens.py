"""Circuit breaker, browser tokens, handshake guards (pure, injected time)."""

from __future__ import annotations

import logging
import resource

import pytest

from rtserver.errors import EngineUnavailable
from rtserver.server.breaker import BreakerState, CircuitBreaker
from rtserver.server.guards import (
    Forbidden,
    Unauthorized,
    authenticate,
    bearer,
    check_origin,
    query_token,
)
from rtserver.server.limits import raise_fd_limit
from rtserver.server.tokens import InvalidToken, key_id, match_key, mint, verify


def breaker() -> CircuitBreaker:
    return CircuitBreaker("piper:x", failures=3, cooldown_s=5.0, max_cooldown_s=20.0)


def test_breaker_opens_after_n_failures_in_a_row() -> None:
    b = breaker()
    b.failure(0.0)
    b.failure(0.0)
    b.success(0.0)  # a success resets the count
    b.failure(1.0)
    b.failure(1.0)
    b.admit(1.0)
    assert b.up(1.0)
    b.failure(1.0)
    assert b.state is BreakerState.OPEN and not b.up(1.0)
    with pytest.raises(EngineUnavailable) as info:
        b.admit(2.0, context="c")
    assert info.value.code.value == "engine_failed" and info.value.context == "c"
    assert info.value.retry_after_ms == 4000


def test_half_open_probe_closes_or_reopens_with_longer_cooldown() -> None:
    b = breaker()
    for _ in range(3):
        b.failure(0.0)
    assert b.up(5.0)  # /ready lets traffic back for the probe
    b.admit(5.0)  # the probe
    assert b.state is BreakerState.HALF_OPEN
    with pytest.raises(EngineUnavailable):
        b.admit(5.1)  # one probe at a time
    b.failure(6.0)  # the probe failed: open for 10 s now
    assert b.state is BreakerState.OPEN
    with pytest.raises(EngineUnavailable) as info:
        b.admit(15.0)
    assert info.value.retry_after_ms == 1000
    b.admit(16.0)
    b.success(16.5)
    assert b.state is BreakerState.CLOSED and b.up(16.5)
    for _ in range(3):  # the cool-down is back to 5 s
        b.failure(20.0)
    assert b.retry_after_s(20.0) == pytest.approx(5.0)


def test_a_silent_probe_lets_another_through_after_a_cooldown() -> None:
    b = breaker()
    for _ in range(3):
        b.failure(0.0)
    b.admit(5.0)  # probe, then it was cancelled and reported nothing
    with pytest.raises(EngineUnavailable):
        b.admit(9.0)
    b.admit(10.0)


def test_a_dead_engine_stays_down() -> None:
    b = breaker()
    b.dead("EngineDeadError")
    b.success(0.0)
    assert not b.up(1e9)
    with pytest.raises(EngineUnavailable) as info:
        b.admit(1e9)
    assert info.value.retry_after_ms is None and "EngineDeadError" in info.value.message


SECRET = b"s" * 32


def test_token_round_trip_expiry_and_scope() -> None:
    token, claims = mint(SECRET, "key:abc", ["stream"], ttl_s=300, now=1000.0)
    assert verify(SECRET, token, "stream", now=1299.0) == claims
    with pytest.raises(InvalidToken, match="expired"):
        verify(SECRET, token, "stream", now=1300.0)
    with pytest.raises(InvalidToken, match="not valid"):
        verify(SECRET, token, "speech", now=1000.0)
    with pytest.raises(InvalidToken, match="signature"):
        verify(b"t" * 32, token, "stream", now=1000.0)


def test_a_token_cannot_be_altered() -> None:
    token, _ = mint(SECRET, "key:abc", ["stream"], ttl_s=300, now=0.0)
    prefix, body, sig = token.split(".")
    for bad in [f"{prefix}.{body}x.{sig}", f"{prefix}.{body}.{sig[:-2]}",
                f"{prefix}.{body[::-1]}.{sig}", "rt1.", "rt1.a.b", "", "x" * 5000,
                token.replace("rt1.", "rt2.")]:
        with pytest.raises(InvalidToken):
            verify(SECRET, bad, "stream", now=0.0)


def test_keys_match_in_full() -> None:
    keys = ["alpha-key", "beta-key"]
    assert match_key("beta-key", keys) == "beta-key"
    assert match_key("beta-ke", keys) is None
    assert match_key("", keys) is None
    assert key_id("alpha-key") != key_id("beta-key")
    assert "alpha" not in key_id("alpha-key")


def test_authenticate_keys_tokens_and_addresses() -> None:
    keys = ["k1"]
    assert authenticate("", [], SECRET, 0.0, "10.0.0.1").key == "addr:10.0.0.1"
    ident = authenticate("k1", keys, SECRET, 0.0, "10.0.0.1")
    assert ident.key == key_id("k1") and ident.authenticated
    token, _ = mint(SECRET, key_id("k1"), ["stream"], 60, now=0.0)
    assert authenticate(token, keys, SECRET, 10.0, "10.0.0.2").key == key_id("k1")
    for bad in ["", "k2", token + "x"]:
        with pytest.raises(Unauthorized):
            authenticate(bad, keys, SECRET, 10.0, "10.0.0.1")
    with pytest.raises(Unauthorized):  # expired
        authenticate(token, keys, SECRET, 60.0, "10.0.0.1")
    assert bearer("Bearer  abc ") == "abc" and bearer("Basic abc") == "" and bearer(None) == ""
    assert query_token("a=1&token=xyz") == "xyz" and query_token("") == ""


def test_origin_allow_list() -> None:
    allowed = ["https://app.example"]
    check_origin("https://app.example", allowed)
    check_origin("HTTPS://APP.EXAMPLE/", allowed)
    check_origin(None, allowed)  # not a browser
    check_origin("https://evil.example", [])  # no list: anyone
    for bad in ["null", "https://evil.example", "https://app.example:8443",
                "http://app.example"]:
        with pytest.raises(Forbidden):
            check_origin(bad, allowed)


def test_fd_limit_is_raised_toward_the_wanted_count(caplog: pytest.LogCaptureFixture) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        lower = min(soft, 256)
        resource.setrlimit(resource.RLIMIT_NOFILE, (lower, hard))
        wanted = lower + 100 if hard == resource.RLIM_INFINITY else min(lower + 100, hard)
        with caplog.at_level(logging.INFO, logger="rtserver.server"):
            before, now = raise_fd_limit(wanted)
        assert before == lower and now == wanted
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == wanted
        assert "open files" in caplog.text
        assert raise_fd_limit(10) == (wanted, wanted)  # never lowered
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
