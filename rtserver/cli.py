"""Command line: ``rtserver serve | say | voices | bench``."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import wave
from pathlib import Path
from typing import Any

from rtserver import __version__
from rtserver.client import RtClientError
from rtserver.config import Config, load_config
from rtserver.errors import ConfigError, RtError


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="TOML config file")
    p.add_argument("--voice", help="default voice: piper:en_US-joe-medium (embedded), a "
                   "path to a Piper .onnx, or orpheus:<speaker>")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    p.add_argument("--log-format", choices=["text", "json"],
                   help="log lines as text (default) or one JSON object each")


def _config(args: argparse.Namespace, **flags: Any) -> Config:
    flags.update({"voice.default": args.voice, "server.log_level": args.log_level,
                  "server.log_format": args.log_format})
    return load_config(args.config, flags=flags)


def _setup_logging(level: str, fmt: str = "text") -> None:
    from rtserver.logs import setup_logging

    setup_logging(level, fmt)


def _run(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:  # uvloop is a dependency; keep working without it anyway
        return asyncio.run(coro)
    return uvloop.run(coro)


def cmd_serve(args: argparse.Namespace) -> int:
    from rtserver.server.app import serve_forever
    from rtserver.server.workers import (
        Supervisor,
        child_command,
        plan_workers,
        require_shared_secret,
    )

    config = _config(args, **{"server.host": args.host, "server.port": args.port,
                              "server.workers": args.workers,
                              "server.reuse_port": True if args.reuse_port else None})
    _setup_logging(config.server.log_level, config.server.log_format)
    s = config.server
    passed = [a for name, flag in (("config", "--config"), ("voice", "--voice"),
                                   ("log_level", "--log-level"), ("log_format", "--log-format"),
                                   ("host", "--host"), ("port", "--port"))
              if getattr(args, name) is not None for a in (flag, str(getattr(args, name)))]
    if config.gpu.worker == "process" and not config.gpu.endpoint:
        from rtserver.server.split import supervise_split

        if s.port == 0:
            raise ConfigError("gpu.worker = 'process' needs a fixed port (not 0)")
        # the workers take the voices' settings, not the listener's
        worker_args = [a for i in range(0, len(passed), 2) if passed[i] not in ("--host", "--port")
                       for a in passed[i:i + 2]]
        return supervise_split(config, passed, worker_args)
    if s.workers.strip() != "1":
        plan = plan_workers(s.workers)
        if s.port == 0:
            raise ConfigError("server.workers > 1 needs a fixed port (not 0)")
        require_shared_secret(len(plan.gpus), s.api_keys, config.admission.token_secret)
        return Supervisor(child_command(passed), plan, drain_timeout_s=s.drain_timeout_s,
                          url=f"ws://{s.host}:{s.port}/v1/stream").run()
    if s.reuse_port and s.api_keys and not config.admission.token_secret:
        # other processes may share the port (this one cannot count them)
        logging.getLogger("rtserver.server").warning(
            "reuse_port with API keys but no admission.token_secret: browser tokens minted "
            "by this process are refused by any other process on the port")
    return int(_run(serve_forever(config)))  # non-zero after an engine died


def cmd_worker(args: argparse.Namespace) -> int:
    """The GPU worker process (rtserver/worker/proc.py); the supervisor of
    ``serve`` with ``[gpu] worker = "process"`` starts it."""
    from rtserver.server.workers import notify_ready
    from rtserver.worker.proc import run_worker

    config = _config(args, **{"gpu.endpoint": args.endpoint})
    _setup_logging(config.server.log_level, config.server.log_format)
    return int(_run(run_worker(config, on_ready=notify_ready)))


def cmd_say(args: argparse.Namespace) -> int:
    """One utterance to a WAV file: through the speech core in this process, or
    through a running server with ``--url``."""
    from rtserver.oneshot import speak_in_process, speak_through_server

    text = args.text if args.text != "-" else sys.stdin.read()
    if args.url:
        _setup_logging(args.log_level or "warning")
        result = _run(speak_through_server(args.url, text, sample_rate=args.sample_rate,
                                           voice=args.voice, token=args.token))
    else:
        config = _config(args)
        _setup_logging(args.log_level or "warning", config.server.log_format)
        result = _run(speak_in_process(config, text, sample_rate=args.sample_rate,
                                       progress=lambda m: print(f"rtserver: {m}",
                                                                file=sys.stderr)))
    out = Path(args.output)
    with wave.open(str(out), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(args.sample_rate)
        w.writeframes(result.pcm_s16le)
    print(f"wrote {out}: {result.audio_ms / 1000:.2f} s of audio, {len(result.segments)} "
          f"segment(s), voice {result.voice}", file=sys.stderr)
    return 0


def cmd_voices(args: argparse.Namespace) -> int:
    from rtserver.voices.registry import load_voices

    config = _config(args)

    async def list_voices() -> list[dict[str, object]]:
        vs = await load_voices(config.voice, config.families, progress=lambda m: None)
        try:
            return [{"name": n, "family": v.info.family, "sample_rate": v.info.sample_rate,
                     "language": v.info.language, "default": n == vs.default}
                    for n, v in vs.voices.items()]
        finally:
            await vs.close()

    for v in _run(list_voices()):
        print(json.dumps(v))
    return 0


def cmd_bench(args: argparse.Namespace, rest: list[str]) -> int:
    from rtserver.tools.bench.__main__ import main as bench_main

    return int(bench_main(rest) or 0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rtserver", description=__doc__)
    parser.add_argument("--version", action="version", version=f"rtserver {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="run the streaming server")
    _add_common(p)
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--workers", metavar="N|gpus",
                   help="server processes on one port (SO_REUSEPORT): a count, or 'gpus' "
                   "for one per visible GPU (default 1)")
    p.add_argument("--reuse-port", action="store_true",
                   help="bind with SO_REUSEPORT, to share the port with other processes")
    p = sub.add_parser("worker", help="run a GPU worker process (the supervisor of "
                       "'serve' starts these with [gpu] worker = \"process\")")
    _add_common(p)
    p.add_argument("--endpoint", help="ZMQ endpoint to bind (ipc://PATH or tcp://HOST:PORT)")
    p = sub.add_parser("say", help="speak text to a WAV file (in process, or through a "
                       "running server with --url)")
    _add_common(p)
    p.add_argument("text", help="text to speak ('-' reads standard input)")
    p.add_argument("--url", help="speak through the server at ws://HOST:PORT/v1/stream "
                   "(default: load the voices and speak in this process)")
    p.add_argument("--token", help="API key for --url")
    p.add_argument("-o", "--output", required=True, help="WAV file to write")
    p.add_argument("--sample-rate", type=int, default=24000,
                   choices=[8000, 12000, 16000, 24000, 48000])
    p = sub.add_parser("voices", help="list the configured voices")
    _add_common(p)
    sub.add_parser("bench", help="run the benchmark harness (see: rtserver bench --help)",
                   add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        return cmd_bench(argparse.Namespace(), argv[1:])
    args = build_parser().parse_args(argv)
    try:
        if args.command == "serve":
            return cmd_serve(args)
        if args.command == "say":
            return cmd_say(args)
        if args.command == "worker":
            return cmd_worker(args)
        return cmd_voices(args)
    except ConfigError as exc:
        print(f"rtserver: configuration error: {exc}", file=sys.stderr)
        return 2
    except RtError as exc:
        print(f"rtserver: {exc.code.value}: {exc.message}", file=sys.stderr)
        return 1
    except (RtClientError, OSError) as exc:  # say --url: the server is not there
        print(f"rtserver: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
