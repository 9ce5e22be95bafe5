"""The garbage collector's pauses on /metrics, and the frozen start-up heap."""

from __future__ import annotations

import gc

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from rtserver.gc_heap import GcPauses, freeze_heap, register


def _value(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def test_collections_are_timed_per_generation_and_shown() -> None:
    pauses = GcPauses.install()
    assert GcPauses.install() is pauses  # one hook per process
    registry = CollectorRegistry()
    register(registry)
    # automatic collections off (process-wide): no other thread's allocations can
    # add a collection between the two scrapes
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        before = generate_latest(registry).decode()
        gc.collect()  # a full collection
        after = generate_latest(registry).decode()
    finally:
        if was_enabled:
            gc.enable()
    assert (_value(after, 'python_gc_collections_total{generation="2"}')
            == _value(before, 'python_gc_collections_total{generation="2"}') + 1)
    assert (_value(after, 'rtserver_gc_pause_seconds_total{generation="2"}')
            > _value(before, 'rtserver_gc_pause_seconds_total{generation="2"}'))
    assert _value(after, "rtserver_gc_longest_pause_seconds") > 0


def test_the_frozen_heap_is_left_out_of_collections() -> None:
    try:
        frozen = freeze_heap()
        # a frozen object that dies leaves the permanent generation, and threads
        # earlier tests left running may free some between the two reads (a
        # fresh clone's CI: 860,143 frozen, 860,134 a moment later); nothing but
        # a freeze adds to it
        assert 0 < gc.get_freeze_count() <= frozen
        # what start-up made is no longer in any generation a collection walks
        assert len(gc.get_objects()) < frozen
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0


def test_a_scrape_never_walks_the_frozen_heap(monkeypatch: pytest.MonkeyPatch) -> None:
    """``gc.get_freeze_count`` walks every frozen object with the GIL held; a
    scrape shows the count the last freeze left instead."""
    registry = CollectorRegistry()
    register(registry)
    try:
        frozen = freeze_heap()

        def walk() -> int:
            raise AssertionError("a scrape walked the permanent generation")

        monkeypatch.setattr(gc, "get_freeze_count", walk)
        text = generate_latest(registry).decode()
    finally:
        gc.unfreeze()
    assert _value(text, "rtserver_gc_frozen_objects") == frozen > 0
