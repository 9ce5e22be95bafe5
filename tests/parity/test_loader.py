"""rtserver's loaders on exactly the files upstream 0.2.5 downloads (its
``res/sha256_map.json``), and an error naming the file when one is missing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rtserver.errors import ConfigError
from rtserver.tools.layouts.chattts import UPSTREAM_FILES
from rtserver.voices.chattts.assets import load_lm_assets
from rtserver.voices.chattts.decoder.checkpoint import load_audio_models

from .conftest import Pair, sha_key

# Read by transformers' BertTokenizerFast upstream; rtserver's tokenizer reads
# tokenizer.json alone (the same vocabulary, added tokens and normaliser).
NOT_READ = {"tokenizer/special_tokens_map.json", "tokenizer/tokenizer_config.json"}


def load_all(root: Path, spk_stat: str) -> None:
    load_lm_assets(root, speaker_stats=spk_stat)
    load_audio_models(root, "decoder")
    load_audio_models(root, "dvae")


def test_upstreams_file_list_is_what_the_writer_writes(pair: Pair) -> None:
    import json

    import ChatTTS

    res = Path(ChatTTS.__file__).parent / "res" / "sha256_map.json"
    keys = json.loads(res.read_text(encoding="utf-8"))
    assert sorted(keys) == sorted(sha_key(f) for f in UPSTREAM_FILES)
    load_all(pair.root, pair.spk_stat)  # loads from exactly those files


def test_without_speaker_statistics_there_are_no_seeded_speakers(pair: Pair) -> None:
    """Upstream's download holds no statistics: without ``chattts.speaker_stats``
    (upstream's ``Config.spk_stat`` string) rtserver has none to seed from."""
    assert load_lm_assets(pair.root).speaker_stats is None


@pytest.mark.parametrize("missing", UPSTREAM_FILES)
def test_a_missing_file_is_named(pair: Pair, tmp_path: Path, missing: str) -> None:
    root = tmp_path / "m"
    shutil.copytree(pair.root, root)
    (root / "asset" / missing).unlink()
    if missing in NOT_READ:
        load_all(root, pair.spk_stat)
        return
    with pytest.raises(ConfigError) as err:
        load_all(root, pair.spk_stat)
    assert missing in str(err.value), str(err.value)
