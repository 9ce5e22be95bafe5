"""``[orpheus.vocoder] dtype = "auto"``: float16 on CUDA only for a checkpoint
whose float16 decode is measured within -40 dB of its float32 one."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from rtserver.tools.layouts.snac import write_tiny_snac
from rtserver.vocoder.config import VocoderConfig
from rtserver.voices.orpheus.snac_net import fold_weight_norm, load_snac_dir
from rtserver.voices.orpheus.snac_precision import HALF_BOUND_DB, half_error_db, resolve_dtype
from rtserver.voices.orpheus.snac_stream import SnacVocoder


@pytest.fixture(scope="module")
def snac_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_snac(tmp_path_factory.mktemp("snac"), seed=1)


def _scaled(snac_dir: Path, scale: float) -> object:
    """The tiny checkpoint with its first 1x1 convolution's weights scaled: its
    activations (and so float16's relative error, then its range) grow."""
    model = load_snac_dir(snac_dir)
    fold_weight_norm(model)
    with torch.no_grad():
        model.decoder.model[1].weight.mul_(scale)
    return model


def test_half_error_is_measured_and_leaves_the_weights(snac_dir: Path) -> None:
    model = load_snac_dir(snac_dir)
    fold_weight_norm(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    err = half_error_db(model, device="cpu")
    assert -60 < err < -30  # the tiny model: -37.5 dB (the real 24 kHz shape: -44.9)
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert half_error_db(model, device="cpu") == err  # seeded: the same codes each time


def test_a_checkpoint_that_overflows_float16_measures_non_finite(snac_dir: Path) -> None:
    assert half_error_db(_scaled(snac_dir, 1e5), device="cpu") == math.inf


def test_auto_on_cuda_stays_float32_where_float16_misses_the_bound(snac_dir: Path) -> None:
    for scale in (1.0, 1e2, 1e5):  # -37.5, -23 dB, then non-finite: each past -40 dB
        model = _scaled(snac_dir, scale)
        dtype, err = resolve_dtype("auto", "cuda", lambda m=model: half_error_db(m, device="cpu"))
        assert dtype == "float32"
        assert err is not None and err > HALF_BOUND_DB


def test_auto_on_cuda_takes_float16_within_the_bound() -> None:
    assert resolve_dtype("auto", "cuda:0", lambda: -44.9) == ("float16", -44.9)
    assert resolve_dtype("auto", "cuda", lambda: HALF_BOUND_DB) == ("float16", HALF_BOUND_DB)


def test_a_named_dtype_or_the_cpu_measures_nothing() -> None:
    def never() -> float:
        raise AssertionError("measured")

    for dtype in ("float32", "bfloat16", "float16"):
        assert resolve_dtype(dtype, "cuda", never) == (dtype, None)
    assert resolve_dtype("auto", "cpu", never) == ("float32", None)
    with pytest.raises(ValueError, match="dtype must be one of"):
        resolve_dtype("float64", "cuda", never)


def test_the_default_vocoder_on_the_cpu_runs_float32(snac_dir: Path) -> None:
    assert VocoderConfig().dtype == "auto"
    vocoder = SnacVocoder.load(snac_dir, device="cpu")
    assert vocoder.decoder.dtype == torch.float32
    with pytest.raises(ValueError, match="dtype must be one of"):
        VocoderConfig(dtype="half")
