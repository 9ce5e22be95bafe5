"""One frozen configuration, built once: defaults < file < RTSERVER_* env < flags.

Sections are frozen dataclasses. A file is TOML with one table per section
(``[server]``, ``[voice]``, ...). An environment variable names section and
field, ``RTSERVER_SERVER_PORT=9000``; flags arrive as a mapping of
``"section.field"`` to values. Every value is checked against its field's type;
a bad one raises ``ConfigError`` naming where it came from.

Voice families own their sections (``[orpheus]``, ...): the voice registry
lists them (``rtserver.voices.registry.family_sections``) and they are parsed
the same way, into ``Config.families``; a section's ``check()`` runs once all
sources are applied.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

from rtserver.audio.opus import OpusConfig
from rtserver.cache import CacheConfig
from rtserver.errors import ConfigError
from rtserver.pacing.hints import HintConfig
from rtserver.text.segmenter import SegmenterConfig
from rtserver.voices.registry import VoiceSettings, family_sections

ENV_PREFIX = "RTSERVER_"
S = TypeVar("S")


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8765
    # Keys accepted as Bearer tokens or ?token=; empty means no auth.
    api_keys: tuple[str, ...] = ()
    # Allowed Origin headers for browsers; empty allows any (and none).
    origins: tuple[str, ...] = ()
    # Origins whose pages may call the HTTP API (CORS, through Starlette's
    # CORSMiddleware): "*" for any; empty (the default) answers no CORS
    # request, so a preflight OPTIONS is 405. The WebSocket's check is
    # ``origins`` above: browsers send no preflight for a WebSocket.
    cors_origins: tuple[str, ...] = ()
    max_message_bytes: int = 65536
    # Characters a context may receive in total (protects memory; a long chat
    # reply is ~5,000 characters).
    max_text_chars: int = 50_000
    max_contexts: int = 8
    max_connections: int = 10_000
    # Audio queued per connection before its producers wait (backpressure).
    send_queue_ms: int = 10_000
    # A send blocked this long means the client stopped reading: overloaded.
    overload_after_s: float = 10.0
    # A close frame (and the message before it) stuck this long behind data the
    # client does not read: the TCP connection is dropped (server.asgi).
    close_timeout_s: float = 5.0
    # Kernel send buffer per connection, bytes; 0 keeps the OS default.
    socket_send_buffer: int = 0
    drain_timeout_s: float = 10.0
    # Threads that encode Opus for all connections; 0: one per core, at most 8.
    encode_threads: int = 0
    ping_interval_s: float = 20.0
    # A connection with no open context that sends nothing for this long is
    # closed (1000, "idle"); 0 keeps it open (pings still detect dead peers).
    idle_timeout_s: float = 600.0
    # Control messages (JSON) queued for a connection and not yet sent: past
    # this the client floods faster than it reads, and gets 1008. 256 holds
    # every reply of 8 contexts' worth of segments and hints many times over.
    max_queued_messages: int = 256
    # Messages a connection may send per second, with bursts of
    # ``message_burst``; past them its reader waits (TCP pushes back), so one
    # connection's flood cannot take the event loop. 1,000/s: 8 contexts of
    # LLM tokens at ~100 tokens/s each, with room to spare.
    messages_per_s: float = 1000.0
    message_burst: int = 2000
    # Bytes a WebSocket may send per second, with bursts of input_byte_burst,
    # counted before they are parsed (rtserver/server/ws_protocol.py); messages
    # are counted there too, against messages_per_s and message_burst. Over
    # either its reading pauses (TCP pushes back), and one held over its budget
    # for flood_after_s is cut off (1008), so a client that floods without
    # reading costs the event loop at most that much parsing. 256 KiB/s is
    # five times 8 contexts of LLM tokens (~100 a second of ~60 bytes each)
    # and four max_message_bytes messages in a burst.
    input_bytes_per_s: int = 262_144
    input_byte_burst: int = 262_144
    flood_after_s: float = 1.0
    # File descriptors beyond max_connections (voices, engine, logs, pools);
    # the process raises its soft limit to max_connections + this at start.
    fd_margin: int = 256
    web_root: str = ""  # empty: the packaged rtserver/web_demo/ folder
    log_level: str = "info"
    # "text": one line per record; "json": one JSON object per line (ts, level,
    # logger, message, request_id, exc), for log collectors (rtserver/logs.py).
    log_format: str = "text"
    # Bind with SO_REUSEPORT so several processes share the port (the kernel
    # spreads connections); such a process listens only once warmed up.
    reuse_port: bool = False
    # Server processes behind the port: a count, or "gpus" for one per visible
    # GPU (rtserver/server/workers.py); more than 1 sets reuse_port in each.
    workers: str = "1"
    # > 0: /metrics also on this port (worker i: metrics_port + i), for scraping
    # each process of a multi-process server.
    metrics_port: int = 0
    # Peers whose X-Forwarded-For / X-Forwarded-Proto are believed (uvicorn's
    # ``forwarded_allow_ips``): comma-separated addresses or networks (CIDR), or
    # "*" for any (only when nothing but the proxy can reach the port). Behind
    # an ingress, per-address limits (connections_per_minute, http_requests_per_key
    # without API keys) then count each forwarded client, not the ingress.
    # The default is uvicorn's (the loopback addresses); empty believes no
    # peer. docs/DEPLOY.md, section 5.
    forwarded_allow_ips: str = "127.0.0.1,::1"


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """Admission, circuit breakers and browser tokens (rtserver/server/
    admission.py, breaker.py, tokens.py).

    Rates are per API key (per client address without keys; a browser token
    counts against the key that minted it). Each bucket holds one minute's
    worth, so a client may burst that much and then goes at the rate; 0 turns
    a limit off. Defaults sit far above one well-behaved client: a stream
    speaks about 15 characters a second (900 a minute).
    """

    connections_per_minute: float = 600.0
    contexts_per_minute: float = 3000.0
    chars_per_minute: float = 200_000.0
    # POST /v1/audio/speech requests one API key (one address without keys)
    # may have open at once; past it HTTP 429 `too_many_contexts`. A backend
    # usually holds one key for all its users, so this is sized from what one
    # process can hold, not from one WebSocket's max_contexts: 128 is the most
    # real-time streams measured on one server (docs/DESIGN.md, "Performance
    # goals": Orpheus-3B and ChatTTS shapes on one H200, zero underruns to
    # 128; Piper on 2 cores holds 24-28). Past capacity the load admission
    # (first_heard_target_ms) and the breakers refuse, whoever asks; this cap
    # only keeps one key from taking more than a whole server. 0 turns it off.
    http_requests_per_key: int = 128
    # Buckets kept (least recently used go first), which bounds their memory.
    rate_keys: int = 10_000
    # A new context is refused with `overloaded` when its predicted time to
    # first heard audio (TTFA + the prebuffer its hint will ask for, at the
    # load with it added and the measured r) exceeds this. 0 (the default)
    # turns it off: the right target is the deployment's (the goals are 90 to
    # 250 ms on a GPU, 150 ms for Piper on 2 cores, DESIGN.md), and a machine
    # shared with other work measures r that is not this server's own.
    first_heard_target_ms: float = 0.0
    # Contexts starting at once (from `start` to their first audio), per CPU
    # core: over it a `start` is refused with `overloaded` + retry_after_ms
    # (rtserver/server/admission.py, StartAdmission), so that a burst cannot
    # hold up the contexts already playing. 2 per core: on 2 cores a burst of
    # 8 and of 12 held with zero underruns on a quiet machine, 16 and 24 did
    # not (issue 27; bench/results/cpu-piper-2026-12-03-bf16-burst); with the
    # machine's load average at 5 (other work), 8 admitted at once had 2
    # underrun and 4 had none (bench/results/cpu-piper-burst-2026-12-04).
    # 0 turns it off.
    starting_per_core: float = 2.0
    # Bounds of the retry_after_ms sent with `overloaded`.
    retry_min_ms: int = 250
    retry_max_ms: int = 10_000
    # Circuit breaker per voice: after this many failed contexts in a row, new
    # contexts fail fast with `engine_failed` for ``breaker_cooldown_s``, then
    # one probe is let through; each failed probe doubles the cool-down, up to
    # ``breaker_max_cooldown_s``.
    breaker_failures: int = 5
    breaker_cooldown_s: float = 5.0
    breaker_max_cooldown_s: float = 60.0
    # HMAC key for browser tokens (POST /v1/tokens), at least 32 characters
    # (``openssl rand -hex 32``); empty: a random key made at start, so tokens
    # are valid for this process only. Required, the same everywhere, when
    # several processes serve one address with API keys set (``--workers``,
    # front ends of a GPU worker, replicas behind a Service: docs/DEPLOY.md).
    token_secret: str = ""
    token_ttl_s: float = 300.0
    token_max_ttl_s: float = 3600.0
    # /metrics asks for an API key too (when keys are set).
    metrics_need_key: bool = False


@dataclass(frozen=True, slots=True)
class GpuConfig:
    """The GPU worker process (rtserver/worker/): where the GPU families run.

    ``worker = "process"``: ``rtserver serve`` supervises one GPU worker
    process per GPU, which loads the voices of ``families`` (their token
    engine and vocoder), and ``frontends`` server processes per worker on
    the port, which do everything else and never import torch. ``"off"``:
    every voice in the server process (as before). The section is ``[gpu]``,
    not ``[worker]``: ``RTSERVER_WORKER_*`` names a supervised process
    (rtserver/server/workers.py).
    """

    worker: str = "off"  # "off" | "process"
    # Voice families the GPU worker serves; other voices (Piper) stay in the
    # front ends.
    families: tuple[str, ...] = ("chattts", "orpheus")
    # Front-end processes per GPU worker; 0: one per two cores, 1 to 8.
    frontends: int = 0
    # The worker's ZMQ endpoint. The supervisor sets it for the processes it
    # starts; a front end with it set serves ``families`` through it.
    endpoint: str = ""
    # Requests the worker serves at once per family; 0: the family's engine
    # rows (chattts.slots, orpheus.max_num_seqs). A first segment over it is
    # refused with `overloaded`, and front ends refuse new contexts at it.
    max_requests: int = 0
    # Front ends ping the worker this often; a peer silent for timeout_s is
    # gone (its requests fail, or are cancelled in the worker).
    heartbeat_s: float = 0.25
    timeout_s: float = 3.0
    # Audio (s) the front end holds for one request that its consumer has not
    # taken; past it the request fails with `overloaded` and is cancelled in
    # the worker, which never waits for a front end.
    request_buffer_s: float = 60.0
    # > 0: the GPU worker serves /metrics (its engines' metrics and its load)
    # on this port; under the supervisor, worker j on metrics_port + j.
    metrics_port: int = 0
    # A folder: SIGUSR1 to the worker starts a GPU timeline (torch profiler
    # traces of the worker and of the engines that can, rtserver/worker/
    # profile.py), SIGUSR2 stops it and writes them here; "": off.
    profile_dir: str = ""
    # The worker process's sys.setswitchinterval, ms. A thread back from a call
    # that let the GIL go (the engine's wait on the GPU) waits up to this long
    # for it while the event loop runs Python (CPython's take_gil); 5 is
    # Python's default. Through the worker at ~90 ChatTTS rows a step, the
    # engine thread's wall time a step was 6.3 ms against 1.9 ms of CPU
    # (bench/results/h200-chattts-store-2026-12-05, server-store-rows-256).
    gil_switch_ms: float = 5.0


# The voice names of OpenAI's speech API (its API reference, POST /audio/speech).
OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage",
                 "shimmer", "verse", "marin", "cedar")


@dataclass(frozen=True, slots=True)
class OpenAIConfig:
    """The OpenAI-compatible speech API (rtserver/server/openai_speech.py).

    ``voices``: ``"name=voice"`` pairs. Each of OpenAI's voice names
    (``OPENAI_VOICES``) speaks with the server's default voice unless a pair
    names another (``"nova=chattts:2"``); a pair may also add a name of its
    own, for a voice object's ``id`` (``"voice_1234=piper:en_US-joe-medium"``).
    A pair naming a voice the server does not load fails the start.
    """

    voices: tuple[str, ...] = ()
    # No rtserver voice follows free-text ``instructions`` (OpenAI's "speak
    # cheerfully"), so a request with them is refused (400, param
    # "instructions"); true speaks it without them and says so in the
    # ``x-rtserver-ignored`` response header.
    ignore_instructions: bool = False

    def voice_map(self) -> dict[str, str]:
        """OpenAI voice name (or a configured id) -> rtserver voice name or alias."""
        out = dict.fromkeys(OPENAI_VOICES, "default")
        for pair in self.voices:
            name, _, voice = pair.partition("=")
            out[name.strip()] = voice.strip()
        return out

    def check(self) -> None:
        for pair in self.voices:
            name, sep, voice = pair.partition("=")
            if not sep or not name.strip() or not voice.strip():
                raise ValueError(f"voices: {pair!r} is not 'name=voice'")


def _default_families() -> Mapping[str, Any]:
    return MappingProxyType({n: cls() for n, cls in family_sections().items()})


@dataclass(frozen=True, slots=True)
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    voice: VoiceSettings = field(default_factory=VoiceSettings)
    segmenter: SegmenterConfig = field(default_factory=SegmenterConfig)
    hints: HintConfig = field(default_factory=HintConfig)
    opus: OpusConfig = field(default_factory=OpusConfig)
    # The phrase cache of the HTTP speech API (rtserver/cache.py).
    cache: CacheConfig = field(default_factory=CacheConfig)
    gpu: GpuConfig = field(default_factory=GpuConfig)
    openai: OpenAIConfig = field(default_factory=OpenAIConfig)
    # Each voice family's own section, by family name ([orpheus], ...).
    families: Mapping[str, Any] = field(default_factory=_default_families)

    def family(self, name: str, kind: type[S]) -> S:
        """The section of family ``name``, checked to be a ``kind``."""
        section = self.families.get(name)
        if not isinstance(section, kind):
            raise ConfigError(f"no [{name}] section of type {kind.__name__}")
        return section


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """Convert ``value`` (from TOML, env text or a flag) to the field's type."""
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("", "none")):
            return None
        return _coerce(value, args[0], where)
    if origin is tuple:
        (item,) = typing.get_args(hint)[:1]
        items = [p.strip() for p in value.split(",") if p.strip()] if isinstance(value, str) \
            else list(value)
        return tuple(_coerce(i, item, where) for i in items)
    try:
        if hint is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if hint is int and not isinstance(value, bool):
            return int(value)
        if hint is float and not isinstance(value, bool):
            return float(value)
        if hint is str:
            return str(value)
    except (TypeError, ValueError):
        pass
    else:
        if hint in (bool, int, float, str):
            raise ConfigError(f"{where}: {value!r} is not a {hint.__name__}")
    raise ConfigError(f"{where}: {value!r} is not a {getattr(hint, '__name__', hint)}")


