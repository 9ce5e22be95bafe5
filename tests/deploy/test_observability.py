"""The Grafana dashboard, the alert rules and the adapter rule query metrics a
running server really serves: each metric they name is on a real Piper
server's /metrics, the GPU's come from the collector on a CUDA device, the
vLLM engine's are checked in tests/integration/test_vllm_server.py (whose
server starts once); the rules pass ``promtool check rules`` and their own
``promtool test rules`` cases."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rtserver.client import RtClient
from rtserver.server.process_metrics import GpuMemoryCollector
from rtserver.testing.server_thread import ServerThread
from tests.deploy.util import scrape

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy/grafana/rtserver-dashboard.json"
PROM = ROOT / "deploy/prometheus"
METRIC = re.compile(r"\b(rtserver_[a-z0-9_]+)")
# Present only with a vLLM voice loaded (EngineCollector) / once CUDA is up.
ENGINE_PREFIX = "rtserver_engine_"  # but rtserver_engine_up is the server's own
GPU_PREFIX = "rtserver_gpu_memory_"
SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "counter": ("_total",),
            "gauge": ("",), "info": ("_info",), "summary": ("_sum", "_count")}


def exposed(body: str) -> set[str]:
    """Every series name a Prometheus scrape of ``body`` can hold: samples, and
    for families with no sample yet (no label seen), the names by type."""
    names: set[str] = set()
    for family in text_string_to_metric_families(body):
        names.update(s.name for s in family.samples)
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
    return names


def dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = []
    for panel in dash["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        exprs += [t["expr"] for t in panel["targets"]]
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            exprs.append(var["query"]["query"])
    return exprs


def alert_exprs() -> list[str]:
    rules = yaml.safe_load((PROM / "alerts.yml").read_text())
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


def adapter_exprs() -> list[str]:
    adapter = yaml.safe_load((PROM / "adapter-config.yaml").read_text())
    return [r["seriesQuery"] for r in adapter["rules"]]


def queried(exprs: list[str]) -> set[str]:
    return {m for e in exprs for m in METRIC.findall(e)}


def needs_engine(name: str) -> bool:
    return name.startswith(ENGINE_PREFIX) and name != "rtserver_engine_up"


@pytest.fixture(scope="module")
def piper_metrics() -> Iterator[str]:
    """/metrics of a real Piper server after it spoke one context."""
    srv = ServerThread.with_settings(server={"max_contexts": 2}).start()
    try:
        import asyncio

        async def speak() -> None:
            async with RtClient.connect(srv.url) as client:
                ctx = await client.start()
                await ctx.send_text("Hello there, this is a test.")
                await ctx.end()
                assert (await ctx.collect(decode=False)).ok

        asyncio.run(speak())
        yield scrape(srv.http + "/metrics")
    finally:
        srv.stop()


def test_dashboard_loads_with_the_panels_asked_for() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] == "rtserver"
    names = queried(dashboard_exprs())
    for needed in ("rtserver_ttfa_seconds_bucket", "rtserver_first_heard_seconds_bucket",
                   "rtserver_rtf_bucket", "rtserver_active_contexts",
                   "rtserver_active_connections", "rtserver_rejected_total",
                   "rtserver_engine_running_requests", "rtserver_engine_waiting_requests",
                   "rtserver_engine_kv_cache_usage", "rtserver_gpu_memory_used_bytes"):
        assert needed in names, needed
    rejected = " ".join(e for e in dashboard_exprs() if "rtserver_rejected_total" in e)
    assert "overloaded" in rejected and "rate_limited" in rejected
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


def test_every_metric_queried_is_on_a_piper_servers_metrics(piper_metrics: str) -> None:
    names = exposed(piper_metrics)
    wanted = queried(dashboard_exprs() + alert_exprs() + adapter_exprs())
    # what a CPU-only Piper server cannot have: the vLLM engine's, the GPU's
    later = {n for n in wanted if needs_engine(n) or n.startswith(GPU_PREFIX)}
    missing = wanted - later - names
    assert not missing, sorted(missing)
    # Prometheus' base units: durations in seconds, never milliseconds
    assert not [n for n in names if n.endswith("_ms") or "_ms_" in n]
    assert "rtserver_ttfa_seconds_bucket" in {s.name for f in text_string_to_metric_families(
        piper_metrics) for s in f.samples}  # it spoke: real samples, not only a TYPE line
    # the reasons the dashboard plots are counted (zero until a refusal)
    for reason in ("overloaded", "rate_limited"):
        assert f'rtserver_rejected_total{{reason="{reason}"}}' in piper_metrics
    assert "rtserver_ready 1.0" in piper_metrics


def test_gpu_memory_series_are_the_ones_the_dashboard_reads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The collector on a CUDA device (a stand-in torch with CUDA up: this
    machine has no GPU), and nothing at all where CUDA is not initialised."""
    gib = 1 << 30
    cuda = types.SimpleNamespace(
        is_initialized=lambda: True, current_device=lambda: 0,
        mem_get_info=lambda d: (100 * gib, 141 * gib), memory_allocated=lambda d: 3 * gib)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    registry = CollectorRegistry()
    registry.register(GpuMemoryCollector())
    body = generate_latest(registry).decode()
    values = {(s.name, s.labels["gpu"]): s.value
              for f in text_string_to_metric_families(body) for s in f.samples}
    assert values == {("rtserver_gpu_memory_used_bytes", "5"): 41 * gib,  # total - free
                      ("rtserver_gpu_memory_total_bytes", "5"): 141 * gib,
                      ("rtserver_gpu_memory_allocated_bytes", "5"): 3 * gib}
    wanted = {n for n in queried(dashboard_exprs()) if n.startswith(GPU_PREFIX)}
    assert wanted and wanted <= exposed(body)
    cuda.is_initialized = lambda: False
    assert "rtserver_gpu_memory" not in generate_latest(registry).decode()


