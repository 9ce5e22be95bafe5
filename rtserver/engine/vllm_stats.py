"""What vLLM's engine steps did, as this process sees them: ``StatSink`` is the
``StatLoggerBase`` vLLM calls after every step, filling ``LiveStats``;
``StepCounters`` are totals read from them, compared over a window with ``since``.
``stat_loggers`` is what the engine hands vLLM: the sink, and ``NoPrometheus`` in
place of vLLM's own Prometheus logger.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm.v1.metrics.loggers import PrometheusStatLogger, StatLoggerBase

from rtserver.engine.base import EngineTally

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.metrics.loggers import StatLoggerFactory
    from vllm.v1.metrics.stats import IterationStats, SchedulerStats


@dataclass(frozen=True, slots=True)
class StepCounters:
    """Totals of vLLM's engine steps as the frontend saw them."""

    steps: int  # steps that generated tokens
    generation_tokens: int
    itl_sum_s: float  # sum of per-request inter-token latencies
    itl_count: int
    # of ``steps``, those that gave a request its first token (its prefill ended
    # there): a batch of prefill and decode, which vLLM's default graph mode
    # (FULL_AND_PIECEWISE) runs piecewise
    prefill_steps: int = 0

    def since(self, earlier: StepCounters) -> dict[str, float]:
        """Over the window from ``earlier``: steps, tokens per step (the decode
        batch), and the mean inter-token latency in ms (the step time while
        every request decodes)."""
        steps = self.steps - earlier.steps
        tokens = self.generation_tokens - earlier.generation_tokens
        n = self.itl_count - earlier.itl_count
        prefill = self.prefill_steps - earlier.prefill_steps
        return {"steps": steps, "tokens_per_step": round(tokens / steps, 2) if steps else 0.0,
                "step_ms": round(1e3 * (self.itl_sum_s - earlier.itl_sum_s) / n, 3)
                if n else 0.0,
                "prefill_step_share": round(prefill / steps, 3) if steps else 0.0}


class LiveStats(EngineTally):
    """The engine's tally, which the stat logger and the engine update (event
    loop only), and vLLM's step totals behind ``StepCounters``."""

    def __init__(self) -> None:
        super().__init__()
        # vLLM's per-request inter-token latencies, one per running request per
        # engine step: under steady decoding their mean is the decode step time
        self.steps = 0  # iterations that generated tokens
        self.prefill_steps = 0  # of them, those with a request's first token
        self.itl_sum = 0.0
        self.itl_n = 0


class StatSink(StatLoggerBase):
    """vLLM calls ``record`` after each engine step, in the frontend process."""

    def __init__(self, vllm_config: VllmConfig, engine_index: int = 0,
                 *, live: LiveStats | None = None) -> None:
        self._live = live if live is not None else LiveStats()

    def record(self, scheduler_stats: SchedulerStats | None,
               iteration_stats: IterationStats | None,
               mm_cache_stats: Any = None, engine_idx: int = 0) -> None:
        live = self._live
        if scheduler_stats is not None:
            live.running = scheduler_stats.num_running_reqs
            live.waiting = scheduler_stats.num_waiting_reqs
            live.kv_cache_usage = scheduler_stats.kv_cache_usage
            pc = scheduler_stats.prefix_cache_stats
            if pc is not None:
                live.prefix_queries += pc.queries
                live.prefix_hits += pc.hits
        if iteration_stats is not None:
            live.prompt_tokens += iteration_stats.num_prompt_tokens
            live.generation_tokens += iteration_stats.num_generation_tokens
            live.preemptions += iteration_stats.num_preempted_reqs
            if iteration_stats.num_generation_tokens:
                live.steps += 1
                # (vLLM counts a prompt's tokens with its request's first token)
                if iteration_stats.num_prompt_tokens:
                    live.prefill_steps += 1
            # (an attribute of vLLM's IterationStats since its V1 metrics; read
            # defensively: an error here would stop vLLM's output handler)
            itl = getattr(iteration_stats, "inter_token_latencies_iter", ())
            live.itl_sum += sum(itl)
            live.itl_n += len(itl)

    def log_engine_initialized(self) -> None:
        return None


class NoPrometheus(PrometheusStatLogger):
    """Takes the place of vLLM's own Prometheus logger and records nothing.

    vLLM's ``StatLoggerManager`` adds a ``PrometheusStatLogger`` unless one is
    among the custom loggers (vLLM 0.26 and 0.32). Its metrics go to
    prometheus_client's default registry, which rtserver never serves (its
    /metrics are its own registries), and recording them took 5-7 % of the GPU
    worker's main-thread samples at 256 Orpheus streams (py-spy,
    bench/results/h100-2026-12-07-s33/profiles.md).
    """

    def __init__(self, vllm_config: VllmConfig | None = None,
                 engine_indexes: list[int] | None = None) -> None:
        # (vLLM's __init__ builds and registers every metric: not called)
        self.engine_indexes = engine_indexes or [0]

    def record(self, scheduler_stats: SchedulerStats | None,
               iteration_stats: IterationStats | None,
               mm_cache_stats: Any = None, engine_idx: int = 0) -> None:
        return None

    def record_sleep_state(self, is_awake: int = 0, level: int = 0) -> None:
        return None

    def log(self) -> None:
        return None

    def log_engine_initialized(self) -> None:
        return None


def stat_loggers(live: LiveStats) -> list[StatLoggerFactory]:
    """The ``stat_loggers`` an engine hands vLLM: a ``StatSink`` filling ``live``,
    and ``NoPrometheus``."""

    def sink(vllm_config: VllmConfig, engine_index: int = 0) -> StatSink:
        return StatSink(vllm_config, engine_index, live=live)

    return [sink, NoPrometheus]
