"""Rebuild PyTorch from a v2.13.0 source checkout with the series applied (`symfix.py source`).

The build is PyTorch's own, driven the way conda-forge's recipe drives it: `pip wheel .` without
build isolation, with the build environment spelled out (and overridable from the caller's).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import build, children
from .errors import BuildFailed
from .series import ROOT, Series

REPO_URL = "https://github.com/pytorch/pytorch"


def build_env(series: Series) -> dict[str, str]:
    """The build's environment: our defaults, each overridden by the caller's own setting."""
    cuda = os.environ.get("USE_CUDA",
                          "1" if shutil.which("nvcc") or os.environ.get("CUDA_HOME") else "0")
    defaults = {
        "USE_CUDA": cuda,
        "MAX_JOBS": str(os.cpu_count() or 1),
        "BUILD_TEST": "0",
        "USE_DISTRIBUTED": "1",
        "PYTORCH_BUILD_VERSION": f"{series.base['version']}+{series.label}",
        "PYTORCH_BUILD_NUMBER": "1",
    }
    return {k: os.environ.get(k, v) for k, v in defaults.items()}


def clone_commands(dest: Path, series: Series) -> list[list[str]]:
    return [["git", "clone", "--branch", series.base["tag"], "--recurse-submodules",
             "--shallow-submodules", REPO_URL, str(dest)]]


def wheel_command(python: str, out: Path) -> list[str]:
    # --no-deps: the wheel of torch only, not of its requirements (conda-forge does the same).
    return [python, "-m", "pip", "wheel", ".", "--no-build-isolation", "--no-deps", "-v",
            "-w", str(out)]


def run_build(src: Path, cmd: list[str], env: dict[str, str], log: Path, say=print) -> None:
    """Run the build, streaming its output to ``log``, with a progress line every 10 s."""
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = last = time.monotonic()
    progress = ""
    # SIGTERM to the build's group: pip and setup.py end, ninja stops its compilers and removes
    # their partial outputs (SIGINT may be ignored where a shell's background job started us)
    with open(log, "w") as out, children.started(
            cmd, stop=signal.SIGTERM, cwd=src, env={**os.environ, **env}, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as proc:
        for line in proc.stdout:
            out.write(line)
            if m := re.match(r"\s*\[(\d+)/(\d+)\]", line):  # ninja's progress
                done, total = int(m.group(1)), int(m.group(2))
                progress = f"[{done}/{total}] {100 * done // total}%"
            if time.monotonic() - last >= 10:
                last = time.monotonic()
                say(f"        building {progress or '…'} {int(last - t0) // 60}m"
                    f"{int(last - t0) % 60:02d}s  (log: {log})")
        rc = proc.wait()
    if rc:
        tail = "".join(log.read_text().splitlines(True)[-15:])
        raise BuildFailed(f"the build failed (exit {rc}); see {log}\n{tail}")


def build_wheel(src: Path, series: Series, python: str, out: Path, head: str, say=print) -> Path:
    """Build the checkout into ``out``; the torch._symfix package (provenance record and our
    files, see build.own_files) goes in with it."""
    env = build_env(series)
    prov = src / build.PROVENANCE
    key = build.build_key_of({"source": head, "patches": [[p.name, p.sha256]
                                                          for p in series.patches]})
    ours = build.own_files(series.root)
    build.write_tree(src, ours)
    prov.write_bytes(build.provenance_module(
        series, {"version": series.base["version"], "source": head}, env["PYTORCH_BUILD_VERSION"],
        key, series.patches))
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".source-build-", dir=out))
    try:
        run_build(src, wheel_command(python, tmp), env, ROOT / ".symfix" / "logs" / "source.log",
                  say)
        wheels = list(tmp.glob("torch-*.whl"))
        if len(wheels) != 1:
            raise BuildFailed(f"the build made {len(wheels)} torch wheels, expected one")
        final = out / wheels[0].name
        os.replace(wheels[0], final)
        return final
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        for path in [*ours, build.PROVENANCE]:
            (src / path).unlink(missing_ok=True)
        shutil.rmtree(prov.parent / "__pycache__", ignore_errors=True)
        if prov.parent.is_dir() and not any(prov.parent.iterdir()):
            prov.parent.rmdir()


def python_default() -> str:
    return shutil.which("python3") or sys.executable
