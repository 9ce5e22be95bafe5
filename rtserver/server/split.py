"""``rtserver serve`` with ``[gpu] worker = "process"``: GPU worker processes
and the front-end server processes around them, under one ``Supervisor``.

One GPU worker per entry of the ``server.workers`` plan (``gpus``: one per
visible GPU, pinned to it), each bound on its own ``ipc://`` socket in a
private runtime folder; ``gpu.frontends`` front ends per worker share the
port (SO_REUSEPORT), each told its worker's endpoint through
``RTSERVER_GPU_ENDPOINT``, so they serve the GPU families through it and
never load a model. The supervisor restarts a worker or a front end that
dies; front ends keep their connections while their worker is away.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Sequence

from rtserver.config import Config
from rtserver.server.workers import (
    Service,
    Supervisor,
    WorkerPlan,
    child_command,
    plan_workers,
    require_shared_secret,
)

ENV_ENDPOINT = "RTSERVER_GPU_ENDPOINT"  # the [gpu] endpoint field, by the config's rule
ENV_METRICS = "RTSERVER_GPU_METRICS_PORT"


def frontends_per_worker(config: Config, workers: int, cores: int | None = None) -> int:
    """``gpu.frontends``, or one front end per two cores (1 to 8) shared out
    over the workers: the front ends do the CPU work (sockets, segmenting,
    Opus), and a worker's engine threads want the other half of the cores."""
    if config.gpu.frontends > 0:
        return config.gpu.frontends
    cores = cores if cores is not None else (os.cpu_count() or 2)
    return max(1, min(8, cores // 2) // workers)


def supervise_split(config: Config, passed: Sequence[str], worker_args: Sequence[str]) -> int:
    """Run the workers (``rtserver worker *worker_args``) and the front ends
    (``rtserver serve *passed``) until SIGTERM; the supervisor's status."""
    s = config.server
    gpus = plan_workers(s.workers).gpus
    count = frontends_per_worker(config, len(gpus)) * len(gpus)
    require_shared_secret(count, s.api_keys, config.admission.token_secret)
    run_dir = tempfile.mkdtemp(prefix="rtserver-")
    try:
        endpoints = [f"ipc://{run_dir}/gpu-worker-{i}.sock" for i in range(len(gpus))]
        base = config.gpu.metrics_port

        def env_of(i: int) -> tuple[tuple[str, str], ...]:
            metrics = ((ENV_METRICS, str(base + i)),) if base else ()
            return ((ENV_ENDPOINT, endpoints[i]), *metrics)

        services = [Service(f"gpu worker {i}",
                            (sys.executable, "-m", "rtserver", "worker", *worker_args),
                            gpu=gpu, env=env_of(i))
                    for i, gpu in enumerate(gpus)]
        # front end i serves worker i % n; CUDA_VISIBLE_DEVICES="" keeps any
        # stray CUDA use out of them
        env = [(i, {ENV_ENDPOINT: endpoints[i % len(gpus)], "CUDA_VISIBLE_DEVICES": ""})
               for i in range(count)]
        return Supervisor(child_command(passed), WorkerPlan(("",) * count),
                          drain_timeout_s=s.drain_timeout_s,
                          url=f"ws://{s.host}:{s.port}/v1/stream",
                          services=services, child_env=env).run()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


__all__ = ["ENV_ENDPOINT", "frontends_per_worker", "supervise_split"]
