"""Per-context measurements from client-side timestamps (pure).

TTFA, as the client sees it
===========================

PROTOCOL.md measures TTFA "from the moment the server has the text that
completes the first segment (the punctuation, a `flush` or an `end`) to the
moment it sends the first frame". The client cannot see inside the server's
segmenter, but the server tells it, in the first `segment` message, which
characters the first segment covers (``source = [start, end)`` offsets into
the text as sent). From that the client finds the *completing send*:

1. ``L`` = offset of the last non-space character of the first segment.
2. If that character is clause or sentence punctuation (after stripping
   closing quotes, brackets and markdown ``*``/``_``), the completing send is
   the text fragment that carried ``L``.
3. Otherwise the segment ended where the text did: it was completed by the
   first `flush` or `end` sent after ``L`` with nothing but white space
   between ``L`` and it. If there is none (a segmenter cut a long clause at a
   word), rule 2's fragment is used.

``ttfa_ms`` = first frame received − completing send. Rule 2 never credits
the server with time it spent waiting for look-ahead text (a segmenter that
must see the character after a ``.`` to rule out ``3.50`` waits one more
fragment, and that wait is counted against it): the client figure is an
upper bound on the protocol's, plus the network both ways. Both are reported
(``server_ttfa_ms`` from `done`).

``ttfa_after_lookahead_ms`` is the protocol's definition for a segmenter that
needs one fragment of look-ahead: from the next send after the completing one
when that send went out before the first frame came back (the server may have
waited for it), else ``ttfa_ms``. It is a lower estimate; ``ttfa_ms`` the
upper one.

``ttfa_first_text_ms`` = first frame received − first text fragment sent: what
a user waits from the moment the chatbot starts talking.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from rtserver.tools.bench.listener import ListenerConfig, simulate
from rtserver.tools.bench.stats import percentile

# Clause and sentence ends a segmenter may cut after (Latin and CJK).
BOUNDARY_PUNCTUATION = frozenset(".,;:!?…—–" "。，、；：！？")
# Closers that may follow the punctuation: quotes, brackets, markdown emphasis.
CLOSERS = frozenset("\"')]}”’»*_`")
DEFAULT_LISTENER = ListenerConfig()


@dataclass(frozen=True, slots=True)
class TurnRecord:
    """What the client saw of one context (times in seconds, one clock)."""

    text: str  # every fragment sent, joined
    frame_ms: float
    text_sent: tuple[tuple[float, int, int], ...]  # (time, start, end) per fragment
    flushes: tuple[tuple[float, int], ...] = ()  # (time, characters sent before it)
    end_sent_at: float | None = None
    seg0_source: tuple[int, int] | None = None
    arrivals: tuple[tuple[float, int, int], ...] = ()  # (time, seq, frame count)
    hints: tuple[tuple[float, float], ...] = ()  # (time, prebuffer_ms)
    outcome: str = "done"  # done | cancelled | error | failed
    finished_at: float | None = None
    cancel_sent_at: float | None = None
    cancelled_at: float | None = None
    cancelled_last_seq: int | None = None
    server_ttfa_ms: float | None = None
    server_audio_ms: float | None = None
    rtf: float | None = None  # the last `buffer` hint's
    error_code: str | None = None
    error_message: str | None = None


def _last_visible(text: str, start: int, end: int) -> int | None:
    for i in range(min(end, len(text)) - 1, start - 1, -1):
        if not text[i].isspace():
            return i
    return None


def _ends_clause(text: str, last: int, start: int) -> bool:
    i = last
    while i > start and text[i] in CLOSERS:
        i -= 1
    return text[i] in BOUNDARY_PUNCTUATION


def completing_send(record: TurnRecord) -> tuple[float, str] | None:
    """When the text that completed the first segment was sent, and by what
    (``"text"``, ``"flush"`` or ``"end"``); ``None`` without a first segment."""
    if record.seg0_source is None or not record.text_sent:
        return None
    start, end = record.seg0_source
    last = _last_visible(record.text, start, end)
    if last is None:
        last = max(start, min(end, len(record.text)) - 1)
    carrier = next((t for t, _, e in record.text_sent if e > last), None)
    if carrier is None:
        return None
    if last < len(record.text) and _ends_clause(record.text, last, start):
        return carrier, "text"
    markers = [(t, chars, "flush") for t, chars in record.flushes]
    if record.end_sent_at is not None:
        markers.append((record.end_sent_at, len(record.text), "end"))
    for t, chars, kind in sorted(markers):
        if t >= carrier and chars > last and not record.text[last + 1:chars].strip():
            return t, kind
    return carrier, "text"


def next_send_after(record: TurnRecord, at: float) -> float | None:
    """The first text, `flush` or `end` sent after ``at``."""
    times = [t for t, _, _ in record.text_sent] + [t for t, _ in record.flushes]
    if record.end_sent_at is not None:
        times.append(record.end_sent_at)
    later = [t for t in times if t > at]
    return min(later) if later else None


def gaps_ms(times: Sequence[float]) -> list[float]:
    """Gaps between consecutive arrivals, in milliseconds."""
    return [(b - a) * 1000.0 for a, b in itertools.pairwise(times)]


def analyze(record: TurnRecord, listener: ListenerConfig = DEFAULT_LISTENER
            ) -> dict[str, float | int | str | None]:
    """The per-context figures the reports aggregate (milliseconds)."""
    first_frame = record.arrivals[0][0] if record.arrivals else None
    last_frame = record.arrivals[-1][0] if record.arrivals else None
    completed = completing_send(record)
    ttfa = ttfa_first = ttfa_lookahead = None
    if first_frame is not None and completed is not None:
        ttfa = (first_frame - completed[0]) * 1000.0
        nxt = next_send_after(record, completed[0])
        ttfa_lookahead = ((first_frame - nxt) * 1000.0 if nxt is not None and nxt < first_frame
                          else ttfa)
    if first_frame is not None and record.text_sent:
        ttfa_first = (first_frame - record.text_sent[0][0]) * 1000.0
    frames = sum(c for _, _, c in record.arrivals)
    end_known = record.cancelled_at if record.outcome == "cancelled" else record.finished_at
    play = simulate([(t, c) for t, _, c in record.arrivals], record.frame_ms, record.hints,
                    end_known_at=end_known, config=listener)
    gaps = gaps_ms([t for t, _, _ in record.arrivals])
    # inter-frame gap against the audio it had to cover: > 0 means the stream
    # fell behind real time between these two messages
    lateness = [g - c_prev * record.frame_ms for g, (_, _, c_prev)
                in zip(gaps, record.arrivals, strict=False)]
    out: dict[str, float | int | str | None] = {
        "outcome": record.outcome,
        "error": record.error_code,
        "error_message": record.error_message,
        "chars": len(record.text),
        "fragments": len(record.text_sent),
        "seg0_end": record.seg0_source[1] if record.seg0_source else None,
        "completed_by": completed[1] if completed else None,
        "ttfa_ms": ttfa,
        "ttfa_first_text_ms": ttfa_first,
        "ttfa_after_lookahead_ms": ttfa_lookahead,
        "server_ttfa_ms": record.server_ttfa_ms,
        "frames": frames,
        "messages": len(record.arrivals),
        "audio_ms": frames * record.frame_ms,
        "gap_max_ms": max(gaps) if gaps else None,
        "gap_p99_ms": percentile(gaps, 99),
        "behind_max_ms": max(lateness) if lateness else None,
        "prebuffer_ms": record.hints[0][1] if record.hints else None,
        "rtf": record.rtf,
        "underruns": play.underruns,
        "stalled_ms": play.stalled_ms,
        "playback_start_ms": (None if play.start_at is None or completed is None
                              else (play.start_at - completed[0]) * 1000.0),
        "playback_end_at": play.end_at,
        "generation_ms": (None if last_frame is None or completed is None
                          else (last_frame - completed[0]) * 1000.0),
    }
    if record.cancel_sent_at is not None:
        c = record.cancel_sent_at
        after = [(t, s, n) for t, s, n in record.arrivals if t >= c]
        out["cancel_to_cancelled_ms"] = (None if record.cancelled_at is None
                                         else (record.cancelled_at - c) * 1000.0)
        # cancel-to-silence: the last audio that reached the client after the cancel
        out["cancel_to_last_frame_ms"] = ((after[-1][0] - c) * 1000.0 if after else 0.0)
        out["frames_after_cancel"] = sum(n for _, _, n in after)
        out["cancel_last_seq"] = record.cancelled_last_seq
    return out
