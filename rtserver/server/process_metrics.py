"""Metrics about this server process: which worker it is, its GPU's memory, and
an optional second listener that serves only ``/metrics``.

- ``rtserver_worker_info{worker, workers, gpu, pid}`` (always 1): joins every
  series of this process to its worker and GPU (``* on(instance) group_left``).
- ``rtserver_ready``: 1 while ``/ready`` answers 200 (voices warm, not
  draining), else 0; alerts tell "not ready" from "down" with it.
- ``rtserver_gpu_memory_used_bytes{gpu}`` / ``..._total_bytes{gpu}``: the
  device's memory in use by every process on it (vLLM's engine runs in a
  process of its own), from ``cudaMemGetInfo``; ``rtserver_gpu_memory_allocated_bytes``:
  this process's PyTorch allocator (the vocoder). Present only once this
  process has initialised CUDA itself; absent on a CPU-only server.
- ``[server] metrics_port`` > 0: ``/metrics`` also on that port (worker i of
  ``--workers``: ``metrics_port + i``), so Prometheus can scrape each process;
  the shared port reaches whichever process the kernel picks.
- ``python_gc_*`` and ``rtserver_gc_*``: this process's garbage collections
  and their pauses (``rtserver.gc_heap``).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from rtserver import gc_heap
from rtserver.config import Config
from rtserver.server.workers import WorkerIdentity, current


class WorkerInfoCollector(Collector):
    def __init__(self, ident: WorkerIdentity | None) -> None:
        self.labels = {
            "worker": str(ident.index) if ident else "0",
            "workers": str(ident.count) if ident else "1",
            "gpu": ident.gpu if ident else os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "pid": str(ident.pid if ident else os.getpid()),
        }

    def collect(self) -> Iterator[InfoMetricFamily]:
        yield InfoMetricFamily("rtserver_worker", "This server process: worker index, "
                               "worker count, GPU, pid", value=self.labels)


class ReadyCollector(Collector):
    def __init__(self, ready: Callable[[], bool]) -> None:
        self.ready = ready

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("rtserver_ready", "1 while /ready answers 200 (voices warm, "
                                "not draining), else 0", value=1.0 if self.ready() else 0.0)


class GpuMemoryCollector(Collector):
    """Reads the current CUDA device at scrape time; yields nothing until this
    process has initialised CUDA (never imports torch itself)."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_initialized():
            return
        device = torch.cuda.current_device()
        free, total = torch.cuda.mem_get_info(device)
        allocated = torch.cuda.memory_allocated(device)
        visible = [p.strip() for p in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
                   if p.strip()]
        gpu = visible[device] if device < len(visible) else str(device)
        for name, doc, value in (
                ("used_bytes", "GPU memory in use on this process's device (all processes)",
                 total - free),
                ("total_bytes", "GPU memory of this process's device", total),
                ("allocated_bytes", "GPU memory held by this process's PyTorch allocator",
                 allocated)):
            g = GaugeMetricFamily(f"rtserver_gpu_memory_{name}", doc, labels=["gpu"])
            g.add_metric([gpu], float(value))
            yield g


@dataclass
class ProcessMetrics:
    """What ``attach`` added; ``close()`` stops the metrics listener."""

    listener: WSGIServer | None = None
    thread: threading.Thread | None = None

    @property
    def port(self) -> int | None:
        return int(self.listener.server_address[1]) if self.listener is not None else None

    def close(self) -> None:
        if self.listener is not None:
            self.listener.shutdown()
            self.listener.server_close()
            self.listener = None


def metrics_port(config: Config, ident: WorkerIdentity | None) -> int:
    base = config.server.metrics_port
    return base + ident.index if base and ident is not None else base


def attach(registry: CollectorRegistry, config: Config,
           ready: Callable[[], bool]) -> ProcessMetrics:
    """Register the worker, readiness and GPU collectors; start the metrics
    listener if ``[server] metrics_port`` is set."""
    ident = current()
    registry.register(WorkerInfoCollector(ident))
    registry.register(ReadyCollector(ready))
    registry.register(GpuMemoryCollector())
    gc_heap.register(registry)
    port = metrics_port(config, ident)
    if not port:
        return ProcessMetrics()
    # prometheus_client's own threaded HTTP server; it only renders the registry
    listener, thread = start_http_server(port, addr=config.server.host, registry=registry)
    return ProcessMetrics(listener, thread)
