"""What the torch engine takes: a ``TokenRequest`` checked against the model,
then turned into its prefill inputs (once, at submit, on the event loop).

A request the engine cannot run fails here with ``EngineFailed`` and a reason,
before it takes a queue place or a slot.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from rtserver.engine.base import TokenRequest
from rtserver.errors import EngineFailed
from rtserver.voices.chattts.engine.model import ChatLM
from rtserver.voices.chattts.engine.runner import MAX_STOPS, PrefillInputs

_SEED_BITS = 31  # a request's seed when it names none
_SEED_MASK = 2**62 - 1  # a seed fits the runner's int64 state (sampling.py hashes it)
_MIN_TEMPERATURE = 1e-5  # temperature 0 divides by zero in the sampler: near-greedy instead


@dataclass(eq=False)
class EngineRequest:
    """A request inside the engine: what it asked, its prefill inputs, and
    (once running) its row in the hand-over arrays."""

    request: TokenRequest
    inputs: PrefillInputs
    submitted: float  # the engine clock's time at submit
    handle: int = -1  # its row in the hand-over arrays (``Handover``), once running
    gen: int = 0  # that row's generation when it was given (a stale row is ignored)


def draw_seed(seed: int | None) -> int:
    """``seed``, or a fresh random one when None."""
    return int(seed) if seed is not None else random.getrandbits(_SEED_BITS)


def prefill_inputs(request: TokenRequest, model: ChatLM, *, min_new: int) -> PrefillInputs:
    """Check ``request`` against ``model`` and build its prefill inputs; ``min_new``
    steps run before an EOS may end it. Raises ``EngineFailed`` saying why not."""
    n = len(request.prompt_token_ids)
    if n == 0:
        raise EngineFailed("empty prompt")
    if request.max_tokens < 1:
        raise EngineFailed("max_tokens must be >= 1")
    if n + 1 > model.max_len:
        raise EngineFailed(f"prompt of {n} positions does not fit a slot of {model.max_len}")
    if request.mask is not None:
        raise EngineFailed("the torch engine does not take token masks")
    if len(request.stop_token_ids) > MAX_STOPS:
        raise EngineFailed(f"the torch engine checks at most {MAX_STOPS} stop ids")
    ids = np.asarray(request.prompt_token_ids, dtype=np.int64)
    if int(ids.min()) < 0 or int(ids.max()) >= model.cfg.num_text_tokens:
        raise EngineFailed("prompt id out of the text vocabulary")
    if len(request.embeddings) > 1:
        raise EngineFailed("the torch engine takes one prompt embedding")
    vector = None
    inject = -1
    for emb in request.embeddings:
        if len(emb.vector) != model.cfg.hidden_size:
            raise EngineFailed(f"prompt embedding of {len(emb.vector)} values, the model "
                               f"needs {model.cfg.hidden_size}")
        vector = np.asarray(emb.vector, dtype=np.float32)
        inject = emb.token_id
    s = request.sampling
    stops = tuple(request.stop_token_ids) + (-1,) * (MAX_STOPS - len(request.stop_token_ids))
    return PrefillInputs(
        ids=ids, vector=vector, inject_id=inject, seed=draw_seed(s.seed) & _SEED_MASK,
        min_new=min_new, top_k=int(s.top_k), max_steps=request.max_tokens, stops=stops,
        sampling=(max(s.temperature, _MIN_TEMPERATURE), s.top_p, s.repetition_penalty))


def check_refine(request: TokenRequest, model: ChatLM, max_len: int) -> None:
    """Check a refine-text request (text ids in, a stop id, ``max_len`` positions
    in its lane). Raises ``EngineFailed`` saying why not."""
    n = len(request.prompt_token_ids)
    if n == 0 or not request.stop_token_ids:
        raise EngineFailed("refine needs a prompt and a stop id")
    if n + 1 > max_len:
        raise EngineFailed(f"refine prompt of {n} positions does not fit {max_len}")
    vocab = model.cfg.num_text_tokens
    if min(request.prompt_token_ids) < 0 or max(request.prompt_token_ids) >= vocab:
        raise EngineFailed("prompt id out of the text vocabulary")
