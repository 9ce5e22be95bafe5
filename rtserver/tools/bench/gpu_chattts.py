"""ChatTTS on rtserver's torch engine: the benchmark in phases (one call each).

Random weights of the real shapes (``rtserver.tools.layouts.chattts --shape
real``): the speed is real, the sound is noise, and EOS is never sampled
(``chattts.ignore_eos``), so every segment runs to the step budget, which is
set to natural speech length. Each phase is one command, so a GPU host that
runs commands one at a time can drive it; the server outlives the ``start``
phase (its own session) and ``stop`` ends it by its PID.

    python -m rtserver.tools.bench.gpu_chattts prepare --ckpt CK            # write CK if missing
    python -m rtserver.tools.bench.gpu_chattts selfcheck --ckpt CK --out OUT  # graph vs eager
    python -m rtserver.tools.bench.gpu_chattts engine --ckpt CK --out OUT     # engine-only steps/s
    python -m rtserver.tools.bench.gpu_chattts start --ckpt CK --out OUT      # server + 1 stream
    python -m rtserver.tools.bench.gpu_chattts stagger --out OUT   # steady traffic per level
    python -m rtserver.tools.bench.gpu_chattts burst --out OUT     # all users of a level at once
    python -m rtserver.tools.bench.gpu_chattts stop --out OUT

Levels default to 1,8,32,64,128,256,512. ``--device cpu --shape tiny`` runs
the same phases on a CPU with the tiny checkpoint (the smoke test does).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rtserver.tools.bench.server_proc import free_port, http_get

LEVELS = "1,8,32,64,128,256,512"
VOICE = "chattts:seed_1"
STATE = "server.json"  # in OUT: port and PID of the running server


def _env(args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ)
    # natural speech length with EOS off: ~14 characters a second plus 0.3 s
    env.update({
        "RTSERVER_CHATTTS_ASSET_DIR": str(args.ckpt),
        "RTSERVER_CHATTTS_DEVICE": args.device,
        "RTSERVER_CHATTTS_SLOTS": str(args.slots),
        "RTSERVER_CHATTTS_MAX_LEN": str(args.max_len),
        "RTSERVER_CHATTTS_IGNORE_EOS": "true",
        "RTSERVER_CHATTTS_BUDGET_BASE_S": "0.3",
        "RTSERVER_CHATTTS_BUDGET_S_PER_CHAR": "0.07",
        "RTSERVER_CHATTTS_BUDGET_S_PER_CJK": "0.25",
        "RTSERVER_CHATTTS_DECODER": args.decoder,
        # one client address opens every stream: per-address rate limits and the
        # first-heard admission check off, so the run measures the voice
        "RTSERVER_ADMISSION_CONNECTIONS_PER_MINUTE": "0",
        "RTSERVER_ADMISSION_CONTEXTS_PER_MINUTE": "0",
        "RTSERVER_ADMISSION_CHARS_PER_MINUTE": "0",
        "RTSERVER_ADMISSION_FIRST_HEARD_TARGET_MS": "0",
    })
    if args.device == "cpu":
        env["RTSERVER_CHATTTS_CUDA_GRAPHS"] = "false"
    return env


def prepare(args: argparse.Namespace) -> None:
    from rtserver.tools.layouts.chattts import write_tiny_chattts

    if (Path(args.ckpt) / "asset" / "gpt" / "model.safetensors").is_file():
        print(f"{args.ckpt}: already written")
        return
    t = time.monotonic()
    write_tiny_chattts(args.ckpt, shape=args.shape, seed=0)
    print(f"{args.ckpt}: {args.shape} shapes, random weights, {time.monotonic() - t:.1f} s")


def selfcheck(args: argparse.Namespace) -> None:
    from rtserver.tools.selfcheck.chattts_engine import run

    res = run(str(args.ckpt), device=args.device,
              dtype="bfloat16" if args.device.startswith("cuda") else "float32",
              batch=args.check_batch, steps=16, max_len=256,
              graphs=args.device.startswith("cuda"), alone=not args.device.startswith("cuda"),
              compare_hf=True)
    text = json.dumps(res, indent=1)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "selfcheck.json").write_text(text + "\n")


def _wait_ready(port: int, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode} (see server.log)")
        status, _ = http_get(f"http://127.0.0.1:{port}/ready", timeout=1.0)
        if status == 200:
            return
        time.sleep(0.5)
    raise SystemExit("server not ready in time (see server.log)")


def _bench(args: argparse.Namespace, port: int, name: str, extra: list[str]) -> int:
    notes = [f"ChatTTS {args.shape} shapes, random weights: speed real, sound noise; "
             "EOS off, budget = natural speech length (0.3 s + 0.07 s/char)",
             f"engine: {args.slots} slots, max_len {args.max_len}, device {args.device}, "
             f"decoder route {args.decoder}; admission rate limits and first-heard check off"]
    cmd = [sys.executable, "-m", "rtserver.tools.bench", "--url", f"ws://127.0.0.1:{port}/v1/stream",
           "--voice", args.voice, "--load", "stream", "--fragment", "token",
           "--tokens-per-s", "40", "--ttfa-p99-ms", "120", "--no-plots",
           "--out", str(args.out / name)]
    for n in notes:
        cmd += ["--note", n]
    cmd += extra
    print("+", " ".join(cmd), flush=True)
    with open(args.out / f"bench-{name}.log", "ab") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False)
    print((args.out / f"bench-{name}.log").read_text()[-3000:])
    return proc.returncode


def _state(args: argparse.Namespace) -> dict[str, int]:
    path = args.out / STATE
    if not path.is_file():
        raise SystemExit(f"no running server recorded in {path}: run the start phase first")
    data: dict[str, int] = json.loads(path.read_text())
    return data


def start(args: argparse.Namespace) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    port = args.port or free_port()
    log = open(args.out / "server.log", "ab")
    t = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rtserver", "serve", "--voice", args.voice,
         "--host", "127.0.0.1", "--port", str(port)],
        env=_env(args), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True)
    (args.out / STATE).write_text(json.dumps({"port": port, "pid": proc.pid}))
    _wait_ready(port, proc, args.ready_timeout)
    print(f"server ready in {time.monotonic() - t:.1f} s on port {port} (pid {proc.pid})")
    if args.single_s <= 0:
        return 0
    return _bench(args, port, "single", ["--concurrency", "1", "--back-to-back",
                                         "--duration", str(args.single_s), "--warmup", "2"])


def stagger(args: argparse.Namespace) -> int:
    port = _state(args)["port"]
    return _bench(args, port, "stagger", ["--concurrency", args.levels, "--duration",
                                          str(args.duration), "--stagger-s", str(args.stagger_s),
                                          "--warmup", "0"])


def burst(args: argparse.Namespace) -> int:
    port = _state(args)["port"]
    return _bench(args, port, "burst", ["--concurrency", args.levels, "--duration",
                                        str(args.duration), "--warmup", "0"])


def metrics(args: argparse.Namespace) -> None:
    port = _state(args)["port"]
    status, body = http_get(f"http://127.0.0.1:{port}/metrics", timeout=5.0)
    (args.out / "metrics.txt").write_bytes(body)
    print(status, "\n".join(line for line in body.decode().splitlines()
                            if line.startswith("rtserver_engine")))


def stop(args: argparse.Namespace) -> None:
    st = _state(args)
    pid = st["pid"]
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        print(f"server {pid} already gone")
    else:
        for _ in range(60):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.5)
        else:
            os.kill(pid, signal.SIGKILL)
        print(f"server {pid} stopped")
    (args.out / STATE).unlink(missing_ok=True)


def engine(args: argparse.Namespace) -> None:
    """Engine only (no server, no decoder): N requests decoding together, steps/s."""
    from rtserver.tools.bench.gpu_chattts_engine import run_engine_levels

    res = run_engine_levels(str(args.ckpt), device=args.device, slots=args.slots,
                            max_len=args.max_len, levels=[int(x) for x in args.levels.split(",")],
                            steps=args.engine_steps)
    text = json.dumps(res, indent=1)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "engine.json").write_text(text + "\n")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("phase", choices=["prepare", "selfcheck", "engine", "start", "stagger",
                                     "burst", "metrics", "stop"])
    p.add_argument("--ckpt", type=Path, default=Path("/tmp/chattts-random"))
    p.add_argument("--shape", choices=["real", "tiny"], default="real")
    p.add_argument("--out", type=Path, default=Path("chattts-bench"))
    p.add_argument("--device", default="cuda")
    p.add_argument("--decoder", choices=["decoder", "dvae"], default="decoder")
    p.add_argument("--slots", type=int, default=512)
    p.add_argument("--max-len", type=int, default=1536)
    p.add_argument("--voice", default=VOICE)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ready-timeout", type=float, default=600.0)
    p.add_argument("--single-s", type=float, default=30.0, help="start: 1-stream run (0: none)")
    p.add_argument("--levels", default=LEVELS)
    p.add_argument("--duration", type=float, default=18.0)
    p.add_argument("--stagger-s", type=float, default=8.0)
    p.add_argument("--check-batch", type=int, default=64)
    p.add_argument("--engine-steps", type=int, default=64)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    fn = {"prepare": prepare, "selfcheck": selfcheck, "engine": engine, "start": start,
          "stagger": stagger, "burst": burst, "metrics": metrics, "stop": stop}[args.phase]
    rc = fn(args)
    return int(rc or 0)


if __name__ == "__main__":
    raise SystemExit(main())
