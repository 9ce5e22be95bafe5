"""Valid tokens while sampling: a ``CyclicTokenMask`` as a vLLM V1 logits
processor (runs in vLLM's worker process; vLLM 0.26 and 0.32 share the
interface). A request turns it on through ``SamplingParams.extra_args``
(``mask_extra_args``); requests without it are left alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor

from rtserver.engine.base import CyclicTokenMask

if TYPE_CHECKING:
    from vllm.config import VllmConfig

MASK_ARG = "rtserver_mask"  # SamplingParams.extra_args key read by the logits processor


def mask_extra_args(mask: CyclicTokenMask) -> dict[str, Any]:
    """The ``SamplingParams.extra_args`` entry that turns the mask on for a request."""
    return {MASK_ARG: {"ranges": [list(r) for r in mask.slot_ranges],
                       "end": list(mask.end_ids)}}


def _mask_key(params: SamplingParams) -> tuple[Any, ...] | None:
    spec = (params.extra_args or {}).get(MASK_ARG)
    if spec is None:
        return None
    ranges = tuple((int(lo), int(hi)) for lo, hi in spec["ranges"])
    return ranges, tuple(int(t) for t in spec["end"])


class CyclicMaskLogitsProcessor(LogitsProcessor):
    """Per-position masks: the token sampled at output index ``i`` must lie in
    ``ranges[i % period]``, or be an end token at a frame boundary.

    One additive table (``period`` x vocab of 0 / -inf) per distinct mask, built
    once; each step costs a gather and an add over the masked rows.
    """

    def __init__(self, vllm_config: VllmConfig, device: torch.device,
                 is_pin_memory: bool) -> None:
        self._device = device
        self._pin = is_pin_memory
        # batch index -> (mask key, the request's live output token list)
        self._rows: dict[int, tuple[tuple[Any, ...], list[int]]] = {}
        self._tables: dict[tuple[Any, ...], torch.Tensor] = {}

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        try:
            key = _mask_key(sampling_params)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"bad {MASK_ARG}: {exc}") from None
        if key is not None:
            ranges, _ = key
            if not ranges or any(lo >= hi for lo, hi in ranges):
                raise ValueError(f"bad {MASK_ARG} ranges {ranges}")

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self._rows.pop(index, None)
        for index, params, _prompt, output_ids in batch_update.added:
            key = self._key_for(params)
            if key is None:
                self._rows.pop(index, None)
            else:
                self._rows[index] = (key, output_ids)
        for a, b, direction in batch_update.moved:
            ra, rb = self._rows.pop(a, None), self._rows.pop(b, None)
            if ra is not None:
                self._rows[b] = ra
            if rb is not None and direction.name == "SWAP":
                self._rows[a] = rb

    def _key_for(self, params: Any) -> tuple[Any, ...] | None:
        """The mask a newly added request uses (None: unmasked)."""
        return _mask_key(params) if params is not None else None

    def _table(self, key: tuple[Any, ...], vocab: int, dtype: torch.dtype) -> torch.Tensor:
        table = self._tables.get(key)
        if table is None or table.shape[1] != vocab or table.dtype != dtype:
            ranges, end_ids = key
            table = torch.full((len(ranges), vocab), float("-inf"), dtype=dtype)
            for slot, (lo, hi) in enumerate(ranges):
                table[slot, lo:min(hi, vocab)] = 0.0
            for t in end_ids:
                if t < vocab:
                    table[0, t] = 0.0
            table = table.to(self._device)
            self._tables[key] = table
        return table

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self._rows:
            return logits
        groups: dict[tuple[Any, ...], tuple[list[int], list[int]]] = {}
        for index, (key, output_ids) in self._rows.items():
            if index >= logits.shape[0]:
                continue
            rows, slots = groups.setdefault(key, ([], []))
            rows.append(index)
            slots.append(len(output_ids) % len(key[0]))
        for key, (rows, slots) in groups.items():
            table = self._table(key, logits.shape[1], logits.dtype)
            r = torch.tensor(rows, dtype=torch.long, pin_memory=self._pin).to(
                self._device, non_blocking=True)
            s = torch.tensor(slots, dtype=torch.long, pin_memory=self._pin).to(
                self._device, non_blocking=True)
            logits[r] += table[s]
        return logits
