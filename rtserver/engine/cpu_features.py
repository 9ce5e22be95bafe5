"""What this CPU computes in hardware, for the engines and decoders that pick
a precision by it (Piper's bf16 decoder) and the benchmark that records it."""

from __future__ import annotations

from pathlib import Path

# x86 flags of bf16 arithmetic (/proc/cpuinfo): AVX-512 BF16 and AMX
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def native_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU has bf16 arithmetic in hardware (x86: AVX-512 BF16 or AMX)."""
    try:
        text = cpuinfo.read_text(encoding="ascii", errors="replace")
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.partition(":")[2].split())
            return any(f in flags for f in BF16_FLAGS)
    return False
