"""What the torch engine takes (intake.py): each request it cannot run fails
with a reason before it queues; a runnable one becomes its prefill inputs."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from rtserver.engine.base import (
    PromptEmbedding,
    SamplingSettings,
    TokenRequest,
)
from rtserver.errors import EngineFailed
from rtserver.voices.chattts.assets import LmAssets
from rtserver.voices.chattts.engine.intake import check_refine, prefill_inputs
from rtserver.voices.chattts.engine.model import ChatLM
from rtserver.voices.chattts.engine.runner import MAX_STOPS


@pytest.fixture(scope="module")
def model(assets: LmAssets) -> ChatLM:
    return ChatLM(assets.config, assets.gpt, assets.embed, slots=2, max_len=32)


def _req(**kw: object) -> TokenRequest:
    base: dict[str, object] = {"request_id": "r", "prompt_token_ids": (5, 6, 7),
                               "max_tokens": 4}
    base.update(kw)
    return TokenRequest(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kw", "reason"), [
    ({"prompt_token_ids": ()}, "empty prompt"),
    ({"max_tokens": 0}, "max_tokens must be >= 1"),
    ({"prompt_token_ids": (5,) * 32}, "does not fit a slot of 32"),
    ({"stop_token_ids": tuple(range(MAX_STOPS + 1))}, f"at most {MAX_STOPS} stop ids"),
    ({"prompt_token_ids": (5, -1)}, "out of the text vocabulary"),
    ({"embeddings": (PromptEmbedding(5, (0.0,) * 3),)}, "prompt embedding of 3 values"),
])
def test_a_request_the_engine_cannot_run_fails_with_its_reason(
        model: ChatLM, kw: dict[str, object], reason: str) -> None:
    with pytest.raises(EngineFailed, match=reason):
        prefill_inputs(_req(**kw), model, min_new=1)


def test_an_id_past_the_vocabulary_fails(model: ChatLM) -> None:
    vocab = model.cfg.num_text_tokens
    with pytest.raises(EngineFailed, match="out of the text vocabulary"):
        prefill_inputs(_req(prompt_token_ids=(5, vocab)), model, min_new=1)
    prefill_inputs(_req(prompt_token_ids=(5, vocab - 1)), model, min_new=1)


def test_two_embeddings_fail(model: ChatLM) -> None:
    vec = (0.0,) * model.cfg.hidden_size
    with pytest.raises(EngineFailed, match="one prompt embedding"):
        prefill_inputs(_req(embeddings=(PromptEmbedding(5, vec), PromptEmbedding(6, vec))),
                       model, min_new=1)


def test_inputs_carry_the_request(model: ChatLM) -> None:
    vec = tuple(float(i) for i in range(model.cfg.hidden_size))
    req = _req(stop_token_ids=(9,), embeddings=(PromptEmbedding(6, vec),),
               sampling=SamplingSettings(temperature=0.0, top_p=0.7, top_k=20,
                                         repetition_penalty=1.05, seed=123))
    got = prefill_inputs(req, model, min_new=3)
    assert got.ids.tolist() == [5, 6, 7] and got.ids.dtype == np.int64
    assert got.inject_id == 6 and got.vector is not None
    assert got.vector.tolist() == list(vec)
    assert got.seed == 123 and got.min_new == 3 and got.top_k == 20 and got.max_steps == 4
    assert got.stops == (9,) + (-1,) * (MAX_STOPS - 1)
    assert got.sampling[0] > 0  # temperature 0 is floored, not a division by zero
    assert got.sampling[1:] == (0.7, 1.05)


def test_a_request_without_a_seed_draws_one(model: ChatLM) -> None:
    seeds = {prefill_inputs(_req(), model, min_new=1).seed for _ in range(8)}
    assert len(seeds) > 1


def test_refine_checks(model: ChatLM) -> None:
    with pytest.raises(EngineFailed, match="needs a prompt and a stop id"):
        check_refine(_req(), model, 16)
    with pytest.raises(EngineFailed, match="does not fit 3"):
        check_refine(_req(stop_token_ids=(1,)), model, 3)
    check_refine(_req(stop_token_ids=(1,)), model, 16)