def _dataclass_of(hint: Any) -> type | None:
    """The dataclass a field holds (also through ``X | None``), else None."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return hint
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        for arg in typing.get_args(hint):
            if dataclasses.is_dataclass(arg) and isinstance(arg, type):
                return arg
    return None


def _nest(section: Any, values: Mapping[str, Any]) -> dict[str, Any]:
    """Turn flat ``sub_field`` / ``sub.field`` keys of nested dataclass fields
    into tables, so env variables and flags reach them as TOML tables do."""
    hints = typing.get_type_hints(type(section))
    nested = {n for n, h in hints.items() if _dataclass_of(h) is not None}
    out: dict[str, Any] = {}
    for key, raw in values.items():
        for sub in nested:
            for sep in (".", "_"):
                if key.startswith(sub + sep) and key not in hints:
                    table = out.setdefault(sub, {})
                    if isinstance(table, dict):
                        table[key[len(sub) + 1:]] = raw
                    break
            else:
                continue
            break
        else:
            out[key] = raw
    return out


def _apply(section: Any, values: Mapping[str, Any], source: str) -> Any:
    hints = typing.get_type_hints(type(section))
    names = {f.name for f in dataclasses.fields(section)}
    changes = {}
    for key, raw in _nest(section, values).items():
        if key not in names:
            raise ConfigError(f"{source}: unknown setting '{key}'")
        sub = _dataclass_of(hints[key])
        if sub is not None and isinstance(raw, Mapping):
            current = getattr(section, key)
            changes[key] = _apply(current if current is not None else sub(), raw,
                                  f"{source} {key}")
        else:
            changes[key] = _coerce(raw, hints[key], f"{source} {key}")
    try:
        return dataclasses.replace(section, **changes) if changes else section
    except (TypeError, ValueError) as exc:  # a section's own __post_init__ checks
        raise ConfigError(f"{source}: {exc}") from None


def load_config(
    file: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> Config:
    """Build the one Config. ``env`` defaults to ``os.environ``."""
    env = os.environ if env is None else env
    layers: list[tuple[str, dict[str, dict[str, Any]]]] = []
    if file is not None:
        path = Path(file)
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"config file {path}: {exc}") from None
        layers.append((f"config file {path}", data))
    core = {f.name for f in dataclasses.fields(Config)} - {"families"}
    family_types = family_sections()
    sections = core | set(family_types)
    from_env: dict[str, dict[str, Any]] = {}
    for key, value in env.items():
        if not key.startswith(ENV_PREFIX):
            continue
        rest = key[len(ENV_PREFIX):].lower()
        section, _, name = rest.partition("_")
        if section not in sections or not name:
            continue  # RTSERVER_* variables of other tools are not ours
        from_env.setdefault(section, {})[name] = value
    layers.append(("environment RTSERVER_*", from_env))
    from_flags: dict[str, dict[str, Any]] = {}
    for key, value in (flags or {}).items():
        if value is None:
            continue
        section, _, name = key.partition(".")
        from_flags.setdefault(section, {})[name] = value
    layers.append(("command line", from_flags))

    config = Config()
    fams: dict[str, Any] = {n: cls() for n, cls in family_types.items()}
    for source, data in layers:
        for section_name, values in data.items():
            if section_name not in sections:
                raise ConfigError(f"{source}: unknown section '{section_name}' (sections: "
                                  f"{', '.join(sorted(sections))})")
            if not isinstance(values, Mapping):
                raise ConfigError(f"{source}: section '{section_name}' must be a table")
            where = f"{source} [{section_name}]"
            if section_name in fams:
                fams[section_name] = _apply(fams[section_name], values, where)
                continue
            current = getattr(config, section_name)
            config = dataclasses.replace(config, **{section_name: _apply(current, values, where)})
    for name, section in fams.items():
        check = getattr(section, "check", None)
        if check is not None:
            try:
                check()
            except ValueError as exc:
                raise ConfigError(f"config [{name}] {exc}") from None
    config = dataclasses.replace(config, families=MappingProxyType(fams))
    _validate(config)
    return config


# An HMAC-SHA256 key's worth of entropy as hex (RFC 2104: at least the hash's
# output length is recommended).
MIN_TOKEN_SECRET_CHARS = 32


def _validate(config: Config) -> None:
    s = config.server
    if not 0 <= s.port <= 65535:
        raise ConfigError(f"server.port {s.port} is out of range")
    for name in ("max_message_bytes", "max_text_chars", "max_contexts", "send_queue_ms"):
        if getattr(s, name) <= 0:
            raise ConfigError(f"server.{name} must be > 0")
    if s.overload_after_s <= 0:
        raise ConfigError("server.overload_after_s must be > 0")
    if s.close_timeout_s <= 0:
        raise ConfigError("server.close_timeout_s must be > 0")
    if s.log_format not in ("text", "json"):
        raise ConfigError(f"server.log_format {s.log_format!r}: 'text' or 'json'")
    for name in ("max_queued_messages", "messages_per_s", "message_burst", "input_bytes_per_s",
                 "input_byte_burst", "flood_after_s"):
        if getattr(s, name) <= 0:
            raise ConfigError(f"server.{name} must be > 0")
    a = config.admission
    for name in ("connections_per_minute", "contexts_per_minute", "chars_per_minute",
                 "first_heard_target_ms", "http_requests_per_key", "starting_per_core"):
        if getattr(a, name) < 0:
            raise ConfigError(f"admission.{name} must be >= 0 (0 turns it off)")
    if a.rate_keys < 1 or a.breaker_failures < 1:
        raise ConfigError("admission.rate_keys and admission.breaker_failures must be >= 1")
    if not 0 < a.breaker_cooldown_s <= a.breaker_max_cooldown_s:
        raise ConfigError("admission: 0 < breaker_cooldown_s <= breaker_max_cooldown_s")
    if a.token_secret and len(a.token_secret) < MIN_TOKEN_SECRET_CHARS:
        raise ConfigError(f"admission.token_secret must be at least {MIN_TOKEN_SECRET_CHARS} "
                          "characters (for example: openssl rand -hex 32)")
    if not 0 < a.token_ttl_s <= a.token_max_ttl_s:
        raise ConfigError("admission: 0 < token_ttl_s <= token_max_ttl_s")
    if not 0 <= a.retry_min_ms <= a.retry_max_ms:
        raise ConfigError("admission: 0 <= retry_min_ms <= retry_max_ms")
    try:
        config.openai.check()
    except ValueError as exc:
        raise ConfigError(f"openai.{exc}") from None
    g = config.gpu
    if g.worker not in ("off", "process"):
        raise ConfigError(f"gpu.worker {g.worker!r}: 'off' or 'process'")
    if g.frontends < 0 or g.max_requests < 0:
        raise ConfigError("gpu.frontends and gpu.max_requests must be >= 0 (0: automatic)")
    if not 0 <= g.metrics_port <= 65535:
        raise ConfigError(f"gpu.metrics_port {g.metrics_port} is out of range")
    if not 0 < g.heartbeat_s < g.timeout_s or g.request_buffer_s <= 0:
        raise ConfigError("gpu: 0 < heartbeat_s < timeout_s and request_buffer_s > 0")
    if not 0.1 <= g.gil_switch_ms <= 100:
        raise ConfigError(f"gpu.gil_switch_ms {g.gil_switch_ms:g}: 0.1 to 100")
    if not 0 <= s.metrics_port <= 65535:
        raise ConfigError(f"server.metrics_port {s.metrics_port} is out of range")
