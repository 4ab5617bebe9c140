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
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from .errors import EnvError, NoRoom
from .series import ROOT

ENVS = ROOT / ".symfix" / "envs"
LOGS = ROOT / ".symfix" / "logs"
MARKER = "symfix-env.json"
# Disk a cold environment needs, in GB (nothing in uv's cache): the CPU torch is about 1 GB
# installed, a CUDA build 5.5 GB with its CUDA libraries.
COLD_GB = {"cpu": 2.0, "cuda": 7.0}
NEEDS_GB = {"upstream": COLD_GB["cuda"]}  # by role; the others are given theirs, else "cpu"
MARGIN_GB = 0.5
BYTECODE_GB = 0.2  # torch's modules compiled: 150 MB


READ_VERSION = """
import importlib.util, pathlib, sysconfig
path = pathlib.Path(sysconfig.get_paths()["purelib"], "torch", "version.py")
spec = importlib.util.spec_from_file_location("torch_version", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(module.__version__)
"""


def test_requirements() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["dependencies"] + project["optional-dependencies"]["test"]


def python_of(env: Path) -> Path:
    return env / "bin" / "python"


def free_gb(path: Path = ROOT) -> float:
    return shutil.disk_usage(path).free / 1e9


def room_needed(python: Path, specs: list[str], cold_gb: float) -> float:
    """GB the install of ``specs`` into ``python``'s environment will add to the disk.

    uv hardlinks what its cache holds, so only what it must fetch or unpack takes room. A dry run
    without the network says whether the cache holds everything but the local wheels: then the
    need is their unpacked size; otherwise, or where uv copies (``UV_LINK_MODE=copy``, or its
    cache on another file system), the whole cold estimate ``cold_gb``.
    """
    wheels = [Path(s) for s in specs if s.endswith(".whl")]
    cache = Path(subprocess.run([uv(), "cache", "dir"], capture_output=True, text=True).stdout
                 .strip())
    if os.environ.get("UV_LINK_MODE") == "copy" or not cache.is_dir() or (
            cache.stat().st_dev != python.parent.stat().st_dev):
        return cold_gb
    dry = subprocess.run([uv(), "pip", "install", "--dry-run", "--offline", "--python", str(python),
                          *specs], capture_output=True, text=True)
    fetched = re.search(r"Would download (\d+) package", dry.stderr)
    if dry.returncode or (fetched and int(fetched[1]) > len(wheels)):
        return cold_gb
    if not fetched:  # all in the cache, the local wheels included
        return MARGIN_GB
    unpacked = 0
    for w in wheels:
        with zipfile.ZipFile(w) as z:
            unpacked += sum(i.file_size for i in z.infolist())
    return unpacked / 1e9 + MARGIN_GB


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
           python: str | None = None, need_gb: float | None = None,
           bytecode: bool = False) -> Path:
    """An environment with ``torch_spec`` (a wheel path or a requirement) and the test deps.

    ``key`` identifies the torch (a wheel's sha256, or the requirement); ``python`` the
    interpreter (default: this one). The environment is reused while key, interpreter and
    requirements are unchanged, and it has bytecode if asked. Returns the path of its link.

    ``bytecode``: compile every module at install (uv, 9 s on 2 cores for torch). Without it
    each new process compiles what it imports, 5 s for torch and Dynamo, again and again where
    PYTHONDONTWRITEBYTECODE is set (as on this project's machines): worth it for `test`'s
    hundred processes, not for `wheel`'s one environment.
    """
    link = link or ENVS.parent / role
    reqs = test_requirements()
    python = python or sys.executable
    want = {"format": 3, "role": role, "torch": torch_spec, "key": key, "requirements": reqs,
            "python": python, "bytecode": bytecode}
    have = installed(link) or {}
    # the same torch by key, wherever its wheel lies; bytecode it has but needs not does no harm
    if have and all(have.get(k) == v for k, v in want.items() if k not in ("torch", "bytecode")) \
            and have.get("bytecode", False) >= bytecode:
        return link

    digest = hashlib.sha256(json.dumps(want, sort_keys=True).encode()).hexdigest()[:12]
    target = ENVS / f"{role}-{digest}"
    ENVS.mkdir(parents=True, exist_ok=True)
    LOGS.mkdir(parents=True, exist_ok=True)
    if target.exists():
        shutil.rmtree(target)  # an earlier, interrupted attempt
    log = LOGS / f"{role}.log"
    specs = [torch_spec, *reqs]

    def run(cmd: list[str]) -> None:
        with open(log, "a") as out:
            out.write(f"$ {' '.join(cmd)}\n")
            out.flush()
            if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode:
                tail = "".join(log.read_text().splitlines(True)[-5:])
                raise EnvError(f"{role}: `{' '.join(cmd[:3])} …` failed; see {log}\n{tail}")

    log.write_text("")
    try:
        run([uv(), "venv", "-q", "--python", python, str(target)])
        need = room_needed(python_of(target), specs, need_gb or NEEDS_GB.get(role, COLD_GB["cpu"]))
        need += BYTECODE_GB if bytecode else 0
        if (free := free_gb()) < need:
            raise NoRoom(f"{role}: {free:.1f} GB free, its environment needs {need:.1f} GB")
        run([uv(), "pip", "install", "-q", *(["--compile-bytecode"] if bytecode else []),
             "--python", str(python_of(target)), *specs])
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
    replaced = [old for old in ENVS.glob(f"{role}-*") if old != target]
    for old in replaced:
        shutil.rmtree(old, ignore_errors=True)
    if replaced:
        # uv keys a local wheel by path and time: the build this one replaced (1 GB unpacked)
        # stays in uv's cache, reachable by nobody, until a prune removes such entries.
        subprocess.run([uv(), "cache", "prune", "-q"], capture_output=True)
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
