"""The GPU worker's load as Prometheus gauges, seen from both sides: the
worker's own ``/metrics`` (``WorkerCollector``, ``serve_metrics``) and a front
end's view of it from the last ``Load`` (``remote.LinkCollector``) name the
same three families (``load_families``), so one dashboard reads either."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Protocol
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from rtserver.config import Config
from rtserver.gc_heap import register as register_gc


def load_families(families: Iterable[str], *, active: Callable[[str], int],
                  capacity: Callable[[str], int], starting: Callable[[str], int]
                  ) -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
    """``rtserver_gpu_worker_requests``, ``_capacity`` and ``_starting_requests``
    for each of ``families``."""
    held = GaugeMetricFamily("rtserver_gpu_worker_requests",
                             "Requests the GPU worker holds (all front ends)",
                             labels=["family"])
    cap = GaugeMetricFamily("rtserver_gpu_worker_capacity",
                            "Requests the GPU worker serves at once", labels=["family"])
    start = GaugeMetricFamily(
        "rtserver_gpu_worker_starting_requests",
        "Contexts' first segments in the GPU worker without output yet (all front ends)",
        labels=["family"])
    for family in families:
        held.add_metric([family], float(active(family)))
        cap.add_metric([family], float(capacity(family)))
        start.add_metric([family], float(starting(family)))
    return held, cap, start


class WorkerLoad(Protocol):
    """What the worker's collector reads of its server (``proc.WorkerServer``)."""

    @property
    def capacity(self) -> Mapping[str, int]: ...
    @property
    def active(self) -> Mapping[str, int]: ...
    @property
    def starting(self) -> Mapping[str, int]: ...
    @property
    def frontends(self) -> int: ...
    @property
    def rtf_sent(self) -> Mapping[str, float]: ...


class WorkerCollector(Collector):
    """The worker's own load: requests held and capacity per family, front ends."""

    def __init__(self, server: WorkerLoad) -> None:
        self.server = server

    def collect(self) -> Iterator[GaugeMetricFamily]:
        s = self.server
        yield from load_families(s.capacity, active=lambda f: s.active.get(f, 0),
                                 capacity=lambda f: s.capacity[f],
                                 starting=lambda f: s.starting.get(f, 0))
        fronts = GaugeMetricFamily("rtserver_gpu_worker_frontends",
                                   "Front ends that spoke to the GPU worker lately")
        fronts.add_metric([], float(s.frontends))
        switch = GaugeMetricFamily("rtserver_gpu_worker_gil_switch_seconds",
                                   "The worker process's GIL switch interval "
                                   "(sys.getswitchinterval; gpu.gil_switch_ms)")
        switch.add_metric([], sys.getswitchinterval())
        rtf = GaugeMetricFamily(
            "rtserver_gpu_worker_rtf",
            "r (generation time / audio time) of the requests completed lately at the present "
            "load, as last sent to the front ends (Load.rtf)", labels=["family"])
        for family, r in s.rtf_sent.items():  # replaced whole on the loop
            rtf.add_metric([family], r)
        yield from (fronts, switch, rtf)


def serve_metrics(config: Config, collectors: Sequence[Collector], server: WorkerLoad
                  ) -> WSGIServer | None:
    """``/metrics`` of the worker on ``[gpu] metrics_port`` (its engines'
    ``collectors`` and ``WorkerCollector``) in prometheus_client's own thread;
    None when off."""
    port = config.gpu.metrics_port
    if not port:
        return None
    registry = CollectorRegistry()
    for collector in [*collectors, WorkerCollector(server)]:
        registry.register(collector)
    register_gc(registry)
    httpd, _ = start_http_server(port, addr=config.server.host, registry=registry)
    return httpd


__all__ = ["WorkerCollector", "WorkerLoad", "load_families", "serve_metrics"]
