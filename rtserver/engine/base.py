"""The token engine seam: what a voice asks of the LM that writes its codec tokens.

One interface for every engine (vLLM today; a torch engine for ChatTTS is in
progress); the voice does not know which runs it. Requests and stats are frozen
values; ``generate`` streams deltas as they are sampled. Closing or cancelling
the consumer of ``generate`` aborts the request in the engine (its KV cache is
freed at once); ``abort`` does the same from outside.

The delta type is the engine's parameter: a single-codebook model (Orpheus: one
id per step) yields the ids as they come (``Sequence[int]``, vLLM's own list,
not copied: ``SingleCodebookEngine``); a multi-codebook model (ChatTTS: several
ids per step, and the LM's hidden state the decoder reads) yields ``CodeDelta``
(``MultiCodebookEngine``).
"""

from __future__ import annotations

import bisect
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar, runtime_checkable

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector


@dataclass(frozen=True, slots=True)
class SamplingSettings:
    """Per-voice sampling. Defaults: upstream Orpheus' ``generate_tokens_sync``."""

    temperature: float = 0.6
    top_p: float = 0.8
    top_k: int = 0  # 0: off
    # Orpheus README: "repetition_penalty>=1.1 is required for stable generations".
    repetition_penalty: float = 1.3
    seed: int | None = None  # None: a fresh random stream per request


@dataclass(frozen=True, slots=True)
class CyclicTokenMask:
    """Output position ``i`` may hold a token of ``slot_ranges[i % period]``
    (half-open ``[lo, hi)``), or one of ``end_ids`` when ``i % period == 0``.

    Engines that can mask logits per position enforce it while sampling; the
    others enforce its union (``allowed_ids``), and the voice checks the rest.
    """

    slot_ranges: tuple[tuple[int, int], ...]
    end_ids: tuple[int, ...] = ()

    @property
    def period(self) -> int:
        return len(self.slot_ranges)

    def allowed_ids(self) -> list[int]:
        ids: set[int] = set(self.end_ids)
        for lo, hi in self.slot_ranges:
            ids.update(range(lo, hi))
        return sorted(ids)

    def allows(self, position: int, token_id: int) -> bool:
        slot = position % self.period
        if slot == 0 and token_id in self.end_ids:
            return True
        lo, hi = self.slot_ranges[slot]
        return lo <= token_id < hi


@dataclass(frozen=True, slots=True)
class PromptEmbedding:
    """A vector the engine puts in place of the input embedding wherever the
    prompt holds ``token_id`` (ChatTTS' ``[spk_emb]`` speaker token). Its length
    is the model's hidden size; the engine checks it."""

    token_id: int
    vector: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Adapter:
    """A LoRA adapter in PEFT layout (``adapter_config.json`` +
    ``adapter_model.safetensors`` in ``path``) applied to a request's model.
    ``id``: unique per adapter loaded in the process (>= 1); a new adapter
    under an old name gets a new id. Engines serve only adapters added to them
    (``LoraEngine.add_adapter``), so a broken one is refused before any
    request carries it."""

    name: str
    id: int
    path: str


@dataclass(frozen=True, slots=True)
class TokenRequest:
    """One generation. ``priority``: lower runs first (vLLM's convention); a
    context's first segment gets 0, later ones 1, so TTFA is not queued behind
    audio that is only needed later.

    Multi-codebook engines: ``stop_token_ids`` apply to the first codebook;
    ``want_hidden`` asks for the hidden state of each step in ``CodeDelta``;
    ``embeddings`` replace prompt positions; ``adapter`` runs the request through
a LoRA adapter (engines that batch several adapters at once: vLLM). Engines that do not support a
    field that is set fail the request with ``EngineFailed``."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    stop_token_ids: tuple[int, ...] = ()
    priority: int = 0
    mask: CyclicTokenMask | None = None
    want_hidden: bool = False
    embeddings: tuple[PromptEmbedding, ...] = ()
    adapter: Adapter | None = None  # a LoRA adapter the engine has added; None: the base


class HiddenStates(Protocol):
    """An array of hidden states, ``[steps, hidden]`` (a torch tensor on the
    model's device, or a numpy array); the seam only reads its shape."""

    @property
    def shape(self) -> tuple[int, ...]: ...


H = TypeVar("H", bound=HiddenStates)


@dataclass(frozen=True, slots=True)
class CodeDelta(Generic[H]):
    """New steps of a multi-codebook request: ``codes[i]`` holds step i's ids,
    one per codebook (the same count every step); ``hidden``, when the request
    set ``want_hidden``, the LM's hidden state of those steps (``[steps, hidden]``,
    row i for step i), else None."""

    codes: tuple[tuple[int, ...], ...]
    hidden: H | None = None

    def __post_init__(self) -> None:
        if not self.codes:
            raise ValueError("a CodeDelta carries at least one step")
        width = len(self.codes[0])
        if width == 0 or any(len(step) != width for step in self.codes):
            raise ValueError(f"every step carries the same number (>= 1) of codes: "
                             f"{[len(step) for step in self.codes]}")
        if self.hidden is not None and self.hidden.shape[0] != len(self.codes):
            raise ValueError(f"hidden has {self.hidden.shape[0]} rows for "
                             f"{len(self.codes)} steps")

    @property
    def codebooks(self) -> int:
        return len(self.codes[0])


# Time-to-first-token histogram buckets, seconds (dense where the goals are:
# DESIGN.md wants first audio within 45 ms for one stream on the GPU).
TTFT_BUCKETS_S: tuple[float, ...] = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2,
                                     0.3, 0.5, 1.0, 2.0, 5.0)


