"""InprocLLM: vLLM's LLMEngine stepped by a thread behind AsyncLLM's surface.

The engine here is a stand-in with LLMEngine's methods that writes one token
per step for each request (vLLM's own ``RequestOutput`` objects, so vLLM's
``RequestOutputCollector`` merges them as in the server); the real engine is
exercised by ``tests/integration/test_vllm_orpheus.py``. Checked: every token
arrives in order and merged while the consumer lags, every call into the
engine runs on the step thread, an abort is applied before ``abort`` returns
and a closed stream aborts its request, LoRA calls return the engine's
answer, a request vLLM refuses fails alone, and a step that raises fails open
requests and every later call with ``EngineDeadError``, as does shutting down.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

pytest.importorskip("vllm")

from vllm import SamplingParams
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.exceptions import EngineDeadError

from rtserver.engine.vllm_inproc import InprocLLM
from rtserver.testing.wait import wait_until_async

STEP_S = 0.001  # a step's time: a 10,000-token request outlasts any test step


class FakeEngine:
    """One token a step per request (token k of request r: 100 * n + k), up to
    ``params.max_tokens``; records the thread of every call."""

    model_config = object()

    def __init__(self) -> None:
        self.requests: dict[str, list[int]] = {}  # id -> [made, max_tokens, base]
        self.threads: set[str] = set()
        self.aborted: list[str] = []
        self.fail_next_step = False
        self.step_gate = threading.Event()
        self.step_gate.set()
        self.loras: set[int] = set()

    def _seen(self) -> None:
        self.threads.add(threading.current_thread().name)

    def add_request(self, request_id: str, prompt: Any, params: SamplingParams, *,
                    lora_request: Any = None, priority: int = 0) -> str:
        self._seen()
        if request_id.startswith("too-long"):
            raise ValueError("the prompt (5000 tokens) is longer than max_model_len (2048)")
        self.requests[request_id] = [0, int(params.max_tokens or 0), 100 * len(self.requests)]
        return request_id

    def abort_request(self, ids: list[str]) -> None:
        self._seen()
        for rid in ids:
            if self.requests.pop(rid, None) is not None:
                self.aborted.append(rid)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    def step(self) -> list[RequestOutput]:
        self._seen()
        self.step_gate.wait()
        time.sleep(STEP_S)
        if self.fail_next_step:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        outs = []
        for rid, st in list(self.requests.items()):
            st[0] += 1
            done = st[0] >= st[1]
            outs.append(RequestOutput(
                request_id=rid, prompt=None, prompt_token_ids=[1], prompt_logprobs=None,
                outputs=[CompletionOutput(index=0, text="", token_ids=[st[2] + st[0]],
                                          cumulative_logprob=None, logprobs=None,
                                          finish_reason="length" if done else None)],
                finished=done))
            if done:
                del self.requests[rid]
        return outs

    def add_lora(self, req: Any) -> bool:
        self._seen()
        if req == "broken":
            raise ValueError("adapter rank 512 is over max_lora_rank 64")
        self.loras.add(req)
        return True

    def remove_lora(self, lora_id: int) -> bool:
        self._seen()
        known = lora_id in self.loras
        self.loras.discard(lora_id)
        return known


def params(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, output_kind=RequestOutputKind.DELTA, detokenize=False)


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
async def llm(engine: FakeEngine) -> AsyncIterator[InprocLLM]:
    """An InprocLLM stepping ``engine``; shut down after the test."""
    llm = InprocLLM(engine)
    llm.start(asyncio.get_running_loop())
    yield llm
    await asyncio.to_thread(llm.shutdown)


async def tokens(llm: InprocLLM, rid: str, n: int, lag_s: float = 0.0) -> list[int]:
    got: list[int] = []
    async for out in llm.generate({"prompt_token_ids": [1]}, params(n), rid):
        got += out.outputs[0].token_ids
        if lag_s:
            await asyncio.sleep(lag_s)  # a slow consumer: deltas merge meanwhile
    return got


async def test_tokens_arrive_in_order_and_merge_for_a_slow_consumer(
        engine: FakeEngine, llm: InprocLLM) -> None:
    a, b = await asyncio.gather(tokens(llm, "a", 40), tokens(llm, "b", 25, lag_s=0.01))
    assert a == [1 + k for k in range(40)]
    assert b[0] in (101, 1) and b == [b[0] + k for k in range(25)]
    assert engine.threads == {"vllm-step"}  # every engine call on the step thread
    assert llm.get_num_unfinished_requests() == 0


async def test_closing_a_stream_aborts_its_request_and_abort_waits_for_it(
        engine: FakeEngine, llm: InprocLLM) -> None:
    stream = llm.generate({"prompt_token_ids": [1]}, params(10_000), "long")
    await anext(stream)
    await stream.aclose()
    await wait_until_async(lambda: engine.aborted == ["long"], "the stream's abort")
    gen = llm.generate({"prompt_token_ids": [1]}, params(10_000), "other")
    await anext(gen)
    await llm.abort("other")  # applied by the time it returns
    assert "other" in engine.aborted and not engine.requests
    await gen.aclose()


async def test_lora_calls_run_on_the_step_thread_with_their_answers(
        engine: FakeEngine, llm: InprocLLM) -> None:
    assert await llm.add_lora(7) is True
    with pytest.raises(ValueError, match="max_lora_rank"):
        await llm.add_lora("broken")
    assert await llm.remove_lora(7) is True and engine.loras == set()
    assert engine.threads == {"vllm-step"}
    assert not llm.errored  # a refused call is not a dead engine


async def test_a_request_vllm_refuses_fails_alone(
        engine: FakeEngine, llm: InprocLLM) -> None:
    with pytest.raises(ValueError, match="max_model_len"):
        await tokens(llm, "too-long-1", 5)
    assert not llm.errored
    assert await tokens(llm, "fine", 3) == [1, 2, 3]


async def test_a_step_that_raises_kills_the_engine_for_everyone(
        engine: FakeEngine, llm: InprocLLM) -> None:
    engine.step_gate.clear()  # hold the step thread inside a step
    run = asyncio.create_task(tokens(llm, "doomed", 10_000))
    await wait_until_async(lambda: engine.requests, "the request added")
    engine.fail_next_step = True
    engine.step_gate.set()
    with pytest.raises(EngineDeadError):
        await run
    assert llm.errored
    with pytest.raises(EngineDeadError):
        await tokens(llm, "later", 5)
    with pytest.raises(EngineDeadError):
        await llm.add_lora(3)


async def test_shutdown_ends_open_streams(
        engine: FakeEngine, llm: InprocLLM) -> None:
    run = asyncio.create_task(tokens(llm, "open", 10_000_000))
    await wait_until_async(lambda: engine.requests, "the request added")
    await asyncio.to_thread(llm.shutdown)
    with pytest.raises(EngineDeadError):
        await run
    with pytest.raises(EngineDeadError, match="shut down"):
        await tokens(llm, "after", 3)
