"""What listeners report hearing (``played``): each context's time to first
heard audio, and per voice how far the first-heard model's predictions are
from it. Pure: no asyncio, times passed in.

A listener's first ``played`` with ``audio_ms`` > 0, arriving at ``now``,
says playback began at ``now - audio_ms`` (it has played that much since);
the time to first heard audio is that, less when the text that completed the
context's first segment arrived (TTFA's start, so the two compare). It
includes what the server cannot see: the network both ways, the client's
own buffering, its audio device. The ``played`` itself takes a one-way trip
back, which it adds (loopback: well under a ms). Guards: reports of more
audio than was sent, or of a start before the first frame left, are clamped
to what is possible; the first report counts, later ones (which a stall
would make later) do not.

``ListenerCorrection`` (per voice) keeps an exponential average of heard
minus predicted (the prediction admission made for that context, from
``first_heard.predicted_first_heard_ms``), each report's part clamped to
``MAX_CORRECTION_MS`` either way and weighted ``WEIGHT``, so one client (or
one that reports nonsense) moves it by at most ``WEIGHT * MAX_CORRECTION_MS``
a context; it applies once ``MIN_REPORTS`` contexts reported.
``corrected_ms`` is the prediction admission compares with its target.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

WEIGHT = 0.1
MAX_CORRECTION_MS = 1000.0
MIN_REPORTS = 5


@dataclass(slots=True)
class ListenerCorrection:
    """How much later (ms) than predicted the listeners of one voice hear first audio."""

    reports: int = 0
    offset_ms: float = 0.0

    def observe(self, predicted_ms: float, heard_ms: float) -> None:
        error = min(MAX_CORRECTION_MS, max(-MAX_CORRECTION_MS, heard_ms - predicted_ms))
        self.offset_ms += WEIGHT * (error - self.offset_ms)
        self.reports += 1

    @property
    def correction_ms(self) -> float:
        """What to add to a prediction: 0 until ``MIN_REPORTS`` reported."""
        return self.offset_ms if self.reports >= MIN_REPORTS else 0.0

    def corrected_ms(self, predicted_ms: float) -> float:
        """``predicted_ms`` as listeners have been hearing it (never below 0)."""
        return max(0.0, predicted_ms + self.correction_ms)


@dataclass(slots=True)
class FirstHeard:
    """One context's first heard audio, from its listener's first ``played``.

    The context fills in what it knows as it goes (``text_complete_at``,
    ``first_sent_at``, ``sent_ms``); ``played`` may come after the context
    finished (a listener plays on after ``done``), so this outlives it.
    ``report(voice, seconds)`` records the measurement (a metric)."""

    voice: str
    predicted_ms: float | None  # admission's prediction at the start (uncorrected)
    correction: ListenerCorrection
    report: Callable[[str, float], None]
    text_complete_at: float | None = None
    first_sent_at: float | None = None
    sent_ms: float = 0.0
    heard_s: float | None = None

    @property
    def waiting(self) -> bool:
        """Audio went out and no listener reported hearing it yet."""
        return self.heard_s is None and self.first_sent_at is not None

    def played(self, audio_ms: float, now: float) -> float | None:
        """A ``played`` of ``audio_ms`` arrived at ``now``: the time to first
        heard audio in seconds if this is the first that counts, else None."""
        if (not self.waiting or not audio_ms > 0 or self.text_complete_at is None
                or self.first_sent_at is None):
            return None
        heard_ms = min(audio_ms, self.sent_ms)
        began = max(now - heard_ms / 1000.0, self.first_sent_at)
        self.heard_s = began - self.text_complete_at
        self.report(self.voice, self.heard_s)
        if self.predicted_ms is not None:
            self.correction.observe(self.predicted_ms, 1000.0 * self.heard_s)
        return self.heard_s


__all__ = ["MAX_CORRECTION_MS", "MIN_REPORTS", "WEIGHT", "FirstHeard", "ListenerCorrection"]
