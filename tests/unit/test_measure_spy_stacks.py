"""``tools.measure.spy_stacks``: py-spy's raw stacks, counted by thread and function."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from rtserver.tools.measure import spy_stacks

RAW = """\
thread (1): main;run (a.py:1);busy_loop (b.py:2);schedule (c.py:3) 30
thread (1): main;run (a.py:1);busy_loop (b.py:2);forward (d.py:4);attn (e.py:5) 50
thread (1): main;run (a.py:1);busy_loop (b.py:2);forward (d.py:4);forward (d.py:9) 20
thread (2): output;send (f.py:6) 7
not a stack line
"""


def test_samples_by_thread_and_below_a_function() -> None:
    prof = spy_stacks.read(RAW.splitlines(), within="busy_loop")
    assert prof.threads == {"thread (1): main": 100, "thread (2): output": 7}
    assert prof.within == 100
    # what busy_loop called, a recursing function counted once a stack; not its callers
    assert prof.inclusive == {"schedule": 30, "forward": 70, "attn": 50}
    assert prof.leaf["attn (e.py:5)"] == 50 and prof.leaf["forward (d.py:9)"] == 20
    every = spy_stacks.read(RAW.splitlines())
    assert every.within == 107 and every.inclusive["run"] == 100


def test_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "spy.txt.gz"
    with gzip.open(path, "wt") as f:
        f.write(RAW)
    spy_stacks.main([str(path), "--within", "busy_loop", "--top", "2"])
    out = capsys.readouterr().out.splitlines()
    assert out[2] == "| thread (1): main | 100 |"
    assert "100 samples within busy_loop" in out
    i = out.index("| inclusive | function |")
    assert out[i + 2:i + 4] == ["| 70 | forward |", "| 50 | attn |"]
