"""Which voices run where, and how many requests a GPU worker takes at once."""

from __future__ import annotations

from rtserver.config import Config
from rtserver.voices.registry import family_of


def split_specs(config: Config) -> tuple[list[str], list[str]]:
    """The configured voice specs (default first): (the front end's own, the
    GPU worker's: those of ``[gpu] families``)."""
    v = config.voice
    specs = [v.default, *[s for s in v.extra if s != v.default]]
    remote = [s for s in specs if family_of(s).name in config.gpu.families]
    return [s for s in specs if s not in remote], remote


def capacity_of(config: Config, family: str) -> int:
    """Requests the worker serves at once for ``family``: ``[gpu] max_requests``,
    else the rows of the family's engine batch (``slots`` of ChatTTS's torch
    engine, ``max_num_seqs`` of vLLM); 0: not bounded here."""
    if config.gpu.max_requests > 0:
        return config.gpu.max_requests
    section = config.families.get(family)
    for name in ("slots", "max_num_seqs"):
        rows = getattr(section, name, None)
        if isinstance(rows, int) and rows > 0:
            return rows
    return 0


__all__ = ["capacity_of", "split_specs"]
