"""The binary audio message of PROTOCOL.md ("Binary audio frames"), pure.

Little-endian::

    offset size
    0      2    magic "RT"
    2      1    version = 1
    3      1    flags: bit0 last frame of the context, bit1 first frame of a segment
    4      2    stream
    6      2    count N of frames (>= 1)
    8      4    seq of the first frame
    12     ...  N times: u16 length L, then L bytes

Flag bits other than bit0 and bit1 are reserved: written as 0 and ignored
when read (PROTOCOL.md lets either side add meaning later).

The server writes messages with ``encode_audio_message``; a client reads
them with ``decode_audio_message`` and checks each context's order with a
``SeqTracker``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from rtserver.errors import ProtocolViolation, SeqGapError

MAGIC = b"RT"
VERSION = 1
FLAG_LAST = 0x01
FLAG_SEGMENT_START = 0x02

_HEADER = struct.Struct("<2sBBHHI")
_LENGTH = struct.Struct("<H")
HEADER_BYTES = _HEADER.size  # 12
MAX_FRAME_BYTES = 0xFFFF
MAX_FRAMES = 0xFFFF
MAX_SEQ = 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class AudioMessage:
    """One decoded binary message: frames ``seq`` .. ``seq + len(frames) - 1``."""

    stream: int
    seq: int
    frames: tuple[bytes, ...]
    last: bool
    segment_start: bool


def encode_audio_message(stream: int, seq: int, frames: Sequence[bytes], *, last: bool,
                         segment_start: bool) -> bytes:
    """The wire bytes of one message; ``ValueError`` for a value the header
    cannot carry."""
    if not 0 <= stream <= 0xFFFF:
        raise ValueError(f"stream {stream} is outside 0..65535")
    count = len(frames)
    if not 1 <= count <= MAX_FRAMES:
        raise ValueError(f"a message holds 1..{MAX_FRAMES} frames, not {count}")
    if seq < 0 or seq + count - 1 > MAX_SEQ:
        raise ValueError(f"seqs {seq}..{seq + count - 1} are outside 0..{MAX_SEQ}")
    flags = (FLAG_LAST if last else 0) | (FLAG_SEGMENT_START if segment_start else 0)
    parts = [_HEADER.pack(MAGIC, VERSION, flags, stream, count, seq)]
    for i, frame in enumerate(frames):
        if len(frame) > MAX_FRAME_BYTES:
            raise ValueError(f"frame {i} is {len(frame)} bytes; at most {MAX_FRAME_BYTES}")
        parts.append(_LENGTH.pack(len(frame)))
        parts.append(bytes(frame))
    return b"".join(parts)


def decode_audio_message(data: bytes | bytearray | memoryview) -> AudioMessage:
    """Parse one message; ``ValueError`` naming what is wrong with it."""
    view = memoryview(data)
    if len(view) < HEADER_BYTES:
        raise ValueError(f"audio message of {len(view)} bytes is shorter than the "
                         f"{HEADER_BYTES}-byte header")
    magic, version, flags, stream, count, seq = _HEADER.unpack_from(view)
    if magic != MAGIC:
        raise ValueError(f"bad magic {bytes(magic)!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise ValueError(f"unsupported audio message version {version}, expected {VERSION}")
    if count < 1:
        raise ValueError("audio message holds no frames (count 0)")
    if seq + count - 1 > MAX_SEQ:
        raise ValueError(f"seqs {seq}..{seq + count - 1} run past {MAX_SEQ}")
    frames: list[bytes] = []
    pos = HEADER_BYTES
    end = len(view)
    for i in range(count):
        if pos + 2 > end:
            raise ValueError(f"truncated: frame {i} of {count} has no length field")
        (length,) = _LENGTH.unpack_from(view, pos)
        pos += 2
        if pos + length > end:
            raise ValueError(f"truncated: frame {i} of {count} needs {length} bytes, "
                             f"{end - pos} left")
        frames.append(bytes(view[pos:pos + length]))
        pos += length
    if pos != end:
        raise ValueError(f"{end - pos} bytes after the last of {count} frames")
    return AudioMessage(stream=stream, seq=seq, frames=tuple(frames),
                        last=bool(flags & FLAG_LAST),
                        segment_start=bool(flags & FLAG_SEGMENT_START))


class SeqTracker:
    """The client's check of one context's frames (PROTOCOL.md, Order and
    guarantees): consecutive seqs from 0, nothing after the frame flagged last."""

    def __init__(self, context: str) -> None:
        self.context = context
        self.next_seq = 0
        self.ended = False  # a frame flagged `last` was seen

    def accept(self, seq: int, count: int, last: bool) -> None:
        """Take a message of ``count`` frames from ``seq``; raise on a gap."""
        if self.ended:
            raise ProtocolViolation(
                f"context '{self.context}': frame seq {seq} after the last frame")
        if seq != self.next_seq:
            raise SeqGapError(self.context, self.next_seq, seq)
        self.next_seq = seq + count
        self.ended = last


__all__ = [
    "FLAG_LAST",
    "FLAG_SEGMENT_START",
    "HEADER_BYTES",
    "MAGIC",
    "MAX_FRAMES",
    "MAX_FRAME_BYTES",
    "MAX_SEQ",
    "VERSION",
    "AudioMessage",
    "SeqTracker",
    "decode_audio_message",
    "encode_audio_message",
]