@dataclass(frozen=True, slots=True)
class HistogramData:
    """Cumulative-free histogram: ``counts[i]`` observations <= ``bounds[i]``
    and above the previous bound; ``counts[-1]`` those above every bound."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    total: float
    count: int

    def cumulative(self) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(bound), running))
        return out


class HistogramAccumulator:
    """Mutable accumulator behind a ``HistogramData`` snapshot (not thread-safe:
    fed from the event loop only)."""

    __slots__ = ("_bounds", "_counts", "_n", "_sum")

    def __init__(self, bounds: Sequence[float] = TTFT_BUCKETS_S) -> None:
        self._bounds = tuple(bounds)
        self._counts = [0] * (len(self._bounds) + 1)
        self._sum = 0.0
        self._n = 0

    def observe(self, value: float) -> None:
        self._counts[bisect.bisect_left(self._bounds, value)] += 1
        self._sum += value
        self._n += 1

    def snapshot(self) -> HistogramData:
        return HistogramData(self._bounds, tuple(self._counts), self._sum, self._n)


class TokenTimes:
    """Each request's time from submit to its first, 7th and 28th token
    (``EngineStats.ttft``, ``t7``, ``t28``), as its consumer receives them;
    fed from the event loop only."""

    __slots__ = ("t7", "t28", "ttft")

    def __init__(self) -> None:
        self.ttft = HistogramAccumulator()
        self.t7 = HistogramAccumulator()
        self.t28 = HistogramAccumulator()

    def observe(self, before: int, after: int, elapsed_s: float) -> None:
        """A delta took a request from ``before`` to ``after`` tokens,
        ``elapsed_s`` after it was submitted."""
        if before == 0 < after:
            self.ttft.observe(elapsed_s)
        if before < 7 <= after:
            self.t7.observe(elapsed_s)
        if before < 28 <= after:
            self.t28.observe(elapsed_s)


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot of the engine. ``running``/``waiting``/``kv_cache_usage``
    are the scheduler's as of its last step; ``in_flight`` counts requests this
    process holds open now (exact)."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0  # fraction of KV blocks in use, 0..1
    in_flight: int = 0
    requests_total: int = 0
    aborted_total: int = 0
    failed_total: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    prefix_cache_queries_total: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits_total: int = 0
    preemptions_total: int = 0
    ttft: HistogramData = field(default_factory=lambda: HistogramAccumulator().snapshot())
    # Submit -> the 7th and the 28th token: one Orpheus/SNAC frame (the first
    # audio a chunked vocoder can start on) and four frames (where the upstream
    # reference decoder emits its first audio).
    t7: HistogramData = field(default_factory=lambda: HistogramAccumulator().snapshot())
    t28: HistogramData = field(default_factory=lambda: HistogramAccumulator().snapshot())


class EngineTally:
    """The counts behind an engine's ``EngineStats``, kept by the engine (plain
    numbers: one writer each, read whole by ``snapshot``)."""

    def __init__(self) -> None:
        self.running = 0
        self.waiting = 0
        self.kv_cache_usage = 0.0
        self.requests = 0
        self.aborted = 0
        self.failed = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.preemptions = 0
        self.times = TokenTimes()

    def snapshot(self, in_flight: int) -> EngineStats:
        """``EngineStats`` now; ``in_flight``: the requests the engine holds open."""
        times = self.times
        return EngineStats(
            running=self.running, waiting=self.waiting, kv_cache_usage=self.kv_cache_usage,
            in_flight=in_flight, requests_total=self.requests, aborted_total=self.aborted,
            failed_total=self.failed, prompt_tokens_total=self.prompt_tokens,
            generation_tokens_total=self.generation_tokens,
            prefix_cache_queries_total=self.prefix_queries,
            prefix_cache_hits_total=self.prefix_hits, preemptions_total=self.preemptions,
            ttft=times.ttft.snapshot(), t7=times.t7.snapshot(), t28=times.t28.snapshot())


D_co = TypeVar("D_co", covariant=True)


class TokenEngine(Protocol[D_co]):
    """A served LM producing codes for many requests at once; ``D_co`` is what
    one delta of ``generate`` carries."""

    async def start(self) -> None:
        """Load the model; returns once requests can be served."""
        ...

    def generate(self, request: TokenRequest) -> AsyncGenerator[D_co, None]:
        """Stream the new steps of ``request`` as they are sampled.

        Ends after a stop token (included) or ``max_tokens`` steps. Closing
        the iterator or cancelling its consumer aborts the request. A failure
        of this request raises ``rtserver.errors.EngineFailed``.
        """
        ...

    async def abort(self, request_id: str) -> None:
        """Stop a request now and free what it holds; unknown ids are ignored."""
        ...

    def stats(self) -> EngineStats: ...

    async def close(self) -> None: ...


@runtime_checkable
class LoraEngine(Protocol):
    """An engine that serves LoRA adapters beside its base model, several in
    one batch (vLLM with ``max_loras``)."""

    async def add_adapter(self, adapter: Adapter) -> None:
        """Load and check ``adapter`` (its folder is read now); requests may then
        carry it. Raises ``rtserver.errors.BadAdapter`` with the reason."""
        ...

    async def remove_adapter(self, adapter: Adapter) -> None:
        """Forget ``adapter``; no request in flight may still carry it."""
        ...


@runtime_checkable
class ProfiledEngine(Protocol):
    """An engine that records a GPU timeline of its own process on demand
    (vLLM's EngineCore: torch profiler traces in its ``profile_dir``)."""

    async def start_profile(self) -> None: ...

    async def stop_profile(self) -> None:
        """Stop recording and write the trace."""
        ...


# One id per step (Orpheus on vLLM): deltas are the engine's own id sequences.
SingleCodebookEngine = TokenEngine[Sequence[int]]
# Several ids per step and, on request, hidden states (ChatTTS).
MultiCodebookEngine = TokenEngine[CodeDelta[H]]


class EngineCollector(Collector):
    """Prometheus collector reading ``stats()`` at scrape time.

    Register it on the server's registry:
    ``registry.register(EngineCollector(engine.stats, engine="vllm"))``.
    """

    def __init__(self, stats: Callable[[], EngineStats], *, engine: str,
                 prefix: str = "rtserver_engine",
                 extra_counters: Callable[[], dict[str, tuple[str, float]]] | None = None
                 ) -> None:
        self._stats = stats
        self._engine = engine
        self._prefix = prefix
        # the voice's own counters on the same engine: name -> (doc, value)
        self._extra = extra_counters

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily
                                  | HistogramMetricFamily]:
        s = self._stats()
        p, labels, values = self._prefix, ["engine"], [self._engine]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(f"{p}_{name}", doc, labels=labels)
            g.add_metric(values, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(f"{p}_{name}", doc, labels=labels)
            c.add_metric(values, value)
            return c

        yield gauge("running_requests", "Requests the engine's scheduler is running", s.running)
        yield gauge("waiting_requests", "Requests waiting in the engine's scheduler", s.waiting)
        yield gauge("kv_cache_usage", "Fraction of KV cache blocks in use", s.kv_cache_usage)
        yield gauge("in_flight_requests", "Requests open in this process", s.in_flight)
        yield counter("requests", "Requests submitted", s.requests_total)
        yield counter("aborted_requests", "Requests aborted (cancel, disconnect)",
                      s.aborted_total)
        yield counter("failed_requests", "Requests that failed", s.failed_total)
        yield counter("prompt_tokens", "Prompt tokens submitted", s.prompt_tokens_total)
        yield counter("generation_tokens", "Tokens generated", s.generation_tokens_total)
        yield counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                      s.prefix_cache_queries_total)
        yield counter("prefix_cache_hits", "Prompt tokens found in the prefix cache",
                      s.prefix_cache_hits_total)
        yield counter("preemptions", "Requests preempted by the scheduler", s.preemptions_total)
        for name, (doc, value) in (self._extra() if self._extra else {}).items():
            yield counter(name, doc, value)
        for name, doc, data in (
                ("time_to_first_token_seconds", "From submitting a request to its first token",
                 s.ttft),
                ("time_to_7_tokens_seconds", "From submitting a request to its 7th token",
                 s.t7),
                ("time_to_28_tokens_seconds", "From submitting a request to its 28th token",
                 s.t28)):
            h = HistogramMetricFamily(f"{p}_{name}", doc, labels=labels)
            h.add_metric(values, data.cumulative(), data.total)
            yield h
