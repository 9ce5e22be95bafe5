"""Several server processes behind one port: ``rtserver serve --workers gpus``
with two (pretend) GPUs listed in CUDA_VISIBLE_DEVICES runs two Piper
processes on the CPU, each pinned to its own device id. Connections spread over both (each says
which process it is in ``ready``); SIGTERM to one drains it (its open stream
finishes) while the other keeps serving; a crashed one is restarted; SIGTERM to
the supervisor drains both and exits 0."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rtserver.client import AudioFrames, RtClient
from rtserver.errors import ConfigError
from rtserver.server.split import frontends_per_worker
from rtserver.server.workers import (
    Service,
    Supervisor,
    WorkerIdentity,
    WorkerPlan,
    plan_workers,
    visible_gpus,
)
from rtserver.testing.procnet import listens
from rtserver.testing.wait import scaled, wait_until_async
from tests.deploy.util import free_port, free_port_block, scrape

WORKER = re.compile(r"worker (\d+) of (\d+), pid (\d+)(?:, gpu (\S+?)\))?")
LONG_TEXT = " ".join(["The server keeps speaking while its neighbour takes the new calls."] * 5)


# --- the plan --------------------------------------------------------------------------
def test_plan_counts_and_gpus() -> None:
    assert plan_workers("3").gpus == ("", "", "")
    assert plan_workers("gpus", gpus=lambda: ["0", "1"]).gpus == ("0", "1")
    with pytest.raises(ConfigError, match="no GPU is visible"):
        plan_workers("gpus", gpus=lambda: [])
    for bad in ("0", "-2", "two"):
        with pytest.raises(ConfigError, match=r"server\.workers"):
            plan_workers(bad)


def test_visible_gpus_reads_cuda_visible_devices_like_cuda() -> None:
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}) == ["2", "3"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-a1b2,GPU-c3d4"}) == ["GPU-a1b2",
                                                                           "GPU-c3d4"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "0,-1,1"}) == ["0"]  # CUDA stops at -1

    def smi(*args: object, **kw: object) -> subprocess.CompletedProcess[str]:
        out = "GPU 0: NVIDIA H200 (UUID: GPU-1)\nGPU 1: NVIDIA H200 (UUID: GPU-2)\n"
        return subprocess.CompletedProcess(["nvidia-smi"], 0, out, "")

    assert visible_gpus({}, run=smi) == ["0", "1"]

    def missing(*args: object, **kw: object) -> subprocess.CompletedProcess[str]:
        raise FileNotFoundError("nvidia-smi")

    assert visible_gpus({}, run=missing) == []


def test_identity_from_the_supervisors_environment() -> None:
    ident = WorkerIdentity.from_env({"RTSERVER_WORKER_ID": "1", "RTSERVER_WORKER_COUNT": "2",
                                     "RTSERVER_WORKER_GPU": "3"})
    assert ident is not None and (ident.index, ident.count, ident.gpu) == (1, 2, "3")
    assert WORKER.search(ident.describe())
    assert WorkerIdentity.from_env({}) is None


def test_workers_need_a_fixed_port() -> None:
    proc = subprocess.run([sys.executable, "-m", "rtserver", "serve", "--workers", "2",
                           "--port", "0"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "fixed port" in proc.stderr


# --- the supervisor's policy, with stand-in children -----------------------------------
def supervise(code: str, count: int = 1, *, max_deaths: int = 5, backoff_base_s: float = 1.0,
              on_say: Callable[[str], None] = lambda line: None) -> tuple[int, list[str]]:
    """Run a Supervisor over ``python -c code`` children; (status, its lines)."""
    said: list[str] = []

    def say(line: str) -> None:
        said.append(line)
        on_say(line)

    sup = Supervisor([sys.executable, "-c", code], WorkerPlan(("",) * count),
                     drain_timeout_s=5, url="ws://test", say=say, max_deaths=max_deaths,
                     backoff_base_s=backoff_base_s)
    return sup.run(), said


def test_a_configuration_error_stops_everything_with_status_2() -> None:
    status, said = supervise("import sys; sys.exit(2)", count=2)
    assert status == 2
    assert any("configuration error" in line for line in said)


def test_a_child_that_keeps_dying_is_restarted_then_gives_up() -> None:
    status, said = supervise("import sys; sys.exit(1)", max_deaths=2, backoff_base_s=0.01)
    assert status == 1
    assert sum("restarting in" in line for line in said) == 2, said
    assert any("died 3 times" in line for line in said), said


def test_a_dead_childs_own_children_are_killed_with_it(tmp_path: Path) -> None:
    """A child killed with -9 leaves its children (vLLM's EngineCore holding
    the GPU's memory); the supervisor kills its whole process group."""
    pids = tmp_path / "pids"
    child = ("import os, signal, subprocess, sys\n"
             "k = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
             f"open({str(pids)!r}, 'a').write(f'{{k.pid}}\\n')\n"
             "os.kill(os.getpid(), signal.SIGKILL)\n")
    status, said = supervise(child, max_deaths=1, backoff_base_s=0.01)
    assert status == 1 and any("died (-9)" in line for line in said), said
    orphans = [int(p) for p in pids.read_text().split()]
    assert len(orphans) == 2  # the first life and its restart
    for pid in orphans:
        for _ in range(100):  # the kernel reaps it once init waits for it
            stat = Path(f"/proc/{pid}/stat")
            if not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"process {pid} outlived its parent's death")


