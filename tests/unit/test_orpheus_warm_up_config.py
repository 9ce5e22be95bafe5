"""``[orpheus] warm_up_batches``: each batch at least one request, named in the error."""

from __future__ import annotations

import pytest

from rtserver.voices.orpheus.config import OrpheusConfig


@pytest.mark.parametrize("batches", [(8, 0), (-1,)])
def test_a_batch_below_one_is_a_config_error(batches: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="warm_up_batches"):
        OrpheusConfig(warm_up_batches=batches).check()


def test_the_default_and_none_pass() -> None:
    OrpheusConfig().check()
    OrpheusConfig(warm_up_batches=()).check()
