"""`symfix.py bench`: the speed goals, as ratios (a benchmark, not a timed test).

- the patched-wheel build against a plain copy of the base wheel (the floor);
- the graph trainer's one unbacked trace against one static trace per shape, and a step of the
  unbacked graph (runtime asserts included) against a step of a static graph: measured by
  test/distributed/bench_graph_trainer.py, run in the stock and the patched environments.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from . import basewheel, build, envs
from .series import ROOT, Series

WORKLOAD = ROOT / "test" / "distributed" / "bench_graph_trainer.py"
SDPA_UNDER_MODE = ROOT / "test" / "bench_sdpa_dispatch_mode.py"


def settle() -> None:
    """Write out what earlier runs left in the page cache, so that its writeback is not charged to
    the next run (uv unpacking a 530 MB CUDA wheel it has not seen leaves 2 GB to write)."""
    os.sync()


def median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        settle()
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
    settle()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"`{' '.join(cmd)}` failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return time.perf_counter() - t0


def main_job(base: Path, python: str, repeat: int = 3) -> dict[str, float]:
    """The main job as a user meets it, against ``uv pip install`` of the stock wheel with what
    `wheel` installs beside torch: once a wheel uv has in its cache (hardlinks), once a copy of it
    at a new path, which uv unpacks first. Medians of ``repeat``; `test` runs once.

    ``python``: the interpreter the environments are made for. The clone is of HEAD; each
    fresh-clone run starts without its dist/, .symfix/ and .venv.
    """
    base = base.resolve()  # the runs are in the clone and in a scratch directory
    with tempfile.TemporaryDirectory(prefix="symfix-bench-") as tmp:
        tmp = Path(tmp)
        uv = envs.uv()
        clone = tmp / "clone"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        runs = itertools.count()

        def uv_install(wheel: Path) -> float:
            venv = tmp / f"v{next(runs)}"
            return timed_run([uv, "venv", "-q", "--python", python, str(venv)], tmp) + timed_run(
                [uv, "pip", "install", "-q", "--python", str(envs.python_of(venv)), str(wheel),
                 *envs.test_requirements()], tmp)

        def unseen() -> float:
            copy = tmp / f"u{next(runs)}" / base.name
            copy.parent.mkdir()
            shutil.copy2(base, copy)
            return uv_install(copy)

        wheel = ["python3", "tools/symfix.py", "wheel", "--wheel", str(base), "--python", python]

        def fresh_clone() -> float:
            for path in ("dist", ".symfix"):
                shutil.rmtree(clone / path, ignore_errors=True)
            (clone / ".venv").unlink(missing_ok=True)  # a link into .symfix/envs
            return timed_run(wheel, clone)

        def median(fn) -> float:
            return statistics.median(fn() for _ in range(repeat))

        times = {
            "uv_stock": median(lambda: uv_install(base)),
            "uv_stock_unseen": median(unseen),
            "fresh_clone": median(fresh_clone),
            "again": timed_run(wheel, clone),
        }
    subprocess.run([uv, "cache", "prune", "-q"], capture_output=True)  # the unseen copies
    times["test"] = timed_run(["python3", "tools/symfix.py", "test", "--wheel", str(base),
                               "--python", python], ROOT)
    return times


def workload(python: Path, *args: str, script: Path = WORKLOAD) -> dict | str:
    """A benchmark script's JSON (the graph-trainer one by default), or why there is none."""
    if not script.is_file():
        return f"{script.relative_to(ROOT)} does not exist yet"
    proc = subprocess.run([str(python), str(script), *args], capture_output=True, text=True,
                          cwd=ROOT)
    if proc.returncode:
        return f"failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])