def test_children_that_exit_0_are_not_restarted() -> None:
    status, said = supervise("pass", count=2)
    assert status == 0
    assert sum("started" in line for line in said) == 2  # no restart


def test_sigterm_reaches_each_child_once_and_status_is_0() -> None:
    # the child reports ready like a server, then waits for SIGTERM and exits 0
    child = ("import os, signal, sys, time\n"
             "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
             "os.write(int(os.environ['RTSERVER_WORKER_READY_FD']), b'ready')\n"
             "time.sleep(60)\n")

    def stop_when_ready(line: str) -> None:
        if "workers ready" in line:  # as a process manager would: SIGTERM to the supervisor
            os.kill(os.getpid(), signal.SIGTERM)

    status, said = supervise(child, count=2, on_say=stop_when_ready)
    assert status == 0
    assert "2 of 2 workers ready on ws://test" in said
    assert sum("exited (0)" in line for line in said) == 2, said


def test_services_start_first_and_stop_after_the_servers(tmp_path: Path) -> None:
    """A GPU worker (a service) is started before the front ends and stopped
    only once they have drained, so the contexts they finish can still speak;
    each child gets its own environment."""
    seen = tmp_path / "env"
    child = ("import os, signal, sys, time\n"
             "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
             f"open({str(seen)!r}, 'a').write(os.environ.get('ROLE', '?') + '\\n')\n"
             "os.write(int(os.environ['RTSERVER_WORKER_READY_FD']), b'ready')\n"
             "time.sleep(60)\n")
    said: list[str] = []

    def say(line: str) -> None:
        said.append(line)
        if "workers ready" in line:
            os.kill(os.getpid(), signal.SIGTERM)

    sup = Supervisor([sys.executable, "-c", child], WorkerPlan(("", "")), drain_timeout_s=5,
                     url="ws://test", say=say,
                     services=[Service("gpu worker 0", (sys.executable, "-c", child),
                                       env=(("ROLE", "worker"),))],
                     child_env=[(0, {"ROLE": "front 0"}), (1, {"ROLE": "front 1"})])
    assert sup.run() == 0
    assert said[0].startswith("gpu worker 0 started"), said
    assert "3 of 3 workers ready on ws://test" in said
    exits = [line for line in said if "exited (0)" in line]
    assert exits[-1] == "gpu worker 0 exited (0)" and len(exits) == 3, said
    assert sorted(seen.read_text().split("\n")[:-1]) == ["front 0", "front 1", "worker"]


def test_a_service_that_stops_on_its_own_is_started_again(tmp_path: Path) -> None:
    """SIGTERM to the GPU worker alone: the front ends still need it."""
    marker = tmp_path / "once"
    service = ("import os, signal, sys, time\n"
               f"m = {str(marker)!r}\n"
               "if not os.path.exists(m):\n"
               "    open(m, 'w').close(); sys.exit(0)\n"
               "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
               "os.write(int(os.environ['RTSERVER_WORKER_READY_FD']), b'ready')\n"
               "time.sleep(60)\n")
    server = ("import os, signal, sys, time\n"
              "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
              "os.write(int(os.environ['RTSERVER_WORKER_READY_FD']), b'ready')\n"
              "time.sleep(60)\n")
    said: list[str] = []

    def say(line: str) -> None:
        said.append(line)
        if "workers ready" in line:
            os.kill(os.getpid(), signal.SIGTERM)

    sup = Supervisor([sys.executable, "-c", server], WorkerPlan(("",)), drain_timeout_s=5,
                     url="ws://test", say=say,
                     services=[Service("gpu worker 0", (sys.executable, "-c", service))])
    assert sup.run() == 0
    assert "gpu worker 0 exited (0); starting it again" in said
    assert sum(line.startswith("gpu worker 0 started") for line in said) == 2, said
    assert "2 of 2 workers ready on ws://test" in said


def test_front_ends_per_worker_follow_the_cores() -> None:
    from rtserver.config import load_config

    auto = load_config(env={})
    assert frontends_per_worker(auto, workers=1, cores=16) == 8
    assert frontends_per_worker(auto, workers=2, cores=16) == 4
    assert frontends_per_worker(auto, workers=1, cores=2) == 1
    assert frontends_per_worker(auto, workers=4, cores=4) == 1
    fixed = load_config(env={}, flags={"gpu.frontends": 3})
    assert frontends_per_worker(fixed, workers=2, cores=64) == 3


