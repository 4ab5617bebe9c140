"""`symfix.py test` and `symfix.py status`: the matrix run for a build, and the fixes an install
has, both judged by each fix's tests (matrix.py runs them)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from concurrent.futures import Future
from pathlib import Path

from packaging.version import Version

from . import basewheel, build, envs, export, matrix, patched, series
from .errors import NoRoom, Refused
from .report import rel, Step
from .series import ROOT


def test(args) -> int:
    """`symfix.py test`: the matrix of a build (and the suite of test/ on the patched one)."""
    s = patched.load_series(args)
    base = patched.base_wheel(s, args)
    if args.patched:  # a given build (from `source`, or downloaded): test it as it is
        out = Path(args.patched).resolve()
        if not out.is_file():
            raise Refused(f"wheel {out}: no such file")
        print(f"wheel   {out.name}  provenance: "
              + ("symfix" if build.read_provenance(out) else "none (not a symfix build)"))
    else:
        planned = Future()
        out = patched.build_wheel(s, base, patched.DIST, planned)
    need = patched.env_need_gb(base)
    out_sha = basewheel.sha256_file(out) if args.patched else build.build_key(s, base)
    try:
        pythons: dict[str, Path | str] = {
            "stock": "not run (--patched-only)" if args.patched_only else patched.install(
                "stock", str(base.path), base.sha256, python=args.python, need_gb=need,
                bytecode=True, extra=s.triton),
            "patched": patched.install(
                "tested" if args.patched else "patched", str(out), out_sha,
                None if args.patched else patched.VENV, args.python, need, bytecode=True,
                over=None if args.patched else base.path,
                patched=None if args.patched else patched.plan_of(s, base, planned),
                extra=s.triton),
        }
    except NoRoom as e:
        if not args.skip_if_no_room:
            raise
        print(f"\n!!! SKIPPED these tests: {e} !!!\n", flush=True)
        return 0
    if args.upstream and s.upstream:
        req = s.upstream["requirement"]
        try:
            pythons["upstream"] = patched.install("upstream", req, req, python=args.python,
                                                  bytecode=True)
        except NoRoom as e:
            pythons["upstream"] = str(e)
            print(f"\n!!! SKIPPED the upstream column ({req}): {e} !!!\n", flush=True)

    step = Step("tests")
    env = {"SYMFIX_BASE_WHEEL": str(base.path), "SYMFIX_BASE": s.base["tag"]}
    if isinstance(pythons.get("upstream"), Path):
        env["SYMFIX_UPSTREAM_PYTHON"] = str(envs.python_of(pythons["upstream"]))
    results, suite_runs = matrix.run_columns(
        s, {role: envs.python_of(p) if isinstance(p, Path) else p for role, p in pythons.items()},
        env, suite=not args.matrix_only)
    step.done(f"matrix on {', '.join(r for r, p in pythons.items() if isinstance(p, Path))} "
              "(C++ and Triton paths)" + ("" if args.patched_only else ", controls on stock")
              + ("" if args.matrix_only else ", test/ on patched")
              + f", two at a time  (logs: {rel(matrix.LOGS)})", "run")
    text, problems = matrix.table(s, results)
    print("\n" + text + "\n")
    for p in problems:
        print(f"  ✗ {p}")
    print(f"{len(s.fixes)} fixes + {len(s.acceptance)} acceptance runs: "
          + (f"{len(problems)} problems" if problems else "all as expected"))
    if args.matrix_only:
        return 1 if problems else 0
    for name, run in suite_runs.items():
        print(f"suite   pytest {' '.join(matrix.SUITE_SHARDS[name])} on patched: {run.summary}  "
              f"(log: {rel(run.log)})  {'FAIL' if run.returncode else 'ok'}")
    failed = [run for run in suite_runs.values() if run.returncode]
    for run in failed:
        print(run.log.read_text()[-4000:])
    return 1 if problems or failed else 0


def status(args) -> int:
    """`symfix.py status`: which fixes a torch install has, judged by their tests."""
    python = export.check_python(Path(args.python or shutil.which("python3") or sys.executable))
    probe = subprocess.run(
        [str(python), "-c", "import importlib, importlib.util as u, torch;"
         "print(torch.__version__); print(len(importlib.import_module('torch._symfix').PATCHES) "
         "if u.find_spec('torch._symfix') else 0)"], capture_output=True, text=True)
    if probe.returncode or len(probe.stdout.split()) != 2:
        print(f"symfix: {python} cannot import torch", file=sys.stderr)
        return 2
    version, patches = probe.stdout.split()
    print(f"torch {version} at {python}" + (f" (symfix build, {patches} patches)"
                                             if int(patches) else ""))
    tag, own = series.base_for(version)
    if own:
        print(f"series  patches/{tag}: `python3 tools/symfix.py wheel --base {tag[1:]}` builds it")
    else:  # no series of its own: judge it by the fixes of the newest base
        print(f"series  none for torch {Version(version).public} (bases: "
              f"{', '.join(b[1:] for b in series.bases())}); the fixes of {tag[1:]}:")
    s = series.load(tag=tag)
    log = ROOT / ".symfix" / "logs" / "status.log"
    outcomes = matrix.run_tests(python, matrix.all_test_ids(s), log).outcomes
    if all(v == "missing" for v in outcomes.values()):
        print(f"symfix: no test ran; does {python} have pytest, expecttest, hypothesis? "
              f"(log: {rel(log)})", file=sys.stderr)
        return 2
    lacking = untested = 0
    width = max(len(fix.id) for fix in s.rows)
    for fix in s.rows:
        proofs = [outcomes[t] for t in fix.proof]
        guards = [outcomes[t] for t in fix.guard]
        if not fix.tests:
            verdict, untested = "no tests yet", untested + 1
        elif all(o == matrix.PASS for o in proofs):  # a row of guards only: has it if they pass
            verdict = "has"
        elif all(o == matrix.FAIL for o in proofs):
            verdict, lacking = "lacks", lacking + 1
        else:
            verdict, lacking = "partial", lacking + 1
        if any(o != matrix.PASS for o in guards):
            verdict += " (a guard test fails)"
        prs = ", ".join(f"#{n}" for n in fix.upstream)
        print(f"  {fix.id:<{width}} {prs:<18} {verdict}")
    print(f"{len(s.rows) - lacking - untested} of {len(s.rows) - untested} tested fixes present"
          + ("; `python3 tools/symfix.py wheel` builds a torch with all" if lacking else ""))
    return 0
