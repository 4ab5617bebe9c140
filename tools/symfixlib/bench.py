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

from . import basewheel, build
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


def workload(python: Path, *args: str) -> dict | str:
    """The graph-trainer benchmark's JSON, or why there is none."""
    if not WORKLOAD.is_file():
        return f"{WORKLOAD.relative_to(ROOT)} does not exist yet"
    proc = subprocess.run([str(python), str(WORKLOAD), *args], capture_output=True, text=True,
                          cwd=ROOT)
    if proc.returncode:
        return f"failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])
