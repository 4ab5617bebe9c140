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
import urllib.parse
import zipfile
from collections.abc import Callable
from pathlib import Path

from . import rawzip

# envs takes the build's plan (its patched files) and writes it over the base install: seconds,
# where installing the patched wheel would unpack all of it again.
from .build import Plan
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
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["symfix"]
    return tool["dependencies"] + tool["test"]


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
           bytecode: bool = False, over: Path | None = None,
           patched: Callable[[], Plan] | None = None, extra: tuple[str, ...] = ()) -> Path:
    """An environment with ``torch_spec`` (a wheel path or a requirement), the test deps and
    ``extra`` requirements (the base release's triton, for the Triton column).

    ``key`` identifies the torch (a wheel's sha256, or the requirement); ``python`` the
    interpreter (default: this one). The environment is reused while key, interpreter and
    requirements are unchanged, and it has bytecode if asked. Returns the path of its link.

    ``bytecode``: compile every module at install (uv, 9 s on 2 cores for torch). Without it
    each new process compiles what it imports, 5 s for torch and Dynamo, again and again where
    PYTHONDONTWRITEBYTECODE is set (as on this project's machines): worth it for `test`'s
    hundred processes, not for `wheel`'s one environment.

    ``over``: the base wheel ``torch_spec`` (a patched wheel) was built from; uv installs the
    base and `install_over` turns it into the patched build, whose plan ``patched`` gives once
    uv is done (the build may be under way beside uv: its errors are this call's).
    """
    link = link or ENVS.parent / role
    reqs = test_requirements() + list(extra)
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
    specs = [str(over) if over else torch_spec, *reqs]

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
        if over:
            written = install_over(site_packages(target), patched(), Path(torch_spec))
            if bytecode:
                run([str(python_of(target)), "-m", "compileall", "-q",
                     *(str(p) for p in written if p.suffix == ".py")])
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
        # uv keys a local wheel by path and time: one it unpacked for a replaced environment (a
        # build given to `test --patched`, 1 GB) stays in its cache, reachable by nobody, until
        # a prune removes such entries.
        subprocess.run([uv(), "cache", "prune", "-q"], capture_output=True)
    return link


def site_packages(env: Path) -> Path:
    return next(env.glob("lib/python*/site-packages"))


def install_over(site: Path, plan: Plan, wheel: Path) -> list[Path]:
    """Make ``site``, where uv installed the base wheel of ``plan``, hold the build ``plan``
    describes (written to ``wheel``) as an install of ``wheel`` would leave it: its new and
    changed files written, the files it drops removed, the dist-info directory renamed with what
    the installer added to it, direct_url.json naming ``wheel``, RECORD rewritten. Returns the
    files written.

    Why not uv: to uv a new build is a new 700 MB wheel (1.1 GB for CUDA), unpacked into its
    cache before it is linked, 3-4 s here; the base is in the cache already (the stock
    environment), and the two differ in a hundred small files, which the plan holds: the
    environment is ready before the build's wheel is written. Each is replaced by a rename,
    never written in place: the files around it are hardlinks into uv's cache.
    """
    old_info, new_info = plan.base.dist_info, plan.dist_info

    def renamed(path: str) -> str:
        return new_info + path[len(old_info):] if path.startswith(old_info + "/") else path

    installed = {renamed(p): [renamed(p), *row[1:]] for p, row in
                 rawzip.read_record((site / old_info / "RECORD").read_text()).items()}
    if old_info != new_info:  # the build's dist-info files that are the base's move with it
        os.replace(site / old_info, site / new_info)
    rows = {row[0]: row for row in plan.record}
    written = []
    for path, data in plan.files().items():
        if path == f"{new_info}/RECORD":
            continue
        dest = site / path
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.symfix")
        tmp.write_bytes(data)
        os.chmod(tmp, dest.stat().st_mode if dest.exists() else 0o644)
        os.replace(tmp, dest)
        installed[path] = list(rows[path])
        written.append(dest)
        for pyc in (dest.parent / "__pycache__").glob(f"{dest.stem}.*.pyc"):
            pyc.unlink()
    for path in plan.deleted:
        (site / path).unlink(missing_ok=True)
        installed.pop(path, None)
    # What the installer added: uv_cache.json described the base archive; direct_url.json
    # names the new wheel (as uv writes it: a path segment escapes fewer characters than
    # as_uri() does).
    installed.pop(f"{new_info}/uv_cache.json", None)
    (site / new_info / "uv_cache.json").unlink(missing_ok=True)
    direct_url = f"{new_info}/direct_url.json"
    if direct_url in installed:
        url = "file://" + urllib.parse.quote(str(wheel.resolve()), safe="/!$&'()*+,;=:@~")
        data = json.dumps({"url": url, "archive_info": {}}, separators=(",", ":")).encode()
        (site / direct_url).write_bytes(data)
        installed[direct_url] = [direct_url, rawzip.record_hash(data), str(len(data))]
    installed[f"{new_info}/RECORD"] = [f"{new_info}/RECORD", "", ""]
    (site / new_info / "RECORD").write_bytes(rawzip.record_text(list(installed.values())))
    return written


def switch(link: Path, target: Path) -> None:
    """Point ``link`` at ``target`` in one rename (never a moment without a complete env)."""
    if link.exists() and not link.is_symlink():
        raise EnvError(f"{link} exists and is not a symfix environment link; move it away")
    tmp = link.with_name(f".{link.name}.new")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(os.path.relpath(target, link.parent))
    os.replace(tmp, link)
