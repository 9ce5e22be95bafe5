"""The house plan holds: every rtserver module sits in the layers contract, no
contract ignores an import, families are found through entry points, and the
tracked benchmark results stay small."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import pytest

from rtserver.voices import registry
from rtserver.voices.registry import BUILTIN_ENTRY_POINTS

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "rtserver"
RESULTS_LIMIT = 4 * 1024 * 1024  # issue 23: tracked results <= 4 MiB


def _contracts() -> list[dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts: list[dict[str, object]] = config["tool"]["importlinter"]["contracts"]
    return contracts


def _layered() -> set[str]:
    [layers] = [c for c in _contracts() if c["type"] == "layers"
                and "rtserver.cli" in str(c["layers"])]
    names: set[str] = set()
    for layer in layers["layers"]:  # type: ignore[attr-defined]
        names.update(part.strip() for part in layer.split(":"))
    return names


def test_every_top_level_module_is_in_the_layers_contract() -> None:
    top = {f"rtserver.{p.stem}" for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    top |= {f"rtserver.{p.parent.name}" for p in PACKAGE.glob("*/__init__.py")}
    missing = sorted(top - _layered())
    assert not missing, f"modules outside the layers contract: {missing}"


def test_no_contract_ignores_an_import() -> None:
    assert [c["name"] for c in _contracts() if c.get("ignore_imports")] == []


def test_rtservers_families_are_entry_points() -> None:
    eps = importlib.metadata.entry_points(group="rtserver.voices")
    ours = {ep.name: ep.value for ep in eps if ep.dist is not None
            and ep.dist.name == "rtserver"}
    assert ours == {name: f"rtserver.voices.{name}.family:FAMILY"
                    for name in ("piper", "orpheus", "chattts")}
    # what a source tree that was never installed falls back on: the same
    assert BUILTIN_ENTRY_POINTS == ours


def test_a_source_tree_never_installed_still_finds_the_families(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """PYTHONPATH=<checkout> without pip install (the GPU hosts' runs) has no
    distribution metadata: the registry falls back on the same three."""
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group: importlib.metadata.EntryPoints(()))
    monkeypatch.setattr(registry, "_FAMILIES", {})
    monkeypatch.setattr(registry, "_RANK", {})
    monkeypatch.setattr(registry, "_discovered", False)
    assert list(registry.families()) == ["piper", "orpheus", "chattts"]


def test_tracked_results_stay_within_4_mib() -> None:
    total = sum(p.stat().st_size for p in (ROOT / "bench" / "results").rglob("*")
                if p.is_file())
    assert total <= RESULTS_LIMIT, f"bench/results holds {total / 2**20:.2f} MiB"
