"""The refine-text lane of the torch engine: text generation beside the codes.

Upstream ChatTTS can first rewrite a sentence with prosody tokens
(``Chat._refine_text``): the same GPT, prompt ``[Sbreak]{text}[Pbreak]``,
each step's input the text embedding of the last id, logits from
``head_text``, sampling at temperature 0.7, top-p 0.7, top-k 20, until
``[Ebreak]``. Here those requests have their own small KV cache and slots,
so they never touch the code slots or their CUDA graphs; every engine turn
runs one eager step for all of them after the code step. Owned by the
engine thread (not thread-safe).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import torch

from rtserver.engine.base import TokenRequest
from rtserver.voices.chattts.engine.model import ChatLM
from rtserver.voices.chattts.engine.sampling import PENALTY_WINDOW, sample_codes


@dataclass
class TextJob:
    request: TokenRequest
    seed: int
    tokens: list[int] = field(default_factory=list)
    slot: int = -1
    pos: int = 0  # the position the next input goes to


# (request id, generated ids without the stop id, or None, error or None)
TextResult = tuple[str, list[int] | None, BaseException | None]


class TextLane:
    def __init__(self, model: ChatLM, slots: int, max_len: int) -> None:
        self.model = model
        self.max_len = min(max_len, model.max_len)
        self.cache = model.text_cache(slots, self.max_len)
        self.waiting: list[TextJob] = []
        self.live: dict[int, TextJob] = {}
        self._free = list(range(slots))
        heapq.heapify(self._free)

    @property
    def busy(self) -> bool:
        return bool(self.live or self.waiting)

    def drop(self, rid: str) -> bool:
        for slot, job in list(self.live.items()):
            if job.request.request_id == rid:
                del self.live[slot]
                heapq.heappush(self._free, slot)
                return True
        before = len(self.waiting)
        self.waiting = [j for j in self.waiting if j.request.request_id != rid]
        return len(self.waiting) != before

    def _params(self, jobs: list[TextJob], n: int) -> dict[str, torch.Tensor]:
        """Sampling tensors for rows 0..n-1 (rows without a job: neutral values)."""
        dev = self.model.device
        by_row = {j.slot: j for j in jobs}
        vocab = self.model.cfg.num_text_tokens
        temp, top_p, top_k, pen, seed, step, hist = [], [], [], [], [], [], []
        for row in range(n):
            j = by_row.get(row)
            s = j.request.sampling if j is not None else None
            temp.append(max(s.temperature, 1e-5) if s else 1.0)
            top_p.append(s.top_p if s else 1.0)
            top_k.append(s.top_k if s else 0)
            pen.append(s.repetition_penalty if s else 1.0)
            seed.append(j.seed if j else 0)
            step.append(len(j.tokens) if j else 0)
            recent = (j.tokens[-PENALTY_WINDOW:] if j else [])
            hist.append([vocab] * (PENALTY_WINDOW - len(recent)) + recent)
        return {"temperature": torch.tensor(temp, device=dev),
                "top_p": torch.tensor(top_p, device=dev),
                "top_k": torch.tensor(top_k, device=dev),
                "penalty": torch.tensor(pen, device=dev),
                "seed": torch.tensor(seed, device=dev),
                "step": torch.tensor(step, device=dev),
                "min_new": torch.ones(n, dtype=torch.int64, device=dev),
                "history": torch.tensor(hist, device=dev)[:, None, :]}

    def _sample(self, hidden: torch.Tensor, jobs: list[TextJob], n: int,
                eos: int) -> list[int]:
        logits = self.model.text_logits(hidden)
        ids = sample_codes(logits, eos_id=eos, **self._params(jobs, n))
        return [int(v) for v in ids[:, 0].tolist()]

    def _stop_id(self, job: TextJob) -> int:
        return job.request.stop_token_ids[0]

    def _done(self, job: TextJob) -> bool:
        return (job.tokens[-1] in job.request.stop_token_ids
                or len(job.tokens) >= job.request.max_tokens or job.pos + 1 >= self.max_len)

    def turn(self) -> list[TextResult]:
        """Admit what fits, run one step for every live job; the finished ones."""
        out: list[TextResult] = []
        model = self.model
        dev = model.device
        while self.waiting and self._free:
            job = self.waiting.pop(0)
            job.slot = heapq.heappop(self._free)
            ids = torch.tensor(job.request.prompt_token_ids, device=dev)
            emb = model.prompt_embeds(ids)[None]
            hidden = model.prefill(emb, torch.tensor([len(ids)], device=dev),
                                   torch.tensor([job.slot], device=dev), cache=self.cache)
            # one row: the job sits in row 0 of this sample
            slot, job.slot = job.slot, 0
            first = self._sample(hidden, [job], 1, self._stop_id(job))[0]
            job.slot = slot
            job.tokens.append(first)
            job.pos = len(ids)
            self.live[job.slot] = job
            if self._done(job):
                out.append(self._finish(job))
        if self.live:
            n = max(self.live) + 1
            tokens = [0] * n
            pos = [0] * n
            for slot, job in self.live.items():
                tokens[slot] = job.tokens[-1]
                pos[slot] = job.pos
            x = model.emb_text[torch.tensor(tokens, device=dev)]
            hidden = model.decode_embeds(x, torch.tensor(pos, device=dev), self.max_len,
                                         self.cache)
            jobs = list(self.live.values())
            eos = self._stop_id(jobs[0])
            new = self._sample(hidden, jobs, n, eos)
            for job in jobs:
                job.tokens.append(new[job.slot])
                job.pos += 1
                if self._done(job):
                    out.append(self._finish(job))
        return out

    def _finish(self, job: TextJob) -> TextResult:
        self.live.pop(job.slot, None)
        heapq.heappush(self._free, job.slot)
        toks = [t for t in job.tokens if t not in job.request.stop_token_ids]
        return job.request.request_id, toks, None