# --- two processes on one port ---------------------------------------------------------
class Supervised:
    """``rtserver serve --workers gpus`` with ``CUDA_VISIBLE_DEVICES=3,5`` as a
    subprocess (Piper ignores the devices; each child is told its own); its
    output collected."""

    def __init__(self, tmp: Path, extra_env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.metrics_base = free_port_block(2, avoid=(self.port,))  # child i: base + i
        env = dict(os.environ, RTSERVER_SERVER_METRICS_PORT=str(self.metrics_base),
                   RTSERVER_SERVER_DRAIN_TIMEOUT_S="20", CUDA_VISIBLE_DEVICES="3,5",
                   **(extra_env or {}))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rtserver", "serve", "--workers", "gpus",
             "--port", str(self.port)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, text=True)
        self.lines: list[str] = []
        self._new = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._new:
                self.lines.append(line.rstrip())
                self._new.notify_all()

    def wait_for(self, pattern: str, timeout: float = 120.0, after: int = 0) -> re.Match[str]:
        rx = re.compile(pattern)
        deadline = time.monotonic() + scaled(timeout)
        with self._new:
            while True:
                for line in self.lines[after:]:
                    if m := rx.search(line):
                        return m
                left = deadline - time.monotonic()
                exited = self.proc.poll() is not None
                if left <= 0 or (exited and not self._new.wait(0.5)):
                    raise AssertionError(f"no line like {pattern!r}:\n" + "\n".join(self.lines))
                self._new.wait(min(left, 0.5))

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/stream"


@contextlib.contextmanager
def supervising(tmp_path: Path, extra_env: dict[str, str] | None = None
                ) -> Iterator[Supervised]:
    sup = Supervised(tmp_path, extra_env)
    try:
        sup.wait_for(r"2 of 2 workers ready")
        for gpu in ("3", "5"):  # the supervisor pinned one child to each
            assert any(f"on GPU {gpu}" in line for line in sup.lines), sup.lines
        yield sup
    finally:
        if sup.proc.poll() is None:
            os.kill(sup.proc.pid, signal.SIGTERM)
            try:
                sup.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.kill(sup.proc.pid, signal.SIGKILL)
                sup.proc.wait(10)


@pytest.fixture
def supervised(tmp_path: Path) -> Iterator[Supervised]:
    with supervising(tmp_path) as sup:
        yield sup


async def connect_to(url: str, want_pid: int | None = None, tries: int = 64
                     ) -> tuple[RtClient, int]:
    """A connection (to the process ``want_pid`` if given) and its server's pid."""
    for _ in range(tries):
        client = await RtClient.connect(url)
        m = WORKER.search(client.ready.server)
        assert m, client.ready.server
        pid = int(m.group(3))
        if want_pid is None or pid == want_pid:
            return client, pid
        await client.close()
    raise AssertionError(f"{tries} connections never reached pid {want_pid}")


async def speak(client: RtClient, text: str) -> float:
    ctx = await client.start(format="pcm_s16le", sample_rate=16000)
    await ctx.send_text(text)
    await ctx.end()
    result = await ctx.collect()
    assert result.ok, (result.error, result.failure)
    return result.audio_ms


