"""Prometheus metrics, one registry per server (tests build their own)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Every duration is in seconds, Prometheus' base unit (`_seconds` names).
# TTFA buckets: dense below 100 ms where the goals are (DESIGN.md).
TTFA_BUCKETS_S = (0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.12, 0.15, 0.2, 0.3, 0.5,
                  1.0, 2.0, 5.0)
# Parts of TTFA: most are a few ms, the model's part tens.
STAGE_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1,
                   0.15, 0.2, 0.5, 1.0)
# Where a context's first audio spends its time, in order (rtserver/core/context.py):
FIRST_AUDIO_STAGES = (
    "segmenter",  # the fragment that completed the first segment -> the segment cut
    "queue",  # cut -> its synthesis starts
    "model",  # -> the voice has the model output for its first audio (Orpheus: one frame)
    "vocoder",  # -> the voice yields the first PCM (the whole voice, if it reports no model part)
    "encode",  # -> the first frames are resampled, encoded and queued
    "send",  # -> the first frame is handed to the socket
)
# First heard audio: the goals are 90-250 ms (DESIGN.md), overload seconds.
FIRST_HEARD_BUCKETS_S = (0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0,
                         1.5, 2.0, 3.0, 5.0, 10.0)
# Time to first heard audio as listeners report it (``played``), seconds.
HEARD_BUCKETS_S = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0,
                   10.0)
# Audio waiting in a connection's send queue (seconds of audio).
SEND_QUEUE_BUCKETS_S = (0.0, 0.02, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0)
# Why a connection, context or message was refused (rtserver_rejected_total).
REJECT_REASONS = ("rate_limited", "overloaded", "draining", "breaker_open", "origin",
                  "unauthorized", "max_connections", "control_flood")
RTF_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0)


class Metrics:
    """The server's metrics; ``render()`` gives the /metrics body."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.ttfa_seconds = Histogram(
            "rtserver_ttfa_seconds", "Time to first audio per context, seconds",
            ["voice"], buckets=TTFA_BUCKETS_S, registry=r)
        self.first_audio_stage_seconds = Histogram(
            "rtserver_first_audio_stage_seconds",
            "Parts of each context's time to first audio, seconds (stages in metrics.py)",
            ["voice", "stage"], buckets=STAGE_BUCKETS_S, registry=r)
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
        self.send_queue_seconds = Histogram(
            "rtserver_send_queue_seconds",
            "Audio waiting in a connection's send queue when a message is sent, seconds",
            buckets=SEND_QUEUE_BUCKETS_S, registry=r)
        self.send_queue_audio_seconds = Gauge(
            "rtserver_send_queue_audio_seconds", "Audio queued in all send queues now, seconds",
            registry=r)
        self.rejected = Counter(
            "rtserver_rejected_total", "Connections, contexts and messages refused, by reason",
            ["reason"], registry=r)
        for reason in REJECT_REASONS:
            self.rejected.labels(reason)
        self.engine_up = Gauge("rtserver_engine_up",
                               "1 while a voice's engine serves, 0 down or breaker open",
                               ["voice"], registry=r)
        self.first_heard_seconds = Histogram(
            "rtserver_first_heard_seconds",
            "Time to first heard audio per context, server-side estimate: TTFA + the "
            "prebuffer hint of its first audio, seconds", ["voice"],
            buckets=FIRST_HEARD_BUCKETS_S, registry=r)
        self.time_to_first_heard = Histogram(
            "rtserver_time_to_first_heard_seconds",
            "Time to first heard audio per context as its listener reports it (`played`): "
            "from the text that completed its first segment to the start of playback, "
            "seconds", ["voice"], buckets=HEARD_BUCKETS_S, registry=r)

        self.first_segment_guesses = Counter(
            "rtserver_first_segment_speculations_total",
            "First segments synthesized before the cut that confirms them: started, then "
            "adopted (the cut was the guess) or dropped (the word went on)",
            ["voice", "outcome"], registry=r)
        self.slow_starts = Counter(
            "rtserver_slow_starts_total",
            "Contexts whose first chunk took at least HintConfig.slow_start_factor times "
            "the voice's usual: the host is slower than the measured rates (another "
            "process, CPU throttling); each was hinted again before its first audio, where "
            "that asks for more",
            ["voice"], registry=r)

    def observe_rtf(self, voice: str, rtf: float) -> None:
        self.rtf.labels(voice).observe(rtf)

    def render(self) -> bytes:
        return generate_latest(self.registry)
