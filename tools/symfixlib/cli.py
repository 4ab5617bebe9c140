"""The verbs of tools/symfix.py."""

from __future__ import annotations

import argparse
import shlex
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from . import audit, basewheel, bench, build, checkout, envs, export, matrix, series, source
from .errors import BadTarget, NoRoom, Refused, SymfixError
from .series import ROOT

CACHE = ROOT / ".symfix" / "cache"
DIST = ROOT / "dist"
VENV = ROOT / ".venv"
TABLE_BEGIN, TABLE_END = "<!-- series-table: begin -->", "<!-- series-table: end -->"


class Step:
    """Prints one aligned progress line per step, with its duration."""

    def __init__(self, name: str):
        self.name, self.t0 = name, time.monotonic()

    def done(self, text: str, status: str = "ok") -> None:
        secs = time.monotonic() - self.t0
        print(f"{self.name:<7} {text:<78} {status:>4} {secs:6.1f}s", flush=True)


def rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def sha256_short(path: Path) -> str:
    """A wheel's sha256, as `wheel` recorded it when it wrote the file, else read."""
    return (basewheel.remembered(ROOT, path, "sha256") or basewheel.sha256_file(path))[:12]


def series_tag(args) -> str:
    """The base release: --base, else the base wheel's, else the default."""
    if getattr(args, "base", None):
        return "v" + args.base.removeprefix("v")
    if getattr(args, "wheel", None):
        if not Path(args.wheel).is_file():
            raise Refused(f"base wheel {args.wheel}: no such file")
        try:
            return f"v{parse_wheel_filename(Path(args.wheel).name)[1].public}"
        except InvalidWheelFilename as e:
            raise Refused(f"base wheel {args.wheel}: not a wheel file name ({e})") from None
    return series.DEFAULT_BASE


def load_series(args=None) -> series.Series:
    step = Step("series")
    tag = series_tag(args)
    if tag not in series.bases():
        what = f"base wheel {Path(args.wheel).name}: " if getattr(args, "wheel", None) else ""
        raise Refused(f"{what}torch {tag[1:]} is not a base symfix carries a series for "
                      f"({', '.join(b[1:] for b in series.bases())})")
    s = series.load(tag=tag)
    step.done(f"{len(s.patches)} patches, {len(s.fixes)} fixes, base {s.base['tag']} "
              f"({s.base['commit'][:8]})")
    return s


def base_wheel(s: series.Series, args, defer: bool = False) -> basewheel.BaseWheel:
    """The base wheel: ``args.wheel`` if given, else the one for ``args.python`` and
    ``args.variant``. ``defer``: as for basewheel.verify."""
    step = Step("base")
    wheel = (Path(args.wheel) if args.wheel else
             basewheel.fetch(s, CACHE / "base", args.variant, args.python))
    base = basewheel.verify(wheel, s, defer)
    how = ("sha256 known, checked beside the build" if base.pending else "sha256 known"
           if base.known else "every member checked against RECORD")
    step.done(f"{wheel.name}  {base.sha256[:12]}… ({how})")
    return base


def build_wheel(s: series.Series, base: basewheel.BaseWheel, dist: Path,
                planned: Future | None = None) -> Path:
    """Build (or keep) the patched wheel; ``planned`` as for build.build."""
    step = Step("apply")

    def applied(patch):
        fix = s.fix_for(patch)
        print(f"        {patch.name[:4]} {fix.id:<28} {', '.join(c.path for c in patch.changes)}"
              + ("" if patch.wheel else "  skipped: source builds only"), flush=True)

    out, reused = build.build(s, base, dist, say=applied, planned=planned)
    if reused:
        step.done(f"{rel(out)} up to date (same base and patches)", "kept")
    else:
        step.done(f"{rel(out)}  sha256 {sha256_short(out)}…", "pack")
    for old in dist.glob("torch-*.whl"):  # one wheel in dist/: `pip install dist/*.whl` works
        if old != out and build.read_provenance(old) is not None:
            old.unlink()
    return out


