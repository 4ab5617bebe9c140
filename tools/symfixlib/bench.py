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
import sys
import tempfile
import time
from pathlib import Path

from . import basewheel, build, envs, patched
from .series import ROOT, Series

WORKLOAD = ROOT / "test" / "distributed" / "bench_graph_trainer.py"
SDPA_UNDER_MODE = ROOT / "test" / "bench_sdpa_dispatch_mode.py"
TENSOR_SPLIT = ROOT / "test" / "bench_tensor_split_backed.py"


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


def stock_and_patched(script: Path) -> list[dict] | str:
    """A benchmark script's JSON in the stock and the patched environment, or why there is none."""
    runs = [workload(envs.python_of(env), script=script)
            for env in (ROOT / ".symfix" / "stock", patched.VENV)]
    return next((r for r in runs if isinstance(r, str)), runs)


def report(args) -> int:
    """`symfix.py bench`: every speed goal as a ratio."""
    s = patched.load_series(args)
    base = patched.base_wheel(s, args)
    w = wheel(s, base)
    print(f"\nwheel   base {base.path.stat().st_size / 1e6:.0f} MB, medians of 5")
    print(f"  plain copy of the base wheel   {w['copy']:7.2f} s   1.00x (the floor)")
    print(f"  verify the base                {w['verify']:7.2f} s")
    print(f"  build (apply + pack)           {w['build']:7.2f} s   {w['build'] / w['copy']:5.1f}x "
          f"copy, {w['build'] - w['copy']:+.2f} s (goal: within 5 s)")
    print(f"  rebuild with inputs unchanged  {w['rebuild']:7.2f} s   "
          f"{w['rebuild'] / w['build']:5.2f}x a fresh build")
    m = main_job(base.path, args.python or sys.executable)
    print("\nmain job, as a user runs it (base wheel on disk; medians of 3, `test` once)")
    print(f"  uv venv + uv pip install of the stock wheel   {m['uv_stock']:7.2f} s   1.00x "
          "(uv's cache holds it)")
    print(f"    the same, a wheel uv has not unpacked yet   {m['uv_stock_unseen']:7.2f} s   "
          f"{m['uv_stock_unseen'] / m['uv_stock']:5.2f}x")
    print(f"  `wheel` on a fresh clone (build + .venv)      {m['fresh_clone']:7.2f} s   "
          f"{m['fresh_clone'] / m['uv_stock']:5.2f}x uv, "
          f"{m['fresh_clone'] / m['uv_stock_unseen']:4.2f}x uv unpacking (goal: within 3x)")
    print(f"  `wheel` again, nothing changed                {m['again']:7.2f} s   "
          f"(goal: under 1 s)")
    print(f"  `test` (matrix + test/, no --upstream)        {m['test']:7.1f} s   "
          f"{m['test'] / 300:5.2f}x the 5 minutes of symfix14's serial run (goal: 0.5x)")
    sdpa = stock_and_patched(SDPA_UNDER_MODE)
    print("\nSDPA under a no-op dispatch mode (test/bench_sdpa_dispatch_mode.py), µs per call")
    if isinstance(sdpa, str):
        print(f"  not measured: {sdpa}")
    else:
        for key, what in (("plain_us", "nothing traced"),
                          ("after_trace_us", "after an unbacked trace")):
            print(f"  {what:24} stock {sdpa[0][key]:6.1f}   patched {sdpa[1][key]:6.1f}   "
                  f"{sdpa[1][key] / sdpa[0][key]:5.2f}x (goal: within 1.05x)")
    split = stock_and_patched(TENSOR_SPLIT)
    print("\ntensor_split(x, 64) over a backed size (test/bench_tensor_split_backed.py), medians")
    if isinstance(split, str):
        print(f"  not measured: {split}")
    else:
        for backend in ("aot_eager", "inductor"):
            st, ours = split[0][backend], split[1][backend]
            print(f"  {backend:9} compile  stock {st['compile_s']:6.2f} s   patched "
                  f"{ours['compile_s']:6.2f} s   {ours['compile_s'] / st['compile_s']:5.2f}x "
                  "(goal: <= 1.1x)")
            print(f"  {backend:9} call     stock {st['call_us']:6.1f} µs  patched "
                  f"{ours['call_us']:6.1f} µs  {ours['call_us'] / st['call_us']:5.2f}x")
    stock = workload(envs.python_of(ROOT / ".symfix" / "stock"), "--static-only")
    ours = workload(envs.python_of(patched.VENV))
    print("\ngraph trainer step (test/distributed/bench_graph_trainer.py): medians; steps of the "
          "two graphs interleaved, CPU time")
    if isinstance(stock, str) or isinstance(ours, str):
        print(f"  not measured: {stock if isinstance(stock, str) else ours}")
        return 1
    k = len(ours["shapes"])
    one, static = ours["trace_unbacked_s"], stock["static_recompiles_total_s"]
    print(f"  trace  one unbacked graph, patched             {one:7.2f} s")
    print(f"         {k} static graphs, one per shape, stock   {static:7.2f} s"
          f"   unbacked/static {one / static:5.2f}x")
    p = ours
    by_kind = ", ".join(f"{kind} {us:+.0f}" for kind, us in p["fixed_cost_by_kind_us"].items())
    print(f"  step   unbacked graph ({p['assert_nodes']} runtime asserts)      "
          f"{p['step_unbacked_cpu_s'] * 1e3:7.2f} ms")
    print(f"         static graph of that shape ({p['assert_nodes_static']} asserts)  "
          f"{p['step_static_cpu_s'] * 1e3:7.2f} ms   unbacked/static "
          f"{p['step_overhead_unbacked_vs_static_cpu']:5.2f}x (goal: <= 1.05x)")
    print(f"         fixed cost of the unbacked graph  {p['fixed_cost_us']:+.0f} µs/step "
          f"({by_kind})")
    if "step_unbacked_large_cpu_s" in p:
        print(f"         model x{p['large_size']}, shape {p['large_step_shape']}: "
              f"{p['step_unbacked_large_cpu_s'] * 1e3:.1f} / "
              f"{p['step_static_large_cpu_s'] * 1e3:.1f} ms   unbacked/static "
              f"{p['step_overhead_unbacked_vs_static_large_cpu']:5.2f}x (median of paired steps)")
    return 0
