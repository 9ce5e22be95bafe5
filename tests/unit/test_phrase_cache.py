"""The phrase cache: LRU bounded in bytes, exact keys, hit/miss metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from rtserver.cache import (
    ENTRY_OVERHEAD_BYTES,
    CacheConfig,
    CachedPhrase,
    PhraseCache,
    PhraseKey,
)


def key(text: str, **options: object) -> PhraseKey:
    return PhraseKey.of("piper:joe", text, "mp3", 24000, **options)


def phrase(nbytes: int) -> CachedPhrase:
    return CachedPhrase(chunks=(b"x" * (nbytes // 2), b"y" * (nbytes - nbytes // 2)),
                        audio_ms=100.0)


def test_hit_returns_the_stored_pieces_and_a_miss_none() -> None:
    cache = PhraseCache(100_000)
    p = phrase(1000)
    assert cache.put(key("Hello there.", speed=1.0), p)
    assert cache.get(key("Hello there.", speed=1.0)) is p
    assert cache.get(key("Hello there!", speed=1.0)) is None


def test_any_option_that_differs_is_a_miss() -> None:
    cache = PhraseCache(100_000)
    cache.put(key("Hi.", speed=1.0), phrase(10))
    assert cache.get(key("Hi.", speed=1.25)) is None
    assert cache.get(key("Hi.")) is None
    assert cache.get(PhraseKey.of("piper:joe", "Hi.", "opus", 24000, speed=1.0)) is None
    assert cache.get(PhraseKey.of("piper:amy", "Hi.", "mp3", 24000, speed=1.0)) is None
    assert cache.get(PhraseKey.of("piper:joe", "Hi.", "mp3", 16000, speed=1.0)) is None
    assert cache.get(key("Hi.", speed=1.0)) is not None


def test_bounded_in_bytes_least_recently_used_goes_first() -> None:
    each = 1000
    cost = each + len(b"t0") + ENTRY_OVERHEAD_BYTES
    cache = PhraseCache(4 * cost)
    for i in range(4):
        assert cache.put(key(f"t{i}"), phrase(each))
    assert cache.nbytes == 4 * cost
    cache.get(key("t0"))  # t0 is now the most recent; t1 the oldest
    cache.put(key("t4"), phrase(each))
    assert cache.get(key("t1")) is None
    assert all(cache.get(key(f"t{i}")) is not None for i in (0, 2, 3, 4))
    assert cache.nbytes <= cache.max_bytes and len(cache) == 4


def test_a_phrase_over_its_share_is_not_stored_and_replacing_recounts() -> None:
    cache = PhraseCache(10_000)
    assert not cache.put(key("long"), phrase(5000))
    assert cache.get(key("long")) is None and cache.nbytes == 0
    cache.put(key("a"), phrase(100))
    cache.put(key("a"), phrase(200))
    assert len(cache) == 1
    assert cache.nbytes == 200 + 1 + ENTRY_OVERHEAD_BYTES


def test_size_zero_turns_it_off() -> None:
    cache = PhraseCache.from_config(CacheConfig(max_mb=0), CollectorRegistry())
    assert not cache.enabled
    assert not cache.put(key("a"), phrase(1))
    assert cache.get(key("a")) is None


def test_hits_misses_and_size_on_metrics() -> None:
    registry = CollectorRegistry()
    cache = PhraseCache.from_config(CacheConfig(max_mb=1), registry)
    cache.get(key("a"))
    cache.put(key("a"), phrase(100))
    cache.get(key("a"))
    cache.get(key("a"))
    text = generate_latest(registry).decode()
    assert "rtserver_phrase_cache_hits_total 2.0" in text
    assert "rtserver_phrase_cache_misses_total 1.0" in text
    assert f"rtserver_phrase_cache_bytes {float(cache.nbytes)}" in text
    assert "rtserver_phrase_cache_entries 1.0" in text
