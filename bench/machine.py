"""What the benchmark ran on: CPU, cores, memory, OS and package versions.

Only what describes the hardware and software; no host name, user or path.
"""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = ("rtserver", "websockets", "numpy", "opuslib", "onnxruntime", "piper-tts",
            "prometheus-client", "uvloop", "soxr", "matplotlib")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / (1024 * 1024)
    except OSError:
        pass
    return 0.0


def _libopus() -> str:
    try:
        import opuslib.api.info as info

        raw = info.get_version_string()
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        return text.removeprefix("libopus ")
    except Exception:  # libopus missing or an opuslib without the binding
        return "?"


def describe() -> dict[str, Any]:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": _cpu_model(), "cores": cores, "memory_gib": _memory_gib(),
            "os": f"{platform.system()} {platform.release()}", "arch": platform.machine(),
            "python": platform.python_version()}


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    out["libopus"] = _libopus()
    return out
