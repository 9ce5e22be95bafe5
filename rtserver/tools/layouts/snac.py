"""Write a SNAC checkpoint folder in the upstream layout, with random weights.

Layout (hubertsiuzdak/snac_24khz): ``config.json`` (``snac.SNAC`` keyword
arguments) and ``pytorch_model.bin`` (the model's state dict, saved with
``torch.save``). ``shape="tiny"`` keeps the 24 kHz rates, strides, kernels and
codebook size (so the code layout and receptive field are the real ones) with
tiny widths; ``shape="24khz"`` is the real shape (77 MB, for slow tests).

    python -m rtserver.tools.layouts.snac OUT_DIR [--seed N] [--shape tiny|24khz]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Literal

import torch

from rtserver.voices.orpheus.snac_net import SNAC24_CONFIG, TINY_SNAC_CONFIG, build_snac

Shape = Literal["tiny", "24khz"]


def write_tiny_snac(directory: Path, seed: int = 0, *, shape: Shape = "tiny",
                    safetensors: bool = False) -> Path:
    """Write config.json + pytorch_model.bin (or model.safetensors) into ``directory``."""
    config = {"tiny": TINY_SNAC_CONFIG, "24khz": SNAC24_CONFIG}[shape]
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model = build_snac(config, seed=seed)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if safetensors:
        from safetensors.torch import save_file

        save_file(state, str(directory / "model.safetensors"))
    else:
        torch.save(state, directory / "pytorch_model.bin")
    return directory


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shape", choices=["tiny", "24khz"], default="tiny")
    a = p.parse_args(argv)
    print(write_tiny_snac(a.out, a.seed, shape=a.shape))


if __name__ == "__main__":
    main()
