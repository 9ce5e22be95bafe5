"""vLLM's EngineCore in this process: ``LLMEngine`` without multiprocessing,
stepped by one thread of ours, behind the part of ``AsyncLLM`` that
``VllmEngine`` uses (``[orpheus] engine_process = "inproc"``).

Why (issue 24): ``AsyncLLM`` always runs EngineCore in a process of its own
(vLLM 0.26 and 0.32, ``EngineCoreClient.make_async_mp_client``), so the GPU
worker's vocoder and vLLM's model run in two CUDA contexts, and two contexts
on one GPU are time-sliced, never concurrent: at 192-256 Orpheus streams both
processes' kernels were in flight at once 30-39 % of the time, each waiting
out the other's slices (``bench/results/h200-orpheus-timeline-2026-12-04``).
In one process both stages share a context: their kernels can run side by
side, and CUDA stream priorities order them.

The step thread owns the ``LLMEngine``: every call into it (add, abort,
LoRA, profiling) is queued to that thread and applied between steps. Outputs
of a step go to the event loop in one callback and into each request's
``RequestOutputCollector`` (vLLM's own: deltas merge while a consumer lags,
as in ``AsyncLLM``). A step that raises kills the engine: every open request
and every later call gets ``EngineDeadError``, as from ``AsyncLLM``.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import os
import threading
from collections.abc import AsyncGenerator, Callable
from typing import Any

from vllm import SamplingParams
from vllm.v1.engine.exceptions import EngineDeadError
from vllm.v1.engine.output_processor import RequestOutputCollector

log = logging.getLogger(__name__)

IDLE_WAIT_S = 0.5  # an idle step thread re-checks its stop flag this often


class InprocLLM:
    """``AsyncLLM``'s ``generate``/``abort``/LoRA/profiling surface over an
    in-process ``LLMEngine`` stepped by a thread. Build it with
    ``from_engine_args`` (blocking: loads the model) from a worker thread,
    then ``start(loop)`` on the event loop that will consume it."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self.model_config = engine.model_config
        self._commands: collections.deque[Callable[[], None]] = collections.deque()
        self._wake = threading.Event()
        self._stop = False
        self._closed = False
        self._collectors: dict[str, RequestOutputCollector] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._dead: BaseException | None = None
        self._pending: set[concurrent.futures.Future[Any]] = set()  # _call's, unanswered

    @classmethod
    def from_engine_args(cls, args: Any, stat_loggers: list[Any] | None = None) -> InprocLLM:
        """Build the engine (loads the model: blocking). ``stat_loggers`` get
        vLLM's step stats, as with ``AsyncLLM``, without vLLM's own loggers."""
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.llm_engine import LLMEngine
        from vllm.v1.executor import Executor
        from vllm.v1.metrics.loggers import StatLoggerManager

        # read when EngineCore's client is made: "1" would move it to a process
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        vllm_config = args.create_engine_config(UsageContext.ENGINE_CONTEXT)
        # log_stats on (EngineCore then sends scheduler stats, the output
        # processor counts tokens), as AsyncLLM turns it on for custom loggers;
        # LLMEngine would add vLLM's default loggers too (a log line every 10 s,
        # its Prometheus metrics), so its manager is replaced by ours alone
        engine = LLMEngine(vllm_config=vllm_config,
                           executor_class=Executor.get_class(vllm_config), log_stats=True,
                           stat_loggers=stat_loggers, multiprocess_mode=False)
        if stat_loggers:
            engine.logger_manager = StatLoggerManager(
                vllm_config=vllm_config, custom_stat_loggers=stat_loggers,
                enable_default_loggers=False)
        else:
            engine.logger_manager = None
        return cls(engine)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="vllm-step", daemon=True)
        self._thread.start()

    # --- the AsyncLLM surface ----------------------------------------------------

    @property
    def errored(self) -> bool:
        return self._dead is not None

    async def generate(self, prompt: Any, params: SamplingParams, request_id: str, *,
                       priority: int = 0, lora_request: Any = None
                       ) -> AsyncGenerator[Any, None]:
        self._check()
        collector = RequestOutputCollector(params.output_kind, request_id)
        self._collectors[request_id] = collector
        engine = self._engine

        def add() -> None:
            try:
                engine.add_request(request_id, prompt, params, lora_request=lora_request,
                                   priority=priority)
            except Exception as exc:  # this request's fault (a prompt too long): its error
                self._post(collector.put, exc)

        self._submit(add)
        finished = False
        try:
            while not finished:
                out = collector.get_nowait() or await collector.get()
                finished = out.finished
                yield out
        finally:
            self._collectors.pop(request_id, None)
            if not finished:
                self._submit(lambda: engine.abort_request([request_id]))

    def get_num_unfinished_requests(self) -> int:
        """Requests the engine still tracks (read across threads: a snapshot)."""
        return int(self._engine.get_num_unfinished_requests())

    async def abort(self, request_id: str) -> None:
        """Abort ``request_id`` (unknown ids are no-ops); returns once the step
        thread applied it, as ``AsyncLLM.abort`` returns with the request gone
        from its frontend."""
        engine = self._engine
        await self._call(lambda: engine.abort_request([request_id]))

    async def add_lora(self, lora_request: Any) -> bool:
        return bool(await self._call(lambda: self._engine.add_lora(lora_request)))

    async def remove_lora(self, lora_id: int) -> bool:
        return bool(await self._call(lambda: self._engine.remove_lora(lora_id)))

    async def start_profile(self) -> None:
        await self._call(self._engine.start_profile)

    async def stop_profile(self) -> None:
        await self._call(self._engine.stop_profile)

    def shutdown(self) -> None:
        """Stop the step thread (open requests end with ``EngineDeadError``) and
        release the engine."""
        self._closed = True
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        core = getattr(self._engine, "engine_core", None)  # InprocClient: frees the model
        if core is not None:
            core.shutdown()

    # --- the step thread -----------------------------------------------------------

    def _check(self) -> None:
        if self._dead is not None:
            raise EngineDeadError(f"vLLM's in-process engine died: {self._dead!r}")
        if self._closed:
            raise EngineDeadError("vLLM's in-process engine was shut down")
        if self._thread is None:
            raise RuntimeError("InprocLLM.start was not called")

    def _submit(self, command: Callable[[], None]) -> None:
        self._commands.append(command)
        self._wake.set()

    async def _call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the step thread between steps; its result or error."""
        self._check()
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._pending.add(done)

        def command() -> None:
            self._pending.discard(done)
            try:
                done.set_result(fn())
            except Exception as exc:
                done.set_exception(exc)

        self._submit(command)
        return await asyncio.wrap_future(done)

    def _run(self) -> None:
        engine, commands = self._engine, self._commands
        try:
            while not self._stop:
                while commands:
                    command = commands.popleft()
                    try:
                        command()
                    except Exception:  # a call's fault, not the engine's: logged
                        log.exception("a call into vLLM's in-process engine failed")
                if not engine.has_unfinished_requests():
                    self._wake.wait(IDLE_WAIT_S)
                    self._wake.clear()
                    continue
                outputs = engine.step()
                if outputs:
                    self._post(self._deliver, outputs)
        except BaseException as exc:
            log.exception("vLLM's in-process engine died")
            self._dead = exc
        finally:
            self._fail_commands()
            self._post(self._fail_all, self._dead or EngineDeadError("vLLM was shut down"))

    def _fail_commands(self) -> None:
        """Commands left when the thread ends: run none; their callers get
        ``EngineDeadError``."""
        self._commands.clear()
        for done in list(self._pending):
            self._pending.discard(done)
            if not done.done():
                done.set_exception(EngineDeadError("vLLM's in-process engine is gone"))

    def _post(self, fn: Callable[[Any], None], arg: Any) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(fn, arg)
            except RuntimeError:  # the loop closed meanwhile
                pass

    def _deliver(self, outputs: list[Any]) -> None:
        collectors = self._collectors
        for out in outputs:
            collector = collectors.get(out.request_id)
            if collector is not None:
                collector.put(out)

    def _fail_all(self, exc: BaseException) -> None:
        dead = exc if isinstance(exc, EngineDeadError) else EngineDeadError(
            f"vLLM's in-process engine died: {exc!r}")
        for collector in list(self._collectors.values()):
            collector.put(dead)
