"""Wheels built from the sources and installed into a fresh venv, as a user installs them.

The venv gets only what it installs from the wheels; its third-party
dependencies come from this interpreter's site-packages through a *view*: a
folder of links to every entry there except the names left out (the
distributions the test must find in its own wheels, or a package whose absence
it checks, such as matplotlib). The view is appended as a plain path, so the
.pth files in it (an editable install's finder among them) are not run: the
repository's sources are never importable from the venv.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# what each distribution's wheel is built from, relative to the repository root
RTSERVER_FILES = ("rtserver", "pyproject.toml", "README.md", "LICENSE", "NOTICE")
BUILD_LIMIT_S = 300


def build_wheel(source: Path, dist: Path, copy_to: Path) -> Path:
    """``source`` (a project folder) copied to ``copy_to`` and built into a wheel in
    ``dist``: building writes build/ and egg-info beside the sources, so it does
    not run in the repository. No network (``--no-index``), no build isolation
    (setuptools is this interpreter's)."""
    shutil.copytree(source, copy_to, ignore=shutil.ignore_patterns(
        "__pycache__", "*.pyc", "build", "*.egg-info"))
    return _pip_wheel(copy_to, dist)


def build_rtserver_wheel(dist: Path, copy_to: Path) -> Path:
    """rtserver's own wheel, from a copy of what it is built from."""
    copy_to.mkdir(parents=True)
    for name in RTSERVER_FILES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, copy_to / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(src, copy_to / name)
    return _pip_wheel(copy_to, dist)


def _pip_wheel(project: Path, dist: Path) -> Path:
    before = set(dist.glob("*.whl")) if dist.is_dir() else set()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--no-index", "-q", "-w", str(dist), str(project)], check=True,
                   timeout=BUILD_LIMIT_S)
    [wheel] = set(dist.glob("*.whl")) - before
    return wheel


def dependency_view(folder: Path, leave_out: Iterable[str] = ()) -> Path:
    """Links to this interpreter's site-packages entries, except rtserver's own
    distributions (rtserver, rtserver-pipecat, rtserver-livekit: the venv has them
    from the wheels) and those whose normalised name starts with one of
    ``leave_out`` (package and dist-info alike: ``"matplotlib"`` leaves out
    ``matplotlib/`` and ``matplotlib-3.9.dist-info``)."""
    prefixes = tuple(n.lower().replace("-", "_") for n in ("rtserver", *leave_out))
    folder.mkdir(parents=True)
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        name = entry.name.lower().replace("-", "_")
        if entry.suffix == ".pth" or name.startswith("__editable__"):
            continue
        if name.startswith(prefixes):
            continue
        (folder / entry.name).symlink_to(entry)
    return folder


def fresh_venv(where: Path, wheels: Iterable[Path], view: Path) -> Path:
    """A new venv at ``where`` with ``wheels`` installed (no dependencies, no
    network) and ``view`` appended to its path; its ``bin/`` folder."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True,
                   timeout=BUILD_LIMIT_S)
    py = where / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; "
                                "print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "deps.pth").write_text(f"{view}\n")
    # pip from the view, run by the venv's python: it installs into the venv and
    # writes the venv's python into the console scripts
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--no-compile", "--disable-pip-version-check", *map(str, wheels)],
                   check=True, timeout=BUILD_LIMIT_S, env=user_env())
    return where / "bin"


def user_env() -> dict[str, str]:
    """The environment a user runs with: none of the test run's PYTHONPATH (which
    may point at the sources)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