def engine_metrics_queried() -> set[str]:
    """The vLLM engine's metrics the dashboard and alerts query; checked on a
    vLLM server in tests/integration/test_vllm_server.py (its server is
    started once there)."""
    return {n for n in queried(dashboard_exprs() + alert_exprs()) if needs_engine(n)}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("promtool")
    assert exe, "promtool is missing: scripts/setup.sh test installs Debian's prometheus"
    return subprocess.run([exe, *args], cwd=PROM, capture_output=True, text=True, timeout=120)


def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    """Each panel's query, with Grafana's variables filled in, as a recording
    rule: ``promtool check rules`` parses it with Prometheus' own parser."""
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] if p["type"] != "row" for t in p["targets"]]
    filled = [e.replace("$__rate_interval", "5m").replace("$namespace", ".*")
              .replace("$pod", ".*") for e in exprs]
    assert not [e for e in filled if "$" in e]
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{i}", "expr": e} for i, e in enumerate(filled)]}]}
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump(rules))
    out = promtool("check", "rules", str(path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(filled)} rules found" in out.stdout


def test_alert_rules_pass_promtool() -> None:
    out = promtool("check", "rules", "alerts.yml")
    assert out.returncode == 0, out.stdout + out.stderr
    names = {r["alert"] for g in yaml.safe_load((PROM / "alerts.yml").read_text())["groups"]
             for r in g["rules"]}
    assert {"RtserverTtfaP99High", "RtserverEngineDown", "RtserverNotReady",
            "RtserverOverloaded", "RtserverErrorRate"} <= names


def test_alert_rules_fire_on_their_cases() -> None:
    out = promtool("test", "rules", "alerts-test.yml")
    assert out.returncode == 0, out.stdout + out.stderr
    tested: Any = yaml.safe_load((PROM / "alerts-test.yml").read_text())
    fired = {t["alertname"] for case in tested["tests"] for t in case["alert_rule_test"]
             if t.get("exp_alerts")}
    rules = {r["alert"] for g in yaml.safe_load((PROM / "alerts.yml").read_text())["groups"]
             for r in g["rules"]}
    assert fired == rules  # every alert has a case where it fires
