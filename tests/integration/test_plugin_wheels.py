"""The Pipecat and LiveKit plugins as a user installs them: rtserver-pipecat and
rtserver-livekit built as wheels, installed with rtserver's wheel into a fresh
venv (their third-party dependencies from this environment, rtserver's own
distributions only from the wheels), and their tests run there."""

from __future__ import annotations

import subprocess
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from rtserver.testing.wheels import (
    ROOT,
    build_rtserver_wheel,
    build_wheel,
    dependency_view,
    fresh_venv,
    user_env,
)

PLUGINS = {"pipecat": "rtserver_pipecat", "livekit": "rtserver_livekit"}
PLUGIN_TESTS = ("tests/integration/test_pipecat.py", "tests/integration/test_livekit.py")


def requires(wheel: Path) -> list[str]:
    """The wheel's Requires-Dist, as pip reads them."""
    with zipfile.ZipFile(wheel) as zf:
        [meta] = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return Parser().parsestr(zf.read(meta).decode()).get_all("Requires-Dist") or []


@pytest.mark.slow
def test_the_plugins_install_from_their_wheels_and_pass_their_tests(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    wheels = {name: build_wheel(ROOT / "integrations" / name, dist, tmp_path / "src" / name)
              for name in PLUGINS}
    assert wheels["pipecat"].name.startswith("rtserver_pipecat-")
    assert wheels["livekit"].name.startswith("rtserver_livekit-")
    assert any(r.startswith("pipecat-ai") for r in requires(wheels["pipecat"]))
    assert any(r.startswith("livekit-agents") for r in requires(wheels["livekit"]))
    for wheel in wheels.values():
        assert any(r.startswith("rtserver") for r in requires(wheel))
    core = build_rtserver_wheel(dist, tmp_path / "src" / "rtserver")
    bin_dir = fresh_venv(tmp_path / "venv", [core, *wheels.values()],
                         dependency_view(tmp_path / "deps"))
    work = tmp_path / "elsewhere"
    work.mkdir()
    py = str(bin_dir / "python")
    where = subprocess.run(
        [py, "-c", "import rtserver, rtserver_pipecat, rtserver_livekit as m; "
         "print(rtserver.__file__, rtserver_pipecat.__file__, m.__file__, sep='\\n')"],
        cwd=work, env=user_env(), capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr
    venv = str(bin_dir.parent)
    assert all(line.startswith(venv) for line in where.stdout.split()), where.stdout
    # the plugins' own tests, run by the venv's python from outside the repository:
    # every rtserver module they import is the wheels'
    run = subprocess.run(
        [py, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-c",
         str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT),
         *(str(ROOT / t) for t in PLUGIN_TESTS)],
        cwd=work, env=user_env(), capture_output=True, text=True, timeout=480)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "skipped" not in run.stdout, run.stdout[-2000:]