def install(role: str, spec: str, key: str, link: Path | None = None,
            python: str | None = None, need_gb: float | None = None,
            bytecode: bool = False, over: Path | None = None,
            patched: Callable[[], build.Plan] | None = None, extra: tuple[str, ...] = ()) -> Path:
    step = Step("venv")
    path = envs.ensure(role, spec, key, link, python, need_gb, bytecode, over, patched, extra)
    step.done(f"{rel(path)}  (torch {envs.installed(path)['torch_version']})")
    return path


def plan_of(s: series.Series, base: basewheel.BaseWheel, planned: Future) -> Callable:
    """The patched files to install over the base: the plan of the build ``planned`` waits
    for, or, where the build was kept (None), made again."""
    def plan() -> build.Plan:
        made = planned.result() or build.plan(s, base, say=lambda patch: None)
        base.check()  # before an environment made from the base is kept
        return made
    return plan


def env_need_gb(base: basewheel.BaseWheel) -> float:
    """Disk for an environment of this build: a CUDA torch pulls in 4 GB of CUDA libraries."""
    cpu = base.version.endswith("+cpu") or "macosx" in base.path.name
    return envs.COLD_GB["cpu" if cpu else "cuda"]


def cmd_wheel(args) -> int:
    s = load_series(args)
    base = base_wheel(s, args, defer=True)
    if args.no_venv:
        build_wheel(s, base, Path(args.dist))
        base.check()
        return 0
    # uv installs the base while the wheel is built; the patched files go over it once the
    # series is applied, while the wheel is still being written.
    planned = Future()
    with ThreadPoolExecutor(1) as pool:
        built = pool.submit(build_wheel, s, base, Path(args.dist), planned)
        install("patched", str(build.output_path(s, base, Path(args.dist))),
                build.build_key(s, base), VENV, args.python, env_need_gb(base), over=base.path,
                patched=plan_of(s, base, planned), extra=s.triton)
        built.result()
    base.check()  # where nothing was made: the wheel and .venv were up to date
    print("done. `. .venv/bin/activate` and `import torch` gives the patched build.")
    return 0


