"""Whether "auto" picks a Triton kernel on a device: the one rule the voices'
kernel choices share (ChatTTS's decode attention, SNAC's Snake and depthwise
convolutions).

A CUDA device of compute capability 8.0 or newer (Triton's supported NVIDIA
GPUs, its README: "Compute Capability 8.0+"; the kernels were measured on an
H100, sm_90) where Triton imports. Older GPUs, ROCm and the CPU keep torch's
layers, which run everywhere.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

MIN_CAPABILITY = (8, 0)


def triton_usable(device: Any, capability: Callable[[Any], tuple[int, int]] | None = None
                  ) -> bool:
    """``device`` (a ``torch.device``) can run the project's Triton kernels.
    ``capability``: the device's (major, minor), default
    ``torch.cuda.get_device_capability`` (only asked of a CUDA device)."""
    if getattr(device, "type", None) != "cuda":
        return False
    if importlib.util.find_spec("triton") is None:
        return False
    if capability is None:
        import torch

        if torch.version.hip:  # ROCm's "cuda": the kernels are measured on NVIDIA only
            return False
        capability = torch.cuda.get_device_capability
    return tuple(capability(device)) >= MIN_CAPABILITY


__all__ = ["MIN_CAPABILITY", "triton_usable"]
