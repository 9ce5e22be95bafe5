"""rtserver's vLLM plugin (entry point group ``vllm.general_plugins``): vLLM
calls ``register`` in every process it starts, its EngineCore included, so the
architecture below resolves there too. Registered by name only (vLLM imports
``engine/vllm_head.py`` when a model asks for it), so loading the plugin
imports neither torch nor vLLM's model code.
"""

from __future__ import annotations

HEAD_ARCHITECTURE = "RtserverHeadLlamaForCausalLM"
HEAD_CLASS = "rtserver.engine.vllm_head:HeadLlamaForCausalLM"
# hf_overrides keys the head model reads from its config
HF_HEAD_RANGES = "rtserver_head_ranges"
HF_HEAD_ALLOW_V1 = "rtserver_head_allow_v1"
ENTRY_POINT_GROUP = "vllm.general_plugins"
ENTRY_POINT_VALUE = "rtserver.engine.vllm_plugin:register"


def installed() -> bool:
    """Whether vLLM's other processes will find ``register``: the entry point
    is in an installed distribution's metadata (a tree run from PYTHONPATH
    without one would fail in the EngineCore with an unknown architecture)."""
    import importlib.metadata

    return any(ep.value == ENTRY_POINT_VALUE
               for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def register() -> None:
    """Register the head architecture with vLLM's model registry (idempotent)."""
    from vllm import ModelRegistry

    if HEAD_ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(HEAD_ARCHITECTURE, HEAD_CLASS)