@pytest.mark.slow
async def test_two_processes_share_the_port_and_drain_one_by_one(
        supervised: Supervised) -> None:
    url = supervised.url
    # connections spread: the kernel hashes each new connection to a listener
    pids: dict[int, int] = {}
    gpus: dict[int, str] = {}
    for _ in range(64):
        client, pid = await connect_to(url)
        m = WORKER.search(client.ready.server)
        assert m is not None
        gpus[pid] = m.group(4)
        await client.close()
        pids[pid] = pids.get(pid, 0) + 1
        if len(pids) == 2 and min(pids.values()) >= 2:
            break
    assert len(pids) == 2, pids
    assert sorted(gpus.values()) == ["3", "5"]  # one device each, as listed
    # each process serves its own /metrics, labelled with its worker and GPU
    infos = [scrape(f"http://127.0.0.1:{supervised.metrics_base + i}/metrics")
             for i in (0, 1)]
    labels = [re.search(r'rtserver_worker_info\{gpu="([^"]*)",pid="(\d+)",worker="(\d)"', body)
              for body in infos]
    assert all(labels), infos
    assert {int(m.group(2)): m.group(1) for m in labels if m} == gpus
    assert [(m.group(3), m.group(1)) for m in labels if m] == [("0", "3"), ("1", "5")]

    # a long stream on one process, then SIGTERM to that process alone
    victim = next(iter(pids))
    client, _ = await connect_to(url, want_pid=victim)
    ctx = await client.start(format="pcm_s16le", sample_rate=16000)
    await ctx.send_text(LONG_TEXT)
    await ctx.end()
    heard_ms = 0  # read until audio flows
    async with contextlib.aclosing(ctx.events()) as events:
        async for event in events:
            if isinstance(event, AudioFrames):
                heard_ms += len(event.frames) * 20
                break
    mark = len(supervised.lines)
    os.kill(victim, signal.SIGTERM)
    supervised.wait_for(r"rtserver\[\d\]: draining", timeout=30, after=mark)
    # it prints that line just before it stops listening: a connection made in
    # between could still be queued on its listener, and be reset with it
    await wait_until_async(lambda: not listens(victim, supervised.port),
                           "the draining process no longer listens")
    # the other process takes every new connection meanwhile, and serves it
    others = set()
    for _ in range(4):
        other, pid = await connect_to(url)
        others.add(pid)
        assert await speak(other, "Still here.") > 300
        await other.close()
    assert others and victim not in others
    # the drained stream finished: done, with all of its audio
    rest = await ctx.collect(decode=False)
    assert rest.ok, (rest.error, rest.failure)
    heard_ms += rest.frame_count * 20
    assert heard_ms > 10_000, heard_ms  # five long sentences, every frame of them
    await client.close()
    m = supervised.wait_for(r"worker (\d) exited \(0\)", timeout=60, after=mark)
    supervised.wait_for(r"1 of 2 workers ready", timeout=10, after=mark)
    assert supervised.proc.poll() is None  # the supervisor keeps the other one

    # a crash is restarted while the survivor serves
    survivor = next(iter(others))
    mark = len(supervised.lines)
    os.kill(survivor, signal.SIGKILL)
    supervised.wait_for(r"worker \d died \(-9\); restarting in 1 s", timeout=30, after=mark)
    mark = len(supervised.lines)
    supervised.wait_for(r"1 of 2 workers ready", timeout=120, after=mark)
    client, pid = await connect_to(url)
    assert pid not in (victim, survivor)
    assert await speak(client, "Back again.") > 300
    await client.close()
    assert m.group(1) in "01"

    # SIGTERM to the supervisor: the rest drain, exit status 0
    os.kill(supervised.proc.pid, signal.SIGTERM)
    assert await asyncio.to_thread(supervised.proc.wait, 60) == 0


# --- browser tokens across processes ----------------------------------------------------
def test_workers_with_api_keys_need_a_shared_token_secret() -> None:
    """Without ``admission.token_secret`` each process would sign tokens with
    its own random key: the start fails at once, naming the setting."""
    env = dict(os.environ, RTSERVER_SERVER_API_KEYS="k1")
    env.pop("RTSERVER_ADMISSION_TOKEN_SECRET", None)
    proc = subprocess.run([sys.executable, "-m", "rtserver", "serve", "--workers", "2",
                           "--port", str(free_port())], capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == 2, proc.stderr
    assert "admission.token_secret" in proc.stderr
    assert "RTSERVER_ADMISSION_TOKEN_SECRET" in proc.stderr


def test_a_short_token_secret_is_refused() -> None:
    from rtserver.config import load_config

    with pytest.raises(ConfigError, match=r"admission\.token_secret must be at least 32"):
        load_config(env={"RTSERVER_ADMISSION_TOKEN_SECRET": "short"})


def mint_token(port: int, key: str) -> str:
    """``POST /v1/tokens`` on a new connection (whichever process the kernel picks)."""
    import json
    import urllib.request

    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/tokens", method="POST",
                                 data=b"{}", headers={"Authorization": f"Bearer {key}"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=10) as resp:
        return str(json.loads(resp.read())["token"])


@pytest.mark.slow
async def test_a_token_minted_by_one_process_opens_a_stream_on_every_process(
        tmp_path: Path) -> None:
    """Two processes with a shared ``token_secret``: a browser token from
    ``POST /v1/tokens`` (each minted on a new connection, so by either
    process) is accepted by both, seen by the pid in ``ready``."""
    secret = "a-test-secret-shared-by-every-process-0123"
    env = {"RTSERVER_SERVER_API_KEYS": "k1", "RTSERVER_ADMISSION_TOKEN_SECRET": secret}
    with supervising(tmp_path, env) as sup:
        tokens = [await asyncio.to_thread(mint_token, sup.port, "k1") for _ in range(4)]
        for token in tokens:
            pids: set[int] = set()
            for _ in range(64):  # new connections spread over the processes
                client = await RtClient.connect(f"{sup.url}?token={token}")  # as a browser
                m = WORKER.search(client.ready.server)
                await client.close()
                assert m is not None, client.ready.server
                pids.add(int(m.group(3)))
                if len(pids) == 2:
                    break
            assert len(pids) == 2, pids  # accepted by both processes
