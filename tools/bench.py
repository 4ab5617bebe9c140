#!/usr/bin/env python3
"""Speed of the patched-wheel build against a plain copy of the base wheel (prints ratios).

Goal (issue #2): a fresh build within 5 s of copying the base wheel; a rebuild with unchanged
inputs much faster than a fresh one. Run with the tool's Python: .symfix/envs/tools/bin/python.
"""

import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from symfixlib import basewheel, build, series  # noqa: E402
from symfixlib.cli import CACHE  # noqa: E402


def timed(fn, repeat=3):
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main():
    s = series.load()
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else basewheel.fetch(
        s.base["requirement"], CACHE / "base")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        copy = timed(lambda: shutil.copyfile(path, tmp / "copy.whl"))
        verify = timed(lambda: basewheel.verify(path, s))
        base = basewheel.verify(path, s)

        def fresh():
            shutil.rmtree(tmp / "dist", ignore_errors=True)
            build.build(s, base, tmp / "dist", say=lambda p: None)

        pack = timed(fresh)
        reuse = timed(lambda: build.build(s, base, tmp / "dist", say=lambda p: None))
    mb = path.stat().st_size / 1e6
    print(f"base wheel {path.name}: {mb:.0f} MB")
    print(f"plain copy            {copy:6.2f} s   1.00x")
    print(f"verify base           {verify:6.2f} s   {verify / copy:5.1f}x copy")
    print(f"build (apply + pack)  {pack:6.2f} s   {pack / copy:5.1f}x copy, "
          f"{pack - copy:+.2f} s over copy (goal: < +5 s)")
    print(f"rebuild, unchanged    {reuse:6.2f} s   {reuse / pack:5.2f}x of a fresh build")


if __name__ == "__main__":
    main()
