"""Prometheus metrics, one registry per server (tests build their own)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# TTFA buckets in ms: dense below 100 ms where the goals are (DESIGN.md).
TTFA_BUCKETS_MS = (10, 20, 30, 40, 50, 60, 80, 100, 120, 150, 200, 300, 500, 1000, 2000, 5000)
# Parts of TTFA, ms: most are a few ms, the model's part tens.
STAGE_BUCKETS_MS = (0.5, 1, 2, 5, 10, 20, 30, 40, 50, 60, 80, 100, 150, 200, 500, 1000)
# Where a context's first audio spends its time, in order (rtserver/core/context.py):
FIRST_AUDIO_STAGES = (
    "segmenter",  # the fragment that completed the first segment -> the segment cut
    "queue",  # cut -> its synthesis starts
    "model",  # -> the voice has the model output for its first audio (Orpheus: one frame)
    "vocoder",  # -> the voice yields the first PCM (the whole voice, if it reports no model part)
    "encode",  # -> the first frames are resampled, encoded and queued
    "send",  # -> the first frame is handed to the socket
)
# First heard audio, ms: the goals are 90-250 ms (DESIGN.md), overload seconds.
FIRST_HEARD_BUCKETS_MS = (25, 50, 75, 100, 150, 200, 250, 300, 400, 500, 750, 1000, 1500,
                          2000, 3000, 5000, 10000)
# Time to first heard audio as listeners report it (``played``), seconds.
HEARD_BUCKETS_S = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0,
                   10.0)
# Why a connection, context or message was refused (rtserver_rejected_total).
REJECT_REASONS = ("rate_limited", "overloaded", "draining", "breaker_open", "origin",
                  "unauthorized", "max_connections", "control_flood")
RTF_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0)


class Metrics:
    """The server's metrics; ``render()`` gives the /metrics body."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.ttfa_ms = Histogram("rtserver_ttfa_ms", "Time to first audio per context, ms",
                                 ["voice"], buckets=TTFA_BUCKETS_MS, registry=r)
        self.first_audio_stage_ms = Histogram(
            "rtserver_first_audio_stage_ms",
            "Parts of each context's time to first audio, ms (stages in metrics.py)",
            ["voice", "stage"], buckets=STAGE_BUCKETS_MS, registry=r)
        self.rtf = Histogram("rtserver_rtf", "Generation time over audio time per segment",
                             ["voice"], buckets=RTF_BUCKETS, registry=r)
        self.connections = Gauge("rtserver_active_connections", "Open WebSocket connections",
                                 registry=r)
        self.contexts = Gauge("rtserver_active_contexts", "Contexts being spoken", registry=r)
        self.audio_seconds = Counter("rtserver_audio_seconds_total", "Audio sent, seconds",
                                     ["voice"], registry=r)
        self.errors = Counter("rtserver_errors_total", "Errors sent to clients, by code",
                              ["code"], registry=r)
        self.contexts_total = Counter("rtserver_contexts_total", "Contexts finished, by outcome",
                                      ["outcome"], registry=r)
        self.queue_ms = Histogram("rtserver_send_queue_ms",
                                  "Audio waiting in a connection's send queue when a message "
                                  "is sent, ms", buckets=(0, 20, 100, 500, 1000, 2000, 5000,
                                                          10000), registry=r)
        self.queued_ms = Gauge("rtserver_send_queue_audio_ms",
                               "Audio queued in all send queues now, ms", registry=r)
        self.rejected = Counter(
            "rtserver_rejected_total", "Connections, contexts and messages refused, by reason",
            ["reason"], registry=r)
        for reason in REJECT_REASONS:
            self.rejected.labels(reason)
        self.engine_up = Gauge("rtserver_engine_up",
                               "1 while a voice's engine serves, 0 down or breaker open",
                               ["voice"], registry=r)
        self.first_heard_ms = Histogram(
            "rtserver_first_heard_ms",
            "Time to first heard audio per context, server-side estimate: TTFA + the "
            "prebuffer hint of its first audio, ms", ["voice"],
            buckets=FIRST_HEARD_BUCKETS_MS, registry=r)
        self.time_to_first_heard = Histogram(
            "rtserver_time_to_first_heard_seconds",
            "Time to first heard audio per context as its listener reports it (`played`): "
            "from the text that completed its first segment to the start of playback, "
            "seconds", ["voice"], buckets=HEARD_BUCKETS_S, registry=r)

    def observe_rtf(self, voice: str, rtf: float) -> None:
        self.rtf.labels(voice).observe(rtf)

    def render(self) -> bytes:
        return generate_latest(self.registry)
