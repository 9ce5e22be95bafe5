"""The phrase cache: a repeated (voice, text, format, options) answers from memory.

An LRU of finished, encoded phrases bounded in bytes, so greetings and fixed
prompts start at once. The key holds every request field that changes the
audio (voice, text, format, sample rate, speed, and any other option the
caller names), so a phrase is never served for different options. Only
phrases that finished normally are stored (the caller puts them at the end);
a cancelled or failed one never is. Sans-I/O: no clock, no asyncio.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

# Bookkeeping per entry besides its audio and text (the key's strings, the
# dict slot, the tuple): a few hundred bytes in CPython; counted so that a
# cache of tiny phrases is bounded too.
ENTRY_OVERHEAD_BYTES = 256
# One phrase may take at most this share of the cache, so a single long text
# cannot evict every greeting.
MAX_ENTRY_SHARE = 4


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """``[cache]``: the phrase cache's size; 0 turns it off."""

    max_mb: float = 64.0

    def __post_init__(self) -> None:
        if self.max_mb < 0:
            raise ValueError(f"cache max_mb must be >= 0, not {self.max_mb}")


@dataclass(frozen=True, slots=True)
class PhraseKey:
    """Everything that decides a phrase's audio; ``options`` holds the rest of
    the request's audio settings as sorted (name, value) pairs."""

    voice: str
    text: str
    format: str
    sample_rate: int
    options: tuple[tuple[str, str], ...] = ()

    @staticmethod
    def of(voice: str, text: str, fmt: str, sample_rate: int, **options: object) -> PhraseKey:
        return PhraseKey(voice, text, fmt, sample_rate,
                         tuple(sorted((k, repr(v)) for k, v in options.items())))


@dataclass(frozen=True, slots=True)
class CachedPhrase:
    """The encoded file in the pieces it was produced in, and its length."""

    chunks: tuple[bytes, ...]
    audio_ms: float

    @property
    def nbytes(self) -> int:
        return sum(len(c) for c in self.chunks)


class CacheMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.hits = Counter("rtserver_phrase_cache_hits_total",
                            "Requests answered from the phrase cache", registry=registry)
        self.misses = Counter("rtserver_phrase_cache_misses_total",
                              "Cacheable requests not in the phrase cache", registry=registry)
        self.bytes = Gauge("rtserver_phrase_cache_bytes",
                           "Bytes held by the phrase cache", registry=registry)
        self.entries = Gauge("rtserver_phrase_cache_entries",
                             "Phrases held by the phrase cache", registry=registry)


class PhraseCache:
    """LRU of ``PhraseKey`` -> ``CachedPhrase`` holding at most ``max_bytes``."""

    def __init__(self, max_bytes: int, metrics: CacheMetrics | None = None) -> None:
        self.max_bytes = max_bytes
        self.metrics = metrics
        self._items: OrderedDict[PhraseKey, CachedPhrase] = OrderedDict()
        self._bytes = 0

    @classmethod
    def from_config(cls, config: CacheConfig, registry: CollectorRegistry) -> PhraseCache:
        return cls(int(config.max_mb * 1024 * 1024), CacheMetrics(registry))

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    @property
    def max_entry_bytes(self) -> int:
        """The largest phrase ``put`` stores (its share of the cache)."""
        return self.max_bytes // MAX_ENTRY_SHARE

    def __len__(self) -> int:
        return len(self._items)

    @staticmethod
    def cost(key: PhraseKey, phrase: CachedPhrase) -> int:
        return phrase.nbytes + len(key.text.encode()) + ENTRY_OVERHEAD_BYTES

    def get(self, key: PhraseKey) -> CachedPhrase | None:
        """The phrase for exactly ``key`` (now the most recent), or None."""
        if not self.enabled:
            return None
        phrase = self._items.get(key)
        if phrase is None:
            if self.metrics:
                self.metrics.misses.inc()
            return None
        self._items.move_to_end(key)
        if self.metrics:
            self.metrics.hits.inc()
        return phrase

    def put(self, key: PhraseKey, phrase: CachedPhrase) -> bool:
        """Store a finished phrase, evicting the least recently used; False
        when it is larger than its share of the cache (not stored)."""
        cost = self.cost(key, phrase)
        if not self.enabled or cost > self.max_entry_bytes:
            return False
        old = self._items.pop(key, None)
        if old is not None:
            self._bytes -= self.cost(key, old)
        self._items[key] = phrase
        self._bytes += cost
        while self._bytes > self.max_bytes:
            k, v = self._items.popitem(last=False)
            self._bytes -= self.cost(k, v)
        self._publish()
        return True

    def drop_voice(self, voice: str) -> int:
        """Forget every phrase of ``voice`` (removed at run time: a new voice
        may take its name); returns how many."""
        keys = [k for k in self._items if k.voice == voice]
        for k in keys:
            self._bytes -= self.cost(k, self._items.pop(k))
        self._publish()
        return len(keys)

    def _publish(self) -> None:
        if self.metrics:
            self.metrics.bytes.set(self._bytes)
            self.metrics.entries.set(len(self._items))


__all__ = ["CacheConfig", "CacheMetrics", "CachedPhrase", "PhraseCache", "PhraseKey"]