def cmd_test(args) -> int:
    s = load_series(args)
    base = base_wheel(s, args)
    if args.patched:  # a given build (from `source`, or downloaded): test it as it is
        out = Path(args.patched).resolve()
        if not out.is_file():
            raise Refused(f"wheel {out}: no such file")
        print(f"wheel   {out.name}  provenance: "
              + ("symfix" if build.read_provenance(out) else "none (not a symfix build)"))
    else:
        planned = Future()
        out = build_wheel(s, base, DIST, planned)
    need = env_need_gb(base)
    out_sha = basewheel.sha256_file(out) if args.patched else build.build_key(s, base)
    try:
        pythons: dict[str, Path | str] = {
            "stock": install("stock", str(base.path), base.sha256, python=args.python,
                             need_gb=need, bytecode=True, extra=s.triton),
            "patched": install("tested" if args.patched else "patched", str(out), out_sha,
                               None if args.patched else VENV, args.python, need, bytecode=True,
                               over=None if args.patched else base.path,
                               patched=None if args.patched else plan_of(s, base, planned),
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
            pythons["upstream"] = install("upstream", req, req, python=args.python,
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
    step.done(f"matrix on {', '.join(pythons)} (C++ and Triton paths), controls on stock"
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


def cmd_status(args) -> int:
    if args.rebase_onto:
        return cmd_rebase_status(args)
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
    tag = f"v{Version(version).public}"
    if tag in series.bases():
        print(f"series  patches/{tag}: `python3 tools/symfix.py wheel --base {tag[1:]}` builds it")
    else:  # no series of its own: judge it by the fixes of the newest base
        print(f"series  none for torch {Version(version).public} (bases: "
              f"{', '.join(b[1:] for b in series.bases())}); the fixes of the newest base:")
        tag = max(series.bases(), key=lambda b: Version(b[1:]))
    s = series.load(tag=tag)
    log = ROOT / ".symfix" / "logs" / "status.log"
    outcomes = matrix.run_tests(python, matrix.all_test_ids(s), log).outcomes
    if all(v == "missing" for v in outcomes.values()):
        print(f"symfix: no test ran; does {python} have pytest, expecttest, hypothesis? "
              f"(log: {rel(log)})", file=sys.stderr)
        return 2
    lacking = untested = 0
    for fix in s.rows:
        proofs = [outcomes[t] for t in fix.proof]
        guards = [outcomes[t] for t in fix.guard]
        if not fix.tests:
            verdict, untested = "no tests yet", untested + 1
        elif proofs and all(o == matrix.PASS for o in proofs):
            verdict = "has"
        elif all(o == matrix.FAIL for o in proofs):
            verdict, lacking = "lacks", lacking + 1
        else:
            verdict, lacking = "partial", lacking + 1
        if any(o != matrix.PASS for o in guards):
            verdict += " (a guard test fails)"
        prs = ", ".join(f"#{n}" for n in fix.upstream)
        print(f"  {fix.id:<30} {prs:<18} {verdict}")
    print(f"{len(s.rows) - lacking - untested} of {len(s.rows) - untested} tested fixes present"
          + ("; `python3 tools/symfix.py wheel` builds a torch with all" if lacking else ""))
    return 0


def cmd_worktree(args) -> int:
    """A git repo of the base wheel's Python files with the series applied, one commit a patch."""
    dest = Path(args.dir)
    if dest.exists() and not dest.is_dir():
        raise Refused(f"worktree {dest}: exists and is not a directory")
    if dest.exists() and any(dest.iterdir()):
        raise Refused(f"worktree {dest}: exists and is not empty")
    s = load_series(args)
    base = base_wheel(s, args)
    step = Step("tree")
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(base.path) as zf:
        for info in zf.infolist():
            if info.filename.startswith("torch/") and info.filename.endswith(".py"):
                zf.extract(info, dest)
    ident = ["-c", "user.name=symfix", "-c", "user.email=symfix@users.noreply.github.com"]

    def git(*cmd):
        subprocess.run(["git", *ident, *cmd], cwd=dest, check=True, capture_output=True)

    git("init", "-q")
    git("add", "-A")
    git("commit", "-q", "-m", f"PyTorch {s.base['tag']} Python files (from {base.path.name})",
        "-m", f"git_version {s.base['commit']}")
    git("tag", s.base["tag"])
    git("am", "-q", "--keep-cr", "--keep-non-patch", *[str(p.path) for p in s.wheel_patches])
    step.done(f"{dest}: {s.base['tag']} + {len(s.wheel_patches)} commits")
    return 0


def cmd_source(args) -> int:
    s = load_series()
    src = Path(args.src or args.clone).resolve()
    export.check_python(Path(args.python))
    export.check_out_dir(Path(args.out))
    if args.clone and src.exists() and (not src.is_dir() or any(src.iterdir())):
        raise Refused(f"--clone {src}: exists and is not an empty directory")
    if args.clone:
        cmds = source.clone_commands(src, s)
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
    head = checkout.git(src, "rev-parse", "HEAD").stdout.strip()
    step.done(f"{src}: {how}")
    branch = args.branch or f"symfix/{s.base['tag']}-{s.label}"
    env = source.build_env(s)
    out = Path(args.out).resolve()
    build_cmd = source.wheel_command(args.python, out)
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
    wheel = source.build_wheel(src, s, args.python, out, head)
    prov = build.read_provenance(wheel) or {}
    if prov.get("VERSION") != env["PYTORCH_BUILD_VERSION"]:
        print(f"symfix: {wheel.name} lacks the provenance record {build.PROVENANCE}",
              file=sys.stderr)
        return 1
    step.done(f"{rel(wheel)}  sha256 {sha256_short(wheel)}…")
    if args.no_test:
        return 0
    return cmd_test(argparse.Namespace(base=None, wheel=None, variant=None, python=args.python,
                                       patched=str(wheel), upstream=args.upstream,
                                       matrix_only=False))


def cmd_export(args) -> int:
    if args.all == bool(args.id):
        raise Refused("export: name one fix id, or --all")
    plan = export.plan(ROOT, args.id, args.series)
    s = plan.series
    print(f"series  {s.base['tag']}: {len(plan.patches)} of {len(s.patches)} patches, "
          f"PR text addressed to {plan.target}" + (f"\n        {plan.note}" if plan.note else ""))
    src = Path(args.onto).resolve()
    export.check_checkout(src)
    export.check_out_dir(Path(args.out))
    if args.dry_run:
        start = export.base_ref(src, plan.target, args.base, s)
        print(f"would run, in {src}:\n  git checkout -b symfix/export/{plan.name} {start}")
        for p in plan.patches:
            fix = s.fix_for(p)
            print(f"  git am --keep-cr --keep-non-patch {p.path}")
            print(f"  add the tests to {', '.join(export.porttests.wanted(fix))}; "
                  f"git commit --amend (without {', '.join(export.DROPPED_TRAILERS)})")
            print(f"  write {Path(args.out) / p.name.removesuffix('.patch')}.md")
        return 0
    step = Step("export")

    def exported(patch, commit, tests):
        print(f"        {commit[:10]} {patch.subject}\n                   + {', '.join(tests)}",
              flush=True)

    done = export.export(plan, src, args.base, Path(args.out), say=exported)
    step.done(f"{src}: branch {done.branch}, {len(done.commits)} commits")
    for text in done.texts:
        print(f"        PR text: {rel(text)}")
    return 0


def cmd_rebase_status(args) -> int:
    s = load_series()
    target = export.rebase_target(Path(args.rebase_onto).resolve())
    step = Step("rebase")
    verdicts = export.rebase_check(s, target)
    python, why_not = (None, "--no-tests") if args.no_tests else \
        export.rebase_python(target, args.python)
    outcomes = {}
    if python:
        log = ROOT / ".symfix" / "logs" / "rebase.log"
        outcomes = matrix.run_tests(python, [t for p in s.patches for t in s.fix_for(p).tests],
                                    log).outcomes
        if all(v == "missing" for v in outcomes.values()):
            python, why_not = None, f"none ran with {python}, see {rel(log)}"
    step.done(f"{target.name}: {len(s.patches)} patches checked"
              + (f", tests run with {python}" if python
                 else f"; tests not run ({why_not}): verdicts from applying alone"))
    for patch in s.patches:
        fix = s.fix_for(patch)
        upstream = fix.proof and all(outcomes.get(t) == matrix.PASS for t in fix.tests)
        verdict = ("already upstream (its tests pass there): drop it" if upstream
                   else verdicts[patch.name])
        print(f"  {patch.name:<48} {verdict}")
    return 0


def cmd_bench(args) -> int:
    s = load_series(args)
    base = base_wheel(s, args)
    w = bench.wheel(s, base)
    print(f"\nwheel   base {base.path.stat().st_size / 1e6:.0f} MB, medians of 5")
    print(f"  plain copy of the base wheel   {w['copy']:7.2f} s   1.00x (the floor)")
    print(f"  verify the base                {w['verify']:7.2f} s")
    print(f"  build (apply + pack)           {w['build']:7.2f} s   {w['build'] / w['copy']:5.1f}x "
          f"copy, {w['build'] - w['copy']:+.2f} s (goal: within 5 s)")
    print(f"  rebuild with inputs unchanged  {w['rebuild']:7.2f} s   "
          f"{w['rebuild'] / w['build']:5.2f}x a fresh build")
    m = bench.main_job(base.path, args.python or sys.executable)
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
    sdpa = [bench.workload(envs.python_of(env), script=bench.SDPA_UNDER_MODE)
            for env in (ROOT / ".symfix" / "stock", VENV)]
    print("\nSDPA under a no-op dispatch mode (test/bench_sdpa_dispatch_mode.py), µs per call")
    if any(isinstance(r, str) for r in sdpa):
        print(f"  not measured: {next(r for r in sdpa if isinstance(r, str))}")
    else:
        for key, what in (("plain_us", "no unbacked size made"),
                          ("after_unbacked_us", "after an unbacked size")):
            print(f"  {what:24} stock {sdpa[0][key]:6.1f}   patched {sdpa[1][key]:6.1f}   "
                  f"{sdpa[1][key] / sdpa[0][key]:5.2f}x (goal: within 1.05x)")
    stock = bench.workload(envs.python_of(ROOT / ".symfix" / "stock"), "--static-only")
    patched = bench.workload(envs.python_of(VENV))
    print("\ngraph trainer step (test/distributed/bench_graph_trainer.py): medians; steps of the "
          "two graphs interleaved, CPU time")
    if isinstance(stock, str) or isinstance(patched, str):
        print(f"  not measured: {stock if isinstance(stock, str) else patched}")
        return 1
    k = len(patched["shapes"])
    one, static = patched["trace_unbacked_s"], stock["static_recompiles_total_s"]
    print(f"  trace  one unbacked graph, patched             {one:7.2f} s")
    print(f"         {k} static graphs, one per shape, stock   {static:7.2f} s"
          f"   unbacked/static {one / static:5.2f}x")
    p = patched
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


def cmd_audit(args) -> int:
    python = Path(args.python) if args.python else audit.default_python()
    if not python.exists():
        raise Refused(f"--python {python}: no such interpreter"
                      + ("" if args.python else " (run `python3 tools/symfix.py wheel` first)"))
    path = args.target.partition(":")[0] if not Path(args.target).is_file() else args.target
    if not Path(path).is_file():
        raise BadTarget(f"{path}: no such file")
    return audit.audit(series.load(), args.target, python, Path(args.repro_dir),
                       tests=not args.no_tests)


def series_table(all_series: list[series.Series]) -> str:
    """One row per fix of any base; per base, what its series does about it (status, patch)."""
    tags = [s.base["tag"] for s in all_series]
    rows = ["| fix | upstream | fixes | component | first release | "
            + " | ".join(f"{tag} series" for tag in tags) + " | carried by |",
            "|---" * (6 + len(tags)) + "|"]
    by_base = [{f.id: f for f in s.fixes} for s in all_series]
    wheel = {p.name: p.wheel for s in all_series for p in s.patches}
    ids = list(dict.fromkeys(f.id for s in all_series for f in s.fixes))
    for fid in ids:
        f = next(b[fid] for b in by_base if fid in b)
        prs = ", ".join(f"[#{n}](https://github.com/pytorch/pytorch/pull/{n})" for n in f.upstream)
        bugs = ", ".join(f"#{b}" if isinstance(b, int) else str(b) for b in f.fixes)
        cells = []
        for b in by_base:
            row = b.get(fid)
            cells.append("–" if row is None else f"{row.status} {row.patch[:4]}" if row.patch
                         else row.status)
        patch = next((b[fid].patch for b in by_base if fid in b and b[fid].patch), None)
        carried = "–" if not patch else "wheel, source" if wheel[patch] else "source"
        rows.append(f"| {f.title} | {prs or '–'} | {bugs or '–'} | {f.component} | "
                    f"{f.released or '–'} | {' | '.join(cells)} | {carried} |")
    return "\n".join(rows)


def cmd_table(args) -> int:
    table = series_table([series.load(tag=tag) for tag in series.bases()])
    readme = ROOT / "README.md"
    text = readme.read_text()
    head, rest = text.split(TABLE_BEGIN, 1)
    current = rest.split(TABLE_END, 1)[0].strip()
    if args.check:
        if current != table:
            print("README.md's series table is stale: run `python3 tools/symfix.py table`")
            return 1
        return 0
    readme.write_text(f"{head}{TABLE_BEGIN}\n{table}\n{TABLE_END}{rest.split(TABLE_END, 1)[1]}")
    print(table)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="symfix.py", description=__doc__)
    sub = p.add_subparsers(dest="verb", required=True)
    def base_options(parser):
        parser.add_argument("--base", metavar="VERSION", help="base release whose series to use "
                            f"(default: the base wheel's, else {series.DEFAULT_BASE[1:]}); "
                            f"carried: {', '.join(b[1:] for b in series.bases())}")
        parser.add_argument("--wheel", help="the official base wheel (default: fetched for "
                            "--python and --variant)")
        parser.add_argument("--variant", help="which build of the base release: pypi (what "
                            "`pip install torch` gives: CUDA on Linux), cpu, cu130, ... "
                            "(default: pypi on a GPU machine, else cpu where one exists)")
        parser.add_argument("--python", help="the Python the wheel is for and the environments "
                            "run (default: this one)")

    w = sub.add_parser("wheel", help="build the patched wheel into dist/ and install it in .venv/")
    base_options(w)
    w.add_argument("--dist", default=str(DIST), help="output directory (default: dist/)")
    w.add_argument("--no-venv", action="store_true", help="only build, do not install")
    t = sub.add_parser("test", help="regression matrix and test suite")
    base_options(t)
    t.add_argument("--patched", metavar="WHEEL", help="test this built wheel as the patched "
                   "build (default: build dist/'s wheel)")
    t.add_argument("--upstream", action="store_true", help="also test upstream torch (oracle)")
    t.add_argument("--matrix-only", action="store_true", help="only the fixes' tests, not the "
                   "whole test/ suite on the patched build")
    t.add_argument("--skip-if-no-room", action="store_true", help="when the disk cannot hold "
                   "the stock or patched environment, say so and exit 0 instead of failing")
    st = sub.add_parser("status", help="which fixes a torch install has")
    st.add_argument("--python", help="interpreter of that install (default: python3 on PATH)")
    st.add_argument("--rebase-onto", metavar="WHEEL_OR_DIR",
                    help="forward-port check: does each patch apply to / is it in that torch?")
    st.add_argument("--no-tests", action="store_true", help="with --rebase-onto: verdicts from "
                    "applying alone, no environment made for that torch")
    wt = sub.add_parser("worktree", help="git repo of the base Python files + the series, to "
                        "write a patch in")
    wt.add_argument("dir")
    base_options(wt)
    ex = sub.add_parser("export", help="a patch (or the stack) as a PyTorch branch + PR text")
    ex.add_argument("id", nargs="?", help="fix id (see patches/<base>/manifest.toml)")
    ex.add_argument("--all", action="store_true", help="the whole series, in order, one branch")
    ex.add_argument("--onto", required=True, help="a PyTorch checkout")
    ex.add_argument("--base", help="ref to start from (default: the branch addressed, main or "
                    "release/X.Y, else the base tag)")
    ex.add_argument("--series", metavar="TAG", help="export from this base's series (default: "
                    "our own fixes from the newest base carrying them, backports from v2.13.0)")
    ex.add_argument("--out", default=str(DIST / "pr"), help="where PR texts go (dist/pr/)")
    ex.add_argument("--dry-run", action="store_true", help="print what it would do")
    so = sub.add_parser("source", help="rebuild PyTorch from a v2.13.0 checkout with the series")
    where = so.add_mutually_exclusive_group(required=True)
    where.add_argument("--src", help="an existing PyTorch checkout")
    where.add_argument("--clone", help="clone the v2.13.0 tag with submodules into this directory")
    so.add_argument("--python", default=source.python_default(),
                    help="Python with PyTorch's build requirements (default: python3 on PATH)")
    so.add_argument("--out", default=str(DIST), help="where the wheel goes (default: dist/)")
    so.add_argument("--branch", help="branch for the series (default: symfix/v2.13.0-symfixN)")
    so.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    so.add_argument("--no-test", action="store_true", help="skip the regression matrix")
    so.add_argument("--upstream", action="store_true", help="matrix also on upstream torch")
    be = sub.add_parser("bench", help="speed ratios: wheel build, unbacked trace and step")
    base_options(be)
    au = sub.add_parser("audit", help="where a step breaks or specializes its unbacked sizes, "
                        "and which symfix fix fixes it")
    au.add_argument("target", metavar="FILE.py[:NAME]",
                    help="NAME (default audit_target) returns (fn, args) with mark_unbacked marks")
    au.add_argument("--python", help="the torch to audit (default: the patched .venv)")
    au.add_argument("--repro-dir", default=str(ROOT / ".symfix" / "audit"),
                    help="where repros of problems without a fix go (default: .symfix/audit/)")
    au.add_argument("--no-tests", action="store_true",
                    help="do not run the proof tests of the fixes found")
    tb = sub.add_parser("table", help="write the series table into README.md")
    tb.add_argument("--check", action="store_true", help="only check that it is current")
    args = p.parse_args(argv)
    # A run stopped by SIGTERM (a CI timeout, say) cleans up as one stopped by Ctrl-C does.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return {"wheel": cmd_wheel, "test": cmd_test, "status": cmd_status,
                "table": cmd_table, "worktree": cmd_worktree,
                "source": cmd_source, "export": cmd_export, "bench": cmd_bench,
                "audit": cmd_audit}[args.verb](args)
    except SymfixError as e:
        print(f"symfix: {e.what}{e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (above); every step cleaned up after itself
        print("symfix: interrupted", file=sys.stderr)
        return 2
