"""What the benchmark ran on: CPU, cores, memory, OS and package versions.

Only what describes the hardware and software; no host name, user or path.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from rtserver.engine.cpu_features import native_bf16

PACKAGES = ("rtserver", "websockets", "numpy", "opuslib", "onnxruntime", "onnx", "openvino",
            "piper-tts", "prometheus-client", "uvloop", "matplotlib", "uvicorn", "httptools", "av")


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (else the platform's)."""
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
    """The machine; ``native_bf16``: whether Piper's decoder can run in bf16
    here (its CPU cost per audio second differs by ~1.4x, voices/piper/bf16.py),
    so two CPU runs of one model name compare only when it agrees."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu_model(), "cores": cores, "memory_gib": _memory_gib(),
            "os": f"{platform.system()} {platform.release()}", "arch": platform.machine(),
            "python": platform.python_version(), "native_bf16": native_bf16()}


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    out["libopus"] = _libopus()
    return out


def _ticks() -> float:
    return float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0


def cpu_busy_s() -> tuple[float, float] | None:
    """CPU seconds all cores spent busy since boot, and of those the seconds
    the hypervisor gave to other guests (steal) (/proc/stat); None off Linux."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    ticks = _ticks()
    return (user + nice + system + irq + softirq + steal) / ticks, steal / ticks


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system, all threads) process ``pid`` has used."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw.rsplit(")", 1)[1].split()  # the name may hold spaces
    return (int(fields[11]) + int(fields[12])) / _ticks()


def with_descendants(pids: list[int]) -> list[int]:
    """``pids`` and every live process under them (each ``/proc/PID/stat``'s
    parent): a server run as a supervisor does its work in its children."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        parent[int(entry.name)] = int(raw.rsplit(")", 1)[1].split()[1])
    found, todo = set(pids), list(pids)
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p and c not in found]
        found.update(kids)
        todo += kids
    return sorted(found)


@dataclass
class CpuMeter:
    """CPU use over a step: ours (the bench and the servers it spawned, with
    their child processes: a supervisor's GPU worker and front ends) and the
    rest of the machine's, which competes with the server under test: other
    processes, and the hypervisor's other guests (steal: a host that lost 5-20 %
    to it halved what an H100 served, bench/results/h100-2026-12-08-s34)."""

    pids: list[int]
    _busy: tuple[float, float] | None = None
    _ours: dict[int, float] = field(default_factory=dict)

    def start(self) -> None:
        self._busy = cpu_busy_s()
        self._ours = {p: v for p in with_descendants(self.pids)
                      if (v := process_cpu_s(p)) is not None}

    def stop(self, seconds: float) -> dict[str, float | None]:
        busy = cpu_busy_s()
        if self._busy is None or busy is None or seconds <= 0:
            return {"busy_cores": None, "ours_cores": None, "other_cores": None,
                    "stolen_cores": None}
        ours = 0.0
        for p in with_descendants(self.pids):  # one born in the step: all of it
            now = process_cpu_s(p)
            if now is not None:
                ours += now - self._ours.get(p, 0.0)
        total, stolen = busy[0] - self._busy[0], busy[1] - self._busy[1]
        return {"busy_cores": total / seconds, "ours_cores": ours / seconds,
                "other_cores": max(0.0, total - stolen - ours) / seconds,
                "stolen_cores": stolen / seconds}
