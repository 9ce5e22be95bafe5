"""The hand-off measurement tool runs both routes on the real widths."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from rtserver.tools.measure.chattts_handoff import report


def test_the_report_times_both_routes_at_each_size() -> None:
    text = report([8], [2])
    rows = [line for line in text.splitlines() if line.startswith("| 8 rows")
            or line.startswith("| 2 windows")]
    assert len(rows) == 2
    for line in rows:
        copy_us, store_us = (float(c) for c in line.strip("|").split("|")[1:3])
        assert copy_us > 0 and store_us > 0
