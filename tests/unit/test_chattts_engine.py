"""The torch engine on a tiny ChatTTS checkpoint (CPU, float32): the seam,
faults, the refine lane, one host sync per step, and batched output equal to
each request alone through chunked prefill and compaction."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rtserver.engine.base import (  # noqa: E402
    CodeDelta,
    PromptEmbedding,
    SamplingSettings,
    TokenRequest,
)
from rtserver.errors import EngineFailed, Overloaded  # noqa: E402
from rtserver.testing.wait import wait_until_async  # noqa: E402
from rtserver.voices.chattts.assets import LmAssets  # noqa: E402
from rtserver.voices.chattts.engine.engine import TorchCodeEngine, TorchEngineConfig  # noqa: E402
from rtserver.voices.chattts.engine.model import ChatLM  # noqa: E402

# ChatTTS InferCodeParams defaults (upstream core.py)
SAMPLING = SamplingSettings(temperature=0.3, top_p=0.7, top_k=20, repetition_penalty=1.05)


def make_engine(assets: LmAssets, *, slots: int = 4, max_len: int = 256,
                **cfg: object) -> TorchCodeEngine:
    def factory() -> ChatLM:
        return ChatLM(assets.config, assets.gpt, assets.embed, slots=slots, max_len=max_len)

    return TorchCodeEngine(factory, TorchEngineConfig(**cfg),  # type: ignore[arg-type]
                           eos_id=assets.config.eos_id)


@contextlib.asynccontextmanager
async def running(engine: TorchCodeEngine) -> AsyncIterator[TorchCodeEngine]:
    await engine.start()
    try:
        yield engine
    finally:
        await engine.close()


def request(assets: LmAssets, rid: str, text: str, seed: int, steps: int,
            *, speaker_seed: int = 1, priority: int = 0) -> TokenRequest:
    ids = assets.tokenizer.encode(f"[Stts][spk_emb][speed_5]{text}[Ptts]")
    stats = assets.speaker_stats
    assert stats is not None
    vec = stats.sample(speaker_seed)
    vec = vec / np.linalg.norm(vec)
    return TokenRequest(
        request_id=rid, prompt_token_ids=tuple(ids), max_tokens=steps,
        sampling=SamplingSettings(temperature=SAMPLING.temperature, top_p=SAMPLING.top_p,
                                  top_k=SAMPLING.top_k,
                                  repetition_penalty=SAMPLING.repetition_penalty, seed=seed),
        priority=priority, want_hidden=True,
        embeddings=(PromptEmbedding(assets.tokenizer.spk_emb_id,
                                    tuple(float(v) for v in vec)),))


async def collect(engine: TorchCodeEngine, req: TokenRequest
                  ) -> tuple[np.ndarray, np.ndarray]:
    codes: list[tuple[int, ...]] = []
    hidden: list[np.ndarray] = []
    async for delta in engine.generate(req):
        assert isinstance(delta, CodeDelta)
        codes.extend(delta.codes)
        assert delta.hidden is not None
        hidden.append(np.asarray(delta.hidden))
    return np.array(codes), np.concatenate(hidden)


TEXTS = [("a", "hello world", 11, 40), ("b", "你好我们", 12, 55), ("c", "one two three", 13, 30),
         ("d", "good day", 14, 48), ("e", "天气很好", 15, 25)]


async def test_batched_equals_alone(assets: LmAssets) -> None:
    """Five requests through four slots, joining while others decode, give what
    each gives alone: the same codes, hidden states within 1e-4 (float32 sums
    in another order)."""
    reqs = [request(assets, rid, text, seed, steps) for rid, text, seed, steps in TEXTS]
    async with running(make_engine(assets, slots=1)) as engine:
        alone = [await collect(engine, r) for r in reqs]
    async with running(make_engine(assets, slots=4)) as engine:

        async def late(r: TokenRequest, delay: float) -> tuple[np.ndarray, np.ndarray]:
            await asyncio.sleep(delay)
            return await collect(engine, r)

        together = await asyncio.gather(*(late(r, 0.002 * i) for i, r in enumerate(reqs)))
        stats = engine.stats()
    assert stats.requests_total == len(reqs)
    # a time to the first, the 7th and the 28th step for each request that got that far
    steps = [len(codes) for codes, _ in together]
    assert (stats.ttft.count, stats.t7.count, stats.t28.count) == (
        sum(n >= 1 for n in steps), sum(n >= 7 for n in steps), sum(n >= 28 for n in steps))
    assert stats.t28.count > 0
    for (rid, *_), (c1, h1), (c2, h2) in zip(TEXTS, alone, together, strict=True):
        assert c1.shape == c2.shape, rid
        np.testing.assert_array_equal(c1, c2, err_msg=rid)
        np.testing.assert_allclose(h1, h2, atol=1e-4, err_msg=rid)
    # the sampler is not degenerate: codes vary, and each request is its own
    assert len(np.unique(alone[0][0])) > 10
    assert not np.array_equal(alone[0][0][:20], alone[3][0][:20])


async def test_steps_end_at_eos_or_budget(assets: LmAssets) -> None:
    eos = assets.config.eos_id
    async with running(make_engine(assets)) as engine:
        for seed in range(6):
            codes, hidden = await collect(engine, request(assets, f"r{seed}", "hello", seed, 60))
            assert len(codes) == len(hidden)
            assert (codes[:-1] != eos).all()  # EOS only on the last step
            assert len(codes) == 60 or (codes[-1] == eos).any()
            assert (codes[0] != eos).all()  # no EOS at the first step
            assert ((codes >= 0) & (codes <= eos)).all()


async def test_abort_frees_the_slot(assets: LmAssets) -> None:
    async with running(make_engine(assets, slots=1)) as engine:
        gen = engine.generate(request(assets, "long", "hello world", 3, 10_000))
        got = 0
        async for delta in gen:
            got += len(delta.codes)
            if got >= 3:
                break
        await gen.aclose()
        await wait_until_async(lambda: engine.slots_in_use() == 0, "the aborted slot is free")
        assert engine.stats().aborted_total == 1
        # the one slot serves the next request at once
        codes, _ = await asyncio.wait_for(
            collect(engine, request(assets, "next", "hi", 4, 5)), 10)
        assert 1 <= len(codes) <= 5


async def test_full_pool_queues_until_a_slot_frees(assets: LmAssets) -> None:
    # max_len 4096: the first request cannot end by itself while the test looks
    async with running(make_engine(assets, slots=1, max_len=4096)) as engine:
        first = engine.generate(request(assets, "one", "hello world", 1, 10_000))
        await first.__anext__()
        second = asyncio.create_task(collect(engine, request(assets, "two", "hi", 2, 5)))
        await wait_until_async(lambda: engine.stats().waiting == 1, "the second request waits")
        assert engine.stats().running == 1
        await first.aclose()
        codes, _ = await asyncio.wait_for(second, 10)  # ran once the slot was free
        assert len(codes) >= 1


async def test_full_queue_is_overloaded(assets: LmAssets) -> None:
    engine = make_engine(assets, slots=1, max_waiting=1)
    engine._model = engine._build()  # no step thread: what is queued stays queued
    engine._loop = asyncio.get_running_loop()
    queued = engine.generate(request(assets, "one", "hi", 1, 5))
    task = asyncio.create_task(queued.__anext__())
    await asyncio.sleep(0)
    with pytest.raises(Overloaded) as exc:
        await collect(engine, request(assets, "two", "hi", 2, 5))
    assert exc.value.retry_after_ms == 500
    task.cancel()
    await asyncio.wait([task])  # not `await task`: this test's own cancel stays visible
    assert task.cancelled()


async def test_non_finite_fails_only_that_request(assets: LmAssets) -> None:
    async with running(make_engine(assets)) as engine:
        good = request(assets, "good", "hello world", 5, 30)
        bad = request(assets, "bad", "hello world", 6, 30)
        vec = list(bad.embeddings[0].vector)
        vec[0] = float("nan")
        bad = TokenRequest(request_id="bad", prompt_token_ids=bad.prompt_token_ids,
                           max_tokens=30, sampling=bad.sampling, want_hidden=True,
                           embeddings=(PromptEmbedding(bad.embeddings[0].token_id,
                                                       tuple(vec)),))
        results = await asyncio.gather(collect(engine, good), collect(engine, bad),
                                       return_exceptions=True)
        assert isinstance(results[1], EngineFailed)
        assert "non-finite" in str(results[1])
        assert not isinstance(results[0], BaseException)
        assert len(results[0][0]) >= 1
        assert engine.stats().failed_total == 1


async def test_bad_requests_fail_clearly(assets: LmAssets) -> None:
    async with running(make_engine(assets, max_len=64)) as engine:
        r = request(assets, "x", "hello", 1, 5)
        too_long = TokenRequest(request_id="long", prompt_token_ids=(1,) * 64, max_tokens=5)
        with pytest.raises(EngineFailed, match="does not fit"):
            await collect(engine, too_long)
        wrong = TokenRequest(request_id="w", prompt_token_ids=r.prompt_token_ids, max_tokens=5,
                             embeddings=(PromptEmbedding(1, (0.0,) * 3),))
        with pytest.raises(EngineFailed, match="prompt embedding"):
            await collect(engine, wrong)


def test_sampler_matches_upstream_warpers() -> None:
    """Top-p then top-k as transformers' warpers with min_tokens_to_keep=3:
    the kept set equals theirs on random logits."""
    tr = pytest.importorskip("transformers.generation")
    from rtserver.voices.chattts.engine import sampling

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn((6, 626), generator=gen) * 3
    hf = tr.TopKLogitsWarper(20, min_tokens_to_keep=3)(
        None, tr.TopPLogitsWarper(0.7, min_tokens_to_keep=3)(None, logits.clone()))
    kept_hf = torch.isfinite(hf)
    seen = torch.zeros_like(kept_hf)
    n = 6
    for step in range(150):
        ids = sampling.sample_codes(
            logits[:, None, :], temperature=torch.ones(n), top_p=torch.full((n,), 0.7),
            top_k=torch.full((n,), 20), penalty=torch.ones(n),
            history=torch.full((n, 1, 16), 626), seed=torch.arange(n),
            step=torch.full((n,), step), min_new=torch.zeros(n, dtype=torch.int64), eos_id=625)
        seen[torch.arange(n), ids[:, 0]] = True
    assert not (seen & ~kept_hf).any()  # never outside the kept set
    assert (seen.sum(1) >= 2).all()  # and not one fixed id


def test_repetition_penalty_counts_the_window() -> None:
    from rtserver.voices.chattts.engine.sampling import penalty_counts

    hist = torch.tensor([[[5, 5, 7, 626]]])
    counts = penalty_counts(hist, 626)
    assert counts[0, 0, 5] == 2 and counts[0, 0, 7] == 1 and counts.sum() == 3



def refine_request(assets: LmAssets, rid: str, text: str, seed: int) -> TokenRequest:
    tok = assets.tokenizer
    stop = tok.token_id("[Ebreak]")
    assert stop is not None
    return TokenRequest(request_id=rid,
                        prompt_token_ids=tuple(tok.encode(f"[Sbreak]{text}[Pbreak]")),
                        max_tokens=24, stop_token_ids=(stop,),
                        sampling=SamplingSettings(temperature=0.7, top_p=0.7, top_k=20,
                                                  repetition_penalty=1.0, seed=seed))


async def test_refine_lane_beside_codes(assets: LmAssets) -> None:
    """Refine requests (text ids from head_text) run in their own lane while
    codes decode; each gives what it gives alone, and no stop id."""
    r1 = refine_request(assets, "t1", "hello world", 1)
    r2 = refine_request(assets, "t2", "你好我们", 2)
    async with running(make_engine(assets, slots=2, text_slots=1)) as engine:
        alone = [await engine.refine(r) for r in (r1, r2)]
    async with running(make_engine(assets, slots=2, text_slots=2)) as engine:
        codes = asyncio.create_task(collect(engine, request(assets, "c", "hello", 3, 40)))
        both = await asyncio.gather(engine.refine(r1), engine.refine(r2))
        c, _ = await codes
        assert len(c) >= 1
    assert both == alone
    stop = r1.stop_token_ids[0]
    for ids in alone:
        assert 1 <= len(ids) <= 24 and stop not in ids
        assert all(0 <= t < assets.config.num_text_tokens for t in ids)
    assert alone[0] != alone[1]


async def test_refine_cancel_frees_the_lane(assets: LmAssets) -> None:
    # 4096 positions: the long request cannot end by itself while the test looks
    async with running(make_engine(assets, slots=1, max_len=4096, text_slots=1,
                                   text_max_len=4096)) as engine:
        long = TokenRequest(request_id="long", prompt_token_ids=refine_request(
            assets, "x", "hello", 1).prompt_token_ids, max_tokens=100_000,
            stop_token_ids=(0,), sampling=SamplingSettings(seed=1, temperature=0.7))
        task = asyncio.create_task(engine.refine(long))
        lane = engine._text
        assert lane is not None
        await wait_until_async(lambda: len(lane.live) == 1, "the request holds the text lane")
        task.cancel()
        await asyncio.wait([task])  # not `await task`: this test's own cancel stays visible
        assert task.cancelled()
        await wait_until_async(lambda: not lane.live, "the cancelled request left the lane")
        # the one text slot serves the next request
        ids = await asyncio.wait_for(engine.refine(refine_request(assets, "y", "hi", 2)), 10)
        assert ids


# Tensor methods that block the host on a CUDA device (read a device value, or
# copy to the host and wait); the step loop may call none of them.
SYNCING = ("cpu", "item", "tolist", "numpy", "nonzero", "__bool__", "__int__", "__float__",
           "__index__", "__array__")


def spy(monkeypatch: pytest.MonkeyPatch, thread_name: str) -> Counter[str]:
    """Count calls, made on the engine thread, of every syncing Tensor method and
    of blocking ``copy_``s (a copy without ``non_blocking`` waits for the device)."""
    seen: Counter[str] = Counter()

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def inner(self: Any, *args: Any, **kwargs: Any) -> Any:
            if threading.current_thread().name == thread_name:
                if name != "copy_" or not kwargs.get("non_blocking", False):
                    seen[name] += 1
            return fn(self, *args, **kwargs)
        return inner

    for name in (*SYNCING, "copy_"):
        monkeypatch.setattr(torch.Tensor, name, wrap(name, getattr(torch.Tensor, name)))
    return seen


async def test_one_host_sync_per_step(assets: LmAssets, monkeypatch: pytest.MonkeyPatch
                                      ) -> None:
    """Requests of every kind of step (prefill alone, prefill beside decode,
    compaction moves, decode alone): the engine thread calls no syncing tensor
    method and no blocking copy, and waits on the device exactly once per step."""
    engine = make_engine(assets, slots=3, prefill_chunk=8, chunk_buckets=(8,),
                         prefill_rows=2, prefill_tokens=16)
    seen = spy(monkeypatch, f"{engine.name}-engine")
    reqs = [request(assets, rid, text, seed, steps) for rid, text, seed, steps in TEXTS]
    async with running(engine):
        await asyncio.gather(*(collect(engine, r) for r in reqs))
        c = engine.counters_
        await read_back(engine)
        assert c.steps > 40 and c.moves > 0 and c.prefill_batches > len(reqs)
        assert c.syncs == c.steps == engine.runner.waits
    assert seen == Counter(), seen


async def test_batched_equals_alone_through_chunks_and_moves(assets: LmAssets) -> None:
    """Prompts in 8-position chunks beside decoding rows, three slots for ten
    requests (so ends are compacted, the last ones wait, and hand-over handles
    are reused): each gives the codes it gives alone, hidden states within 1e-4."""
    reqs = [request(assets, f"{rid}{k}", text, seed + 100 * k, steps - 9 * k)
            for k in range(2) for rid, text, seed, steps in TEXTS]
    async with running(make_engine(assets, slots=1)) as engine:
        alone = [await collect(engine, r) for r in reqs]
    engine = make_engine(assets, slots=3, prefill_chunk=8, chunk_buckets=(8,),
                         prefill_rows=2, prefill_tokens=16)
    async with running(engine):
        together = await asyncio.gather(*(collect(engine, r) for r in reqs))
        assert engine.counters_.moves > 0
        assert engine.counters_.prefill_tokens == sum(len(r.prompt_token_ids) for r in reqs)
    for r, (c1, h1), (c2, h2) in zip(reqs, alone, together, strict=True):
        assert len(c1) >= 1
        np.testing.assert_array_equal(c1, c2, err_msg=r.request_id)
        np.testing.assert_allclose(h1, h2, atol=1e-4, err_msg=r.request_id)


async def read_back(engine: TorchCodeEngine) -> None:
    """Until the loop has read every launched step back (it reads the last one
    after the last delivery) and parked: its counters are still from then on."""
    assert await asyncio.to_thread(engine.wait_drained, 10), "the step loop never drained"


async def test_step_counters_on_metrics(assets: LmAssets) -> None:
    """Rows, prefill positions and host time per step (and its launch, read and
    post phases) reach /metrics through the engine collector."""
    from prometheus_client import CollectorRegistry, generate_latest

    from rtserver.engine.base import EngineCollector

    async with running(make_engine(assets, slots=4)) as engine:
        reqs = [request(assets, rid, text, seed, 20) for rid, text, seed, _ in TEXTS[:4]]
        await asyncio.gather(*(collect(engine, r) for r in reqs))
        await read_back(engine)  # no turn still counting while /metrics reads
        registry = CollectorRegistry()
        registry.register(EngineCollector(engine.stats, engine="chattts",
                                          extra_counters=engine.counters))
        text = generate_latest(registry).decode()
    got = {}
    for line in text.splitlines():
        if line.startswith("rtserver_engine_") and '{engine="chattts"}' in line:
            name, value = line.split('{engine="chattts"} ')
            got[name] = float(value)
    prompt = sum(len(r.prompt_token_ids) for r in reqs)
    assert got["rtserver_engine_prefill_tokens_total"] == prompt
    # 4 x 20 steps: 4 first steps from the prefill, the rest decode rows (plus
    # one dropped step per request after its end, at most)
    assert 4 * 19 <= got["rtserver_engine_rows_total"] <= 4 * 20
    assert got["rtserver_engine_host_seconds_total"] > 0
    assert got["rtserver_engine_host_cpu_seconds_total"] > 0
    # the host time split by phase: each part of it, none beyond it
    for kind in ("", "_cpu"):
        parts = [got[f"rtserver_engine_host_{phase}{kind}_seconds_total"]
                 for phase in ("launch", "read", "post")]
        assert all(p > 0 for p in parts), parts
        assert sum(parts) <= got[f"rtserver_engine_host{kind}_seconds_total"]
    assert got["rtserver_engine_steps_total"] >= 19
    assert got["rtserver_engine_gpu_seconds_total"] == 0  # CPU: no device timer


@pytest.mark.parametrize("buckets", [(1, 2, 4, 8), ()])
def test_padded_moves_are_the_parallel_assignment(assets: LmAssets,
                                                  buckets: tuple[int, ...]) -> None:
    """Three moves (a swap and a move into a hole), padded to a bucket of four
    with scratch onto scratch (or, with no buckets, eager as they are), do what
    the parallel assignment says to KV rows and per-slot state, and nothing else."""
    from rtserver.voices.chattts.engine.runner import ModelRunner, RunnerConfig
    from rtserver.voices.chattts.engine.scheduler import Plan, SchedulerConfig

    model = ChatLM(assets.config, assets.gpt, assets.embed, slots=6, max_len=64)
    sched = SchedulerConfig(slots=6, max_len=64, length_buckets=(16, 32, 64))
    runner = ModelRunner(model, RunnerConfig(eos_id=assets.config.eos_id, move_buckets=buckets),
                         sched)
    gen = torch.Generator().manual_seed(0)
    for t in (model.k_cache, model.v_cache):
        t.copy_(torch.randn(t.shape, generator=gen))
    runner.istate.copy_(torch.randint(0, 1000, runner.istate.shape, generator=gen))
    runner.fstate.copy_(torch.rand(runner.fstate.shape, generator=gen))
    runner.hist.copy_(torch.randint(0, 600, runner.hist.shape, generator=gen))
    before = [t.clone() for t in (model.k_cache, model.v_cache, runner.istate, runner.fstate,
                                  runner.hist)]
    moves = ((1, 4), (4, 1), (5, 2))
    runner.launch(Plan(moves=moves, move_length=32, rows=(), length=0, chunks=(),
                       prefill_tokens=0, prefill_length=0), fill=None, want_hidden=False)
    if buckets:
        assert runner.np_mv[0][:, :4].tolist() == [[1, 4, 5, 6], [4, 1, 2, 6]]  # 6: scratch
    want = [t.clone() for t in before]
    for k, t in enumerate(want):
        src = [a for a, _ in moves]
        dst = [b for _, b in moves]
        if k < 2:  # the caches: [layers, slot, heads, positions, dim], the moved length
            t[:, dst, :, :32] = before[k][:, src, :, :32]
        else:
            t[dst] = before[k][src]
    got = (model.k_cache, model.v_cache, runner.istate, runner.fstate, runner.hist)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
