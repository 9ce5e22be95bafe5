"""The process's garbage collector: its start-up heap frozen, its pauses timed.

A full collection walks every object the process holds, and a process that
loaded torch, a model and its CUDA graphs holds hundreds of thousands, with
the GIL held the whole time, so its engine thread and every stream stand
still: the tiny ChatTTS GPU worker on the CPU tracked ~184,000 objects and
its generation-2 collections took ~50 ms each (3 over start-up and a 25 s run
at 24 streams, 149 ms; bench/results/cpu-chattts-loop-2026-12-06).
``freeze_heap`` moves what start-up made into the permanent generation, which
collections skip (vLLM freezes its engine's heap after warm-up,
``vllm/utils/gc_utils.py`` ``freeze_gc_heap``; CPython's ``gc.freeze`` docs
advise it for servers). ``register`` puts on a registry prometheus_client's
own ``GCCollector`` (collections and objects per generation) and
``GcPauses``, which times them (the library counts them only).
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, GCCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

GENERATIONS = 3
# what the last ``freeze_heap`` left frozen: ``gc.get_freeze_count`` walks the whole
# permanent generation with the GIL held (a linked list of 186,750 objects in the
# ChatTTS GPU worker: 10 of its 378 GIL-holding samples in 6 s at 100 Hz, all in that
# call, over about three scrapes, so ~30 ms a scrape; py-spy --gil at 512 streams on
# an H100, bench/results/h100-2026-12-06-s23), so a scrape reads this instead
_frozen = [0]


def freeze_heap() -> int:
    """Collect, then freeze everything alive now; the objects frozen in all."""
    gc.collect()
    gc.freeze()
    _frozen[0] = gc.get_freeze_count()
    return _frozen[0]


def register(registry: CollectorRegistry) -> None:
    """The process's collections (prometheus_client's ``GCCollector``) and
    their pauses (``GcPauses``) on ``registry``."""
    GCCollector(registry=registry)
    registry.register(GcPauses.install())


class GcPauses(Collector):
    """Seconds of collections per generation, and the longest, from one
    ``gc.callbacks`` hook (``install``: once per process, whatever calls it)."""

    _installed: GcPauses | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.seconds = [0.0] * GENERATIONS
        self.longest = 0.0
        self._began = 0.0

    @classmethod
    def install(cls) -> GcPauses:
        """The process's one hook (added on the first call)."""
        with cls._lock:
            if cls._installed is None:
                cls._installed = cls()
                gc.callbacks.append(cls._installed._on_gc)
            return cls._installed

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        # runs in whichever thread triggered the collection, holding the GIL
        if phase == "start":
            self._began = time.perf_counter()
            return
        took = time.perf_counter() - self._began
        g = min(int(info.get("generation", 0)), GENERATIONS - 1)
        self.seconds[g] += took
        self.longest = max(self.longest, took)

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        s = CounterMetricFamily("rtserver_gc_pause_seconds", "Time this process spent in "
                                "garbage collections (the GIL held)", labels=["generation"])
        for g in range(GENERATIONS):
            s.add_metric([str(g)], self.seconds[g])
        longest = GaugeMetricFamily("rtserver_gc_longest_pause_seconds",
                                    "The longest garbage collection of this process")
        longest.add_metric([], self.longest)
        frozen = GaugeMetricFamily("rtserver_gc_frozen_objects",
                                   "Objects the last freeze_heap left in the permanent "
                                   "generation")
        frozen.add_metric([], float(_frozen[0]))  # not gc.get_freeze_count(): see _frozen
        yield from (s, longest, frozen)


__all__ = ["GcPauses", "freeze_heap", "register"]
