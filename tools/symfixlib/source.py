"""Rebuild PyTorch from a v2.13.0 source checkout with the series applied (`symfix.py source`).

The build is PyTorch's own, driven the way conda-forge's recipe drives it: `pip wheel .` without
build isolation, with the build environment spelled out (and overridable from the caller's).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import build, checkout, checks, children, export, git, patched
from .errors import BuildFailed, Refused
from .report import rel, Step
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
    git.write_tree(src, ours)
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


def run(args) -> int:
    """`symfix.py source`: the series as commits on a PyTorch checkout, built, then tested."""
    s = patched.load_series()
    src = Path(args.src or args.clone).resolve()
    export.check_python(Path(args.python))
    export.check_out_dir(Path(args.out))
    if args.clone and src.exists() and (not src.is_dir() or any(src.iterdir())):
        raise Refused(f"--clone {src}: exists and is not an empty directory")
    if args.clone:
        cmds = clone_commands(src, s)
        if args.dry_run:
            print("would run:\n  " + "\n  ".join(shlex.join(c) for c in cmds))
            return 0
        step = Step("clone")
        for cmd in cmds:
            if subprocess.run(cmd).returncode:
                print(f"symfix: `{shlex.join(cmd)}` failed", file=sys.stderr)
                return 1
        step.done(f"{src} at {s.base['tag']}")
    step = Step("src")
    how = checkout.verify(src, s)
    head = git.run(src, "rev-parse", "HEAD").stdout.strip()
    step.done(f"{src}: {how}")
    branch = args.branch or f"symfix/{s.base['tag']}-{s.label}"
    env = build_env(s)
    out = Path(args.out).resolve()
    build_cmd = wheel_command(args.python, out)
    if args.dry_run:
        print("would run, in " + str(src) + ":")
        print(f"  git checkout -b {branch}")
        for p in s.patches:
            print(f"  git am --keep-cr --keep-non-patch {p.path}")
        print(f"  write {build.PROVENANCE} (provenance record; removed after the build)")
        print("  " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " \\\n    "
              + shlex.join(build_cmd))
        print(f"then: python3 tools/symfix.py test --wheel "
              f"{out}/torch-{env['PYTORCH_BUILD_VERSION']}-….whl")
        return 0
    step = Step("am")

    def applied(patch, commit):
        print(f"        {commit[:10]} {patch.subject}", flush=True)

    checkout.am(src, s.patches, branch, say=applied)
    step.done(f"branch {branch}: {len(s.patches)} commits on {head[:8]}")
    step = Step("build")
    wheel = build_wheel(src, s, args.python, out, head)
    prov = build.read_provenance(wheel) or {}
    if prov.get("VERSION") != env["PYTORCH_BUILD_VERSION"]:
        print(f"symfix: {wheel.name} lacks the provenance record {build.PROVENANCE}",
              file=sys.stderr)
        return 1
    step.done(f"{rel(wheel)}  sha256 {patched.sha256_short(wheel)}…")
    if args.no_test:
        return 0
    return checks.test(argparse.Namespace(base=None, wheel=None, variant=None, python=args.python,
                                          patched=str(wheel), upstream=args.upstream,
                                          matrix_only=False, patched_only=False,
                                          skip_if_no_room=False))
