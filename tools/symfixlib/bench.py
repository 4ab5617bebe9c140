"""`symfix.py bench`: the speed goals, as ratios (a benchmark, not a timed test).

- the patched-wheel build against a plain copy of the base wheel (the floor);
- the graph trainer's one unbacked trace against one static trace per shape, and a step of the
  unbacked graph (runtime asserts included) against a step of a static graph: measured by
  test/distributed/bench_graph_trainer.py, run in the stock and the patched environments.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from . import basewheel, build, envs
from .series import ROOT, Series

WORKLOAD = ROOT / "test" / "distributed" / "bench_graph_trainer.py"


def median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def wheel(series: Series, base: basewheel.BaseWheel, repeat: int = 5) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="symfix-bench-") as tmp:
        tmp = Path(tmp)

        def fresh():
            shutil.rmtree(tmp / "dist", ignore_errors=True)
            build.build(series, base, tmp / "dist", say=lambda p: None)

        return {
            "copy": median_time(lambda: shutil.copyfile(base.path, tmp / "copy.whl"), repeat),
            "verify": median_time(lambda: basewheel.verify(base.path, series), repeat),
            "build": median_time(fresh, repeat),
            "rebuild": median_time(lambda: build.build(series, base, tmp / "dist",
                                                       say=lambda p: None), repeat),
        }


def timed_run(cmd: list[str], cwd: Path) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"`{' '.join(cmd)}` failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return time.perf_counter() - t0


def main_job(base: Path, python: str) -> dict[str, float]:
    """The main job as a user meets it, against ``uv pip install`` of the stock wheel with what
    `wheel` installs beside torch: once a wheel uv has in its cache (hardlinks), once a copy of it
    at a new path, which uv unpacks first, as it must the new patched wheel of a fresh clone.

    ``python``: the interpreter the environments are made for. The clone is of HEAD.
    """
    with tempfile.TemporaryDirectory(prefix="symfix-bench-") as tmp:
        tmp = Path(tmp)
        uv = envs.uv()
        subprocess.run(["git", "clone", "-q", str(ROOT), str(tmp / "clone")], check=True)
        (tmp / "unseen").mkdir()
        unseen = shutil.copy2(base, tmp / "unseen" / base.name)

        def uv_install(wheel: Path, venv: Path) -> float:
            return timed_run([uv, "venv", "-q", "--python", python, str(venv)], tmp) + timed_run(
                [uv, "pip", "install", "-q", "--python", str(envs.python_of(venv)), str(wheel),
                 *envs.test_requirements()], tmp)

        wheel = ["python3", "tools/symfix.py", "wheel", "--wheel", str(base), "--python", python]
        return {
            "uv_stock": uv_install(base, tmp / "v"),
            "uv_stock_unseen": uv_install(unseen, tmp / "v-unseen"),
            "fresh_clone": timed_run(wheel, tmp / "clone"),
            "again": timed_run(wheel, tmp / "clone"),
            "test": timed_run(["python3", "tools/symfix.py", "test", "--wheel", str(base),
                               "--python", python], ROOT),
        }


def workload(python: Path, *args: str) -> dict | str:
    """The graph-trainer benchmark's JSON, or why there is none."""
    if not WORKLOAD.is_file():
        return f"{WORKLOAD.relative_to(ROOT)} does not exist yet"
    proc = subprocess.run([str(python), str(WORKLOAD), *args], capture_output=True, text=True,
                          cwd=ROOT)
    if proc.returncode:
        return f"failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])
