"""Virtual environments with one torch each (stock, patched, upstream), made atomically.

A venv cannot be moved once made (its scripts hold absolute paths), so each one is made at its
final, content-keyed path ``.symfix/envs/<role>-<key>`` and marked complete only at the end; the
name users and tests go through (``.venv``, ``.symfix/<role>``) is a symlink switched in
one rename. An interrupted install leaves an unmarked directory nobody points to, which the next
run removes: nobody ever sees a half-installed environment.

uv makes them: a CUDA torch environment (5 GB) in about 16 s where pip takes minutes. uv reads no
pip configuration, so a local wheel is handed to it by path.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from .series import ROOT

ENVS = ROOT / ".symfix" / "envs"
LOGS = ROOT / ".symfix" / "logs"
MARKER = "symfix-env.json"
# Disk an environment needs, in GB: the CPU torch is about 1 GB installed, a CUDA build 5.5 GB.
NEEDS_GB = {"upstream": 7.0}
DEFAULT_NEED_GB = 2.0


READ_VERSION = """
import importlib.util, pathlib, sysconfig
path = pathlib.Path(sysconfig.get_paths()["purelib"], "torch", "version.py")
spec = importlib.util.spec_from_file_location("torch_version", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(module.__version__)
"""


class EnvError(Exception):
    pass


def test_requirements() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["dependencies"] + project["optional-dependencies"]["test"]


def python_of(env: Path) -> Path:
    return env / "bin" / "python"


def free_gb(path: Path = ROOT) -> float:
    return shutil.disk_usage(path).free / 1e9


def has_room(need: float) -> tuple[bool, float, float]:
    free = free_gb()
    return free >= need, free, need


def installed(link: Path) -> dict | None:
    """What the complete environment behind ``link`` holds, or None."""
    try:
        return json.loads((link.resolve() / MARKER).read_text())
    except (OSError, ValueError):
        return None


def uv() -> str:
    """The uv of the tools environment (a dependency in pyproject.toml), else uv on PATH."""
    here = Path(sys.executable).parent / "uv"
    found = str(here) if here.is_file() else shutil.which("uv")
    if not found:
        raise EnvError("uv is not installed: it is in pyproject.toml's dependencies")
    return found


def ensure(role: str, torch_spec: str, key: str, link: Path | None = None,
           python: str | None = None, need_gb: float | None = None) -> Path:
    """An environment with ``torch_spec`` (a wheel path or a requirement) and the test deps.

    ``key`` identifies the torch (a wheel's sha256, or the requirement); ``python`` the
    interpreter (default: this one). The environment is reused while key, interpreter and
    requirements are unchanged. Returns the path of its link.
    """
    link = link or ENVS.parent / role
    reqs = test_requirements()
    python = python or sys.executable
    want = {"format": 3, "role": role, "torch": torch_spec, "key": key, "requirements": reqs,
            "python": python}
    have = installed(link)
    if have and {k: have.get(k) for k in want if k != "torch"} == {
            k: v for k, v in want.items() if k != "torch"}:
        return link

    ok, free, need = has_room(need_gb or NEEDS_GB.get(role, DEFAULT_NEED_GB))
    if not ok:
        raise EnvError(f"{role}: {free:.1f} GB free, an environment needs {need:.0f} GB")
    digest = hashlib.sha256(json.dumps(want, sort_keys=True).encode()).hexdigest()[:12]
    target = ENVS / f"{role}-{digest}"
    ENVS.mkdir(parents=True, exist_ok=True)
    LOGS.mkdir(parents=True, exist_ok=True)
    if target.exists():
        shutil.rmtree(target)  # an earlier, interrupted attempt
    log = LOGS / f"{role}.log"
    try:
        with open(log, "w") as out:
            for cmd in ([uv(), "venv", "-q", "--python", python, str(target)],
                        [uv(), "pip", "install", "-q", "--python", str(python_of(target)),
                         torch_spec, *reqs]):
                out.write(f"$ {' '.join(cmd)}\n")
                out.flush()
                if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode:
                    tail = "".join(log.read_text().splitlines(True)[-5:])
                    raise EnvError(f"{role}: `{' '.join(cmd[:3])} …` failed; see {log}\n{tail}")
        # torch.__version__ from the installed torch/version.py alone: `import torch` would take
        # longer than the install itself (seconds; more for a CUDA build).
        version = subprocess.run([str(python_of(target)), "-c", READ_VERSION],
                                 capture_output=True, text=True).stdout.strip()
        if not version:
            raise EnvError(f"{role}: no torch/version.py installed in {target}; see {log}")
        (target / MARKER).write_text(json.dumps({**want, "torch_version": version}, indent=1))
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    switch(link, target)
    for old in ENVS.glob(f"{role}-*"):
        if old != target:
            shutil.rmtree(old, ignore_errors=True)
    return link


def switch(link: Path, target: Path) -> None:
    """Point ``link`` at ``target`` in one rename (never a moment without a complete env)."""
    if link.exists() and not link.is_symlink():
        raise EnvError(f"{link} exists and is not a symfix environment link; move it away")
    tmp = link.with_name(f".{link.name}.new")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(os.path.relpath(target, link.parent))
    os.replace(tmp, link)
